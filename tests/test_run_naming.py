"""What a run is called and what it logs in MLflow (name, ``model_config.*`` params, vanilla), and
that the results read runs logged before and after that naming into the same rows.

The runs here are opened as ``mesh-train`` opens them (``_open_record``, ``_run_facts``: the real
store, the real model built) but not trained; the trained tiny run's side is in test_train.py.
"""

from __future__ import annotations

import time
from pathlib import Path

import mlflow
import numpy as np
import pytest
from mlflow.entities import Metric, Param
from omegaconf import OmegaConf

from experiments.data.prepare import PreparedData
from experiments.plan import RunPlan, plan_run
from experiments.train import _open_record, _run_facts
from mesh_model import build_model
from mesh_model.probe_names import scheme_color
from results.rows.aggregate import aggregate
from results.runs.store import collect_runs


@pytest.fixture(scope="module")
def runs_dir(tmp_path_factory) -> Path:
    """One store for the module (creating a sqlite store takes seconds)."""
    return tmp_path_factory.mktemp("naming")


def open_without_training(runs_dir: Path, compose_run, *overrides: str) -> tuple[RunPlan, mlflow.entities.Run]:
    """The plan of ``overrides`` and the MLflow run ``mesh-train`` opens for it, with the facts it
    logs before the first step."""
    plan = plan_run(compose_run(f"runs_dir={runs_dir}", *overrides))
    plan.run_dir.mkdir(parents=True)
    (plan.run_dir / "config.yaml").write_text(OmegaConf.to_yaml(plan.config))
    prepared = PreparedData(np.zeros(1000, np.uint16), {}, 512, 0, None, "shakespeare", "test")
    record = _open_record(plan, plan.model_config, prepared)
    record.log_facts(*_run_facts(plan, plan.model_config, build_model(plan.model_config), prepared, ["shakespeare"]))
    return plan, record.client.get_run(record.run_id)


def test_vanilla_runs_are_vanilla_in_mlflow(runs_dir, compose_run):
    _, run = open_without_training(runs_dir, compose_run, "scheme=vanilla", "tracking.experiment=vanilla")
    assert run.info.run_name == "vanilla s0 · tiny 6"
    params, tags = run.data.params, run.data.tags
    assert params["model_config.scheme"] == "vanilla" and params["model_config.layout"] == "6"
    assert params["model_config.buffer_slots"] == params["buffer_slots"] == "" == tags["buffer_slots"]
    assert tags["mlflow.runColor"] == scheme_color("vanilla")  # the report's colour, from its first chart
    assert params["scheme"] == "vanilla" and tags["scheme"] == "vanilla"
    assert Path(tags["run_dir"]).name == f"tiny-6-vanilla-s0-{tags['config_hash'][:8]}"


def test_a_run_name_set_in_the_config_wins(runs_dir, compose_run):
    _, run = open_without_training(runs_dir, compose_run, "scheme=mesh", "tracking.run_name=my-try")
    assert run.info.run_name == "my-try" and run.data.params["model_config.buffer_slots"] == "5"


def test_a_mesh_run_logs_its_resolved_buffer_slots_and_its_schemes_colour(tmp_path, compose_run):
    """The config leaves B to its default (None, K+3): the param says 5, as the tag does, and the run
    is drawn in MeSH's colour of the report's figures."""
    plan, run = open_without_training(tmp_path, compose_run, "scheme=mesh", "tracking.experiment=slots")
    assert plan.config["buffer_slots"] is None
    assert run.data.params["buffer_slots"] == "5" == run.data.tags["buffer_slots"]
    assert run.data.tags["mlflow.runColor"] == scheme_color("mesh") == "#d62728"
    _, set_b = open_without_training(
        tmp_path, compose_run, "scheme=mesh", "buffer_slots=3", "tracking.experiment=slots"
    )
    assert set_b.data.params["buffer_slots"] == "3" == set_b.data.tags["buffer_slots"]


def finish(client: mlflow.MlflowClient, run_id: str, loss: float) -> None:
    now = int(time.time() * 1000)
    metrics = {"val/shakespeare/loss": loss, "val/shakespeare/ppl": 2.718281828**loss, "val_loss": loss}
    client.log_batch(run_id, metrics=[Metric(k, v, now, 6) for k, v in metrics.items()])
    client.set_terminated(run_id, "FINISHED")


def log_as_before(client: mlflow.MlflowClient, plan: RunPlan, new: mlflow.entities.Run, seed: int) -> str:
    """The run ``plan`` with another seed as mesh-train logged it before this naming: named like its
    folder (vanilla's ``-base-``), ``model_config.*`` as ``ModelConfig.to_dict`` has them (vanilla's
    scheme ``base``, MeSH's B ``None`` when left to K+3) and again as Lightning's ``model_config/*``."""
    model = {k: str(v) for k, v in plan.model_config.to_dict().items()}
    derived = ("model_config.", "val_names", "config_hash", "seed")
    params = {k: v for k, v in new.data.params.items() if not k.startswith(derived)}
    params.update({f"model_config.{k}": v for k, v in model.items()})
    params.update({f"model_config/{k}": v for k, v in model.items()})
    params.update(seed=str(seed), config_hash=f"old{seed}", val_names="['shakespeare']")
    slots = f"-B{plan.model_config.slots}" if plan.model_config.slots else ""
    name = f"tiny-{plan.model_config.layout}-{plan.model_config.scheme}{slots}-s{seed}-old{seed}"
    tags = {**new.data.tags, "seed": str(seed), "config_hash": f"old{seed}", "mlflow.runName": name}
    run_id = client.create_run(new.info.experiment_id, tags=tags, run_name=name).info.run_id
    client.log_batch(run_id, params=[Param(k, v) for k, v in params.items()])
    return run_id


def test_runs_logged_before_and_after_this_naming_share_a_row(runs_dir, compose_run):
    client = mlflow.MlflowClient(f"sqlite:///{runs_dir / 'mlflow.db'}")
    for scheme in ("vanilla", "mesh"):
        plan, new = open_without_training(runs_dir, compose_run, f"scheme={scheme}", "tracking.experiment=cells")
        finish(client, new.info.run_id, 5.0)
        old = log_as_before(client, plan, new, seed=1)
        finish(client, old, 5.5)
        assert client.get_run(old).data.params["model_config.scheme"] == ("base" if scheme == "vanilla" else "mesh")

    results = aggregate(collect_runs(client, ["cells"]))
    rows = {(row.scheme, row.layout, row.buffer_slots, row.overrides): sorted(row.seeds) for row in results.rows}
    assert rows == {("vanilla", "6", "", ""): ["0", "1"], ("mesh", "1+2R2+1", "5", ""): ["0", "1"]}
    assert results.group_keys == [] and results.duplicates == []
    assert {row.scheme: row.stats["val_loss"].mean for row in results.rows} == {"vanilla": 5.25, "mesh": 5.25}
