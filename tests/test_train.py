"""mesh-train end to end on the tiny preset: MLflow (sqlite and a real server), resume, bad input."""

from __future__ import annotations

import itertools
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import mlflow
import pytest
from helpers import run_tool
from omegaconf import OmegaConf

from experiments.identity import model_config_for
from experiments.lit_module import parameter_groups
from experiments.schedule import lr_multiplier, warmup_steps
from experiments.tracking import flatten
from experiments.train import train
from mesh_model import ConfigError, ModelConfig, build_model, count_parameters

MESH_TRAIN = str(Path(sys.executable).parent / "mesh-train")


def clean_env() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if k != "MLFLOW_TRACKING_URI"}


def run_cli(*args: str, timeout=300) -> subprocess.CompletedProcess:
    return subprocess.run([MESH_TRAIN, *args], capture_output=True, text=True, timeout=timeout, env=clean_env())


def sqlite_client(runs_dir: Path) -> mlflow.MlflowClient:
    return mlflow.MlflowClient(f"sqlite:///{runs_dir / 'mlflow.db'}")


def runs_of(client: mlflow.MlflowClient, experiment: str = "mesh"):
    found = client.get_experiment_by_name(experiment)
    return client.search_runs([found.experiment_id]) if found else []


# --- schedule and optimizer -------------------------------------------------------------------


def test_lr_schedule_warmup_midway_and_end():
    max_steps = 1000
    warmup = warmup_steps(max_steps, 0.01)
    assert warmup == 10
    assert lr_multiplier(0, max_steps) == pytest.approx(0.1)
    assert lr_multiplier(warmup - 1, max_steps) == pytest.approx(1.0)  # end of warmup: peak
    assert lr_multiplier(warmup, max_steps) == pytest.approx(1.0)
    midway = warmup + (max_steps - warmup) // 2
    assert lr_multiplier(midway, max_steps) == pytest.approx(0.55)  # half way down the cosine
    assert lr_multiplier(max_steps, max_steps) == pytest.approx(0.1)  # 10% of peak
    assert lr_multiplier(max_steps + 50, max_steps) == pytest.approx(0.1)
    values = [lr_multiplier(s, max_steps) for s in range(warmup, max_steps)]
    assert all(a >= b for a, b in itertools.pairwise(values))


def test_weight_decay_on_matrices_only():
    model = build_model(ModelConfig.from_preset("tiny", scheme="static"))
    decay, no_decay = parameter_groups(model, 0.01)
    names = {id(p): n for n, p in model.named_parameters()}
    assert decay["weight_decay"] == 0.01 and no_decay["weight_decay"] == 0.0
    assert all(p.ndim == 2 for p in decay["params"])
    decayed = {names[id(p)] for p in decay["params"]}
    assert "embed_in.weight" in decayed and "prelude.0.attention.query_key_value.weight" in decayed
    undecayed = {names[id(p)] for p in no_decay["params"]}
    assert "state_passing.coefficients" in undecayed and "final_layer_norm.weight" in undecayed
    assert "prelude.0.attention.dense.bias" in undecayed


def test_router_lr_scale_puts_the_scheme_s_parameters_in_their_own_groups_on_the_same_schedule():
    from experiments.config import OptimConfig
    from experiments.lit_module import MeshLitModule

    config = ModelConfig.from_preset("tiny", scheme="mesh")
    module = MeshLitModule(config.to_dict(), OptimConfig(router_lr_scale=0.1), 4e-3, 100, ["val"])
    setup = module.configure_optimizers()
    optimizer, schedule = setup["optimizer"], setup["lr_scheduler"]["scheduler"]
    names = {id(p): n for n, p in module.model.named_parameters()}
    groups = [{names[id(p)] for p in g["params"]} for g in optimizer.param_groups]
    routers = [g for g in groups if any(n.startswith("state_passing.") for n in g)]
    assert len(optimizer.param_groups) == 4 and len(routers) == 2
    assert all(all(n.startswith("state_passing.") for n in g) for g in routers)
    assert {n for g in routers for n in g} == {n for n in names.values() if n.startswith("state_passing.")}
    for _ in range(30):  # past the warmup: the schedule multiplies every group alike
        optimizer.step()
        schedule.step()
    lrs = [g["lr"] for g in optimizer.param_groups]
    assert lrs[2] == pytest.approx(0.1 * lrs[0]) and lrs[3] == pytest.approx(0.1 * lrs[0]) and lrs[0] == lrs[1]
    assert [g["weight_decay"] for g in optimizer.param_groups] == [0.01, 0.0, 0.01, 0.0]
    # at the default scale the groups are the two they always were
    assert len(parameter_groups(module.model, 0.01)) == 2
    with pytest.raises(ConfigError, match=r"^optim.router_lr_scale=0 is invalid"):
        OptimConfig(router_lr_scale=0).validate()


@pytest.mark.parametrize(
    ("field", "value"),
    [("betas", [0.9, 1.5]), ("weight_decay", -1), ("warmup_fraction", 7), ("warmup_steps", 0), ("min_lr_ratio", 2)],
)
def test_every_optimizer_setting_is_checked(field, value):
    from experiments.config import OptimConfig

    with pytest.raises(ConfigError, match=rf"^optim.{field}="):
        OptimConfig(**{field: value}).validate()


# --- training into MLflow -------------------------------------------------------------------


@pytest.mark.slow
def test_mesh_train_cli_logs_everything_to_sqlite(tmp_path, tiny_overrides):
    args = tiny_overrides("scheme=mesh", "layout=1+2R3+1", "seed=3", f"runs_dir={tmp_path}")
    started = time.perf_counter()
    result = run_cli(*args)
    wall = time.perf_counter() - started
    assert result.returncode == 0, result.stderr[-3000:]
    client = sqlite_client(tmp_path)
    (run,) = runs_of(client)
    assert run.info.status == "FINISHED"
    mlflow.set_tracking_uri(f"sqlite:///{tmp_path / 'mlflow.db'}")
    try:
        frame = mlflow.search_runs(experiment_names=["mesh"])
    finally:
        mlflow.set_tracking_uri(None)
        os.environ.pop("MLFLOW_TRACKING_URI", None)
    assert len(frame) == 1 and frame.loc[0, "params.scheme"] == "mesh"
    assert frame.loc[0, "metrics.val/shakespeare/loss"] == run.data.metrics["val/shakespeare/loss"]
    params, tags, metrics = run.data.params, run.data.tags, run.data.metrics
    assert params["scheme"] == "mesh" and params["layout"] == "1+2R3+1" and params["seed"] == "3"
    assert params["optim.betas"] == "[0.9, 0.95]" and params["data.corpus"] == "shakespeare"
    assert params["model_config.buffer_slots"] == "6" and tags["buffer_slots"] == "6"  # B = K+3
    assert run.info.run_name == "mesh B6 s3 · tiny 1+2R3+1"
    assert tags["scheme"] == "mesh" and tags["layout"] == "1+2R3+1" and tags["preset"] == "tiny"
    assert tags["seed"] == "3" and len(tags["config_hash"]) == 12 and tags["git_commit"]
    config = ModelConfig.from_preset("tiny", layout="1+2R3+1", scheme="mesh")
    counts = count_parameters(build_model(config))
    assert metrics["params_non_embedding"] == counts["non_embedding"]
    assert metrics["params_router"] == counts["router"] == 2 * 4 * (64 * 6 + 6)
    assert metrics["params_pct_of_vanilla"] == pytest.approx(counts["pct_of_vanilla"])
    assert (metrics["global_batch"], metrics["tokens_per_step"], metrics["tokens_planned"]) == (8, 8 * 64, 30 * 8 * 64)
    val = client.get_metric_history(run.info.run_id, "val/shakespeare/loss")
    assert [m.step for m in val] == [10, 20, 30]
    assert val[-1].value < val[0].value
    ppl = client.get_metric_history(run.info.run_id, "val/shakespeare/ppl")
    assert ppl[-1].value == pytest.approx(2.718281828 ** val[-1].value, rel=1e-5)
    train_loss = client.get_metric_history(run.info.run_id, "train/loss")
    assert len(train_loss) >= 5 and max(m.step for m in train_loss) >= 25
    assert "lr" in metrics and "train/tokens_per_s" in metrics and metrics["train/tokens_per_s"] > 0
    artifacts = [a.path for a in client.list_artifacts(run.info.run_id)]
    assert "config.yaml" in artifacts
    run_dir = Path(tags["run_dir"])
    assert (run_dir / "checkpoints" / "last.ckpt").exists()
    assert (run_dir / "mlflow_run_id").read_text() == run.info.run_id
    # Where the wall time went (experiments/callbacks/timing.py): the parts add up to the total.
    timing = json.loads((run_dir / "result.json").read_text())["timing"]
    # Every part took time (end_s is clamped at 0, so 0 there would mean the others overran the
    # total), and the total is the run's, not more than the process it ran in.
    parts = ("setup_s", "steps_s", "between_steps_s", "validation_s", "end_s")
    assert all(timing[p] > 0 for p in parts), timing
    assert sum(timing[p] for p in parts) == pytest.approx(timing["total_s"], rel=1e-6)
    assert timing["total_s"] < wall
    assert {p: metrics[f"time/{p}"] for p in (*parts, "total_s", "steps_per_s")} == pytest.approx(timing)
    assert timing["steps_per_s"] == pytest.approx(30 / (timing["steps_s"] + timing["between_steps_s"]))
    # The same command again (in this process: the refusal reads the store, not a fresh interpreter):
    # the run is finished, nothing new starts.
    again = run_tool("mesh-train", *args, env=clean_env())
    assert again.returncode == 0 and "already finished" in again.stderr
    assert len(runs_of(client)) == 1


def test_the_mlflow_run_is_named_by_what_differs_and_logs_each_param_once(tiny_run):
    run = tiny_run.client.get_run(tiny_run.run_id)
    assert run.info.run_name == "mesh B5 s0 · tiny 1+2R2+1"
    assert tiny_run.run_dir.name == f"tiny-1+2R2+1-mesh-B5-s0-{run.data.tags['config_hash'][:8]}"
    params = run.data.params
    # Only train.py logs params: the config, the resolved model, and what follows from them.
    # Lightning's hyperparameters (model_config/<field>, a second spelling of each) are not logged.
    config = OmegaConf.to_container(OmegaConf.load(tiny_run.run_dir / "config.yaml"))
    model = {f"model_config.{field}" for field in model_config_for(config).to_dict()}
    assert set(params) == {*flatten(config), *model, "config_hash", "peak_lr", "val_names"}
    assert params["model_config.scheme"] == "mesh" and params["model_config.layout"] == "1+2R2+1"
    assert params["model_config.buffer_slots"] == "5"  # the effective B (left to K+3 in the config)
    assert params["buffer_slots"] == "5" == run.data.tags["buffer_slots"]  # as resolved, not the config's None
    assert params["val_names"] == "['shakespeare']"


@pytest.mark.slow
def test_train_logs_through_a_real_mlflow_server(tmp_path, mlflow_server, compose_run):
    server = [f"tracking.tracking_uri={mlflow_server}", "tracking.experiment=through_a_server"]
    result = train(compose_run(f"runs_dir={tmp_path / 'runs'}", *server, "scheme=anchor"))
    client = mlflow.MlflowClient(mlflow_server)
    (run,) = runs_of(client, "through_a_server")
    assert run.info.run_id == result["run_id"] and run.info.status == "FINISHED"
    assert run.data.params["scheme"] == "anchor"
    assert run.data.metrics["val/shakespeare/loss"] == pytest.approx(result["val_loss"])
    assert "config.yaml" in [a.path for a in client.list_artifacts(run.info.run_id)]
    assert not (tmp_path / "runs" / "mlflow.db").exists()
    assert os.environ.get("MLFLOW_TRACKING_URI") != mlflow_server  # nothing leaks into later runs


# --- bad input: one line, before any compute ------------------------------------------------


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        (
            ["nonexistent=1"],
            "error: 'nonexistent' is not a config key; known keys: activation_checkpointing, allow_large, allow_nonfinite, buffer_slots",
        ),
        (
            ["data.seq_lenn=64"],
            "error: 'data.seq_lenn' is not a config key under 'data'; did you mean 'seq_len'? known keys: batch_size",
        ),
        (
            ["data=wikipedia"],
            "error: data='wikipedia' is invalid: known options: cpython, docs, hf, indexed, kjv, shakespeare, text",
        ),
        (
            ["model=tiniest"],
            "error: model='tiniest' is invalid: did you mean 'tiny' or 'tiny-moe'? known presets: pythia-70m",
        ),
        (["scheme=mesh2"], "error: scheme='mesh2' is invalid: did you mean 'mesh'? use base, mesh, static, dynamic"),
        (["layout=4+8R0+4"], "error: layout='4+8R0+4' is invalid: the loop count must be at least 1"),
        (["scheme=mesh", "buffer_slots=0"], "error: buffer_slots=0 is invalid: MeSH needs at least 1 slot"),
        (["data.seq_len=100000"], "error: data.seq_len=100000 is invalid: the model's max_seq_len is 256"),
        (["tracking.tracking_uri=http://127.0.0.1:9"], "error: tracking_uri='http://127.0.0.1:9' does not answer"),
        (["tracking.tracking_uri=file:./mlruns"], "error: tracking_uri='file:./mlruns' is a file store"),
    ],
)
def test_bad_input_stops_with_one_line(tmp_path, tiny_overrides, args, expected):
    result = run_tool("mesh-train", *tiny_overrides(f"runs_dir={tmp_path}", *args), env=clean_env())
    assert result.returncode == 2, result.stderr[-2000:]
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith(expected), result.stderr
    assert not list(tmp_path.glob("mesh/*/checkpoints"))  # stopped before any run started


def test_unreadable_and_empty_corpus_stop_before_training(tmp_path, tiny_overrides):
    empty = tmp_path / "empty.txt"
    empty.write_text("")
    for path in (empty, tmp_path / "missing"):
        result = run_tool(
            "mesh-train", *tiny_overrides(f"runs_dir={tmp_path}", "data=text", f"data.path={path}"), env=clean_env()
        )
        assert result.returncode == 2, result.stderr[-2000:]
        lines = [line for line in result.stderr.splitlines() if line.strip()]
        assert len(lines) == 1 and lines[0].startswith(f"error: data.path='{path}' is invalid"), result.stderr
    assert not list(tmp_path.glob("mesh/*/mlflow_run_id"))
