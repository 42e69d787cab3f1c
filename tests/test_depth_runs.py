"""The loop count as an axis, in runs (experiments/loops.py, experiments/evaluation/depth.py):

* the ``loops`` group: draws a pure function of (seed, step), expectations exact, one-line refusals,
  routers up to the cap, the cost estimate at the expected K, hashes of fixed-K runs unchanged;
* sampled-K training (real tiny Lightning fits): two fits are equal, and a fit stopped at step 3
  and resumed from its checkpoint ends with the uninterrupted fit's weights, bit for bit;
* ``mesh-eval --loops/--exit`` on the session's trained run: at K' = K the run's own final
  validation loss exactly, the depth curve in its MLflow run by loop count, CSV artifacts, exit at
  eps = 0 equal to the full pass; a non-shared layout refused in one line;
* the stability monitor's metrics logged at every validation of the session's run.
"""

from __future__ import annotations

import math
import shutil
from pathlib import Path

import lightning.pytorch as pl
import numpy as np
import pytest
import torch
from omegaconf import OmegaConf

from experiments.callbacks.checkpointing import StepCheckpoint
from experiments.checkpoints import RunInputError
from experiments.compose import compose_config
from experiments.data.datamodule import TokenDataModule
from experiments.evaluation.cli import main as eval_main
from experiments.evaluation.cli import parser
from experiments.evaluation.depth import DepthSettings, evaluate_depth
from experiments.loops import LoopsConfig
from experiments.plan import InputError, estimate_run, padded_vocab, plan_run
from experiments.trainer import build_module
from mesh_model import ConfigError, ModelConfig, build_model

SAMPLED = ("scheme=mesh", "loops=uniform", "loops.max=4", "data.seq_len=32", "data.batch_size=4")


# --- the loops group --------------------------------------------------------------------------------


def test_draws_are_a_function_of_seed_and_step_and_their_expectations_exact():
    huginn = LoopsConfig("poisson_lognormal", mean=2.0, max=6, backprop=2)
    huginn.validate()
    draws = np.array([huginn.draw(2, 7, step) for step in range(100_000)])
    assert [huginn.draw(2, 7, s) for s in (5, 99, 5)] == [draws[5], draws[99], draws[5]]  # no state
    assert draws.min() == 1 and draws.max() == 6 and len(set(draws[:50])) > 2
    assert not np.array_equal(draws[:100], [huginn.draw(2, 8, s) for s in range(100)])  # the seed matters
    expected, grad = huginn.expected(2)
    se = draws.std() / math.sqrt(len(draws))
    assert abs(draws.mean() - expected) < 4 * se and abs(np.minimum(draws, 2).mean() - grad) < 4 * se
    uniform = LoopsConfig("uniform", min=1, max=4, backprop=3)
    assert uniform.expected(2) == (2.5, (1 + 2 + 3 + 3) / 4)
    assert LoopsConfig().expected(3) == (3.0, 3.0) and LoopsConfig().draw(3, 0, 10) == 3
    assert uniform.grad_loops(4) == 3 and uniform.grad_loops(2) is None


@pytest.mark.parametrize(
    ("overrides", "field"),
    [
        (("loops=poisson_lognormal", "loops.mean=1"), "loops.mean=1"),
        (("loops=uniform", "loops.min=5"), "loops.min=5"),
        (("loops=uniform", "loops.max=null"), "loops.max=None"),
        (("loops.backprop=0",), "loops.backprop=0"),
        (("loops.max=3",), "loops.max=3"),
        (("loops=uniform", "layout=1+2+2+1"), "loops='uniform'"),
    ],
)
def test_bad_loop_settings_are_refused_in_one_line(overrides, field, tmp_path):
    with pytest.raises(InputError) as error:
        plan_run(compose_config([*overrides, f"runs_dir={tmp_path}"]))
    assert str(error.value).startswith(field) and "\n" not in str(error.value)


def test_sampled_mesh_builds_routers_to_the_cap_and_costs_the_expected_k(tmp_path):
    runs = f"runs_dir={tmp_path}"
    mesh = plan_run(compose_config(["scheme=mesh", "loops=poisson_lognormal", runs]))
    assert (mesh.model_config.max_loops, mesh.model_config.parameter_loops) == (6, 6)
    shared = plan_run(
        compose_config(["scheme=mesh", "loops=poisson_lognormal", "+model_overrides.mesh_routers=shared", runs])
    )
    assert (shared.model_config.max_loops, shared.model_config.parameter_loops) == (None, 1)
    base = plan_run(compose_config(["loops=uniform", runs]))
    assert base.model_config.max_loops is None  # no per-step parameters: nothing to build
    fixed = plan_run(compose_config([runs]))
    assert fixed.config_hash == plan_run(compose_config(["loops=fixed", runs])).config_hash
    assert len({fixed.config_hash, base.config_hash}) == 2
    # uniform on 1..3 has E[K] = 2: base costs what fixed K = 2 costs; on 1..5, E[K] = 3: what K = 3 costs
    cost = {o: estimate_run(compose_config([*o, runs])).flops for o in [(), ("loops=uniform",)]}
    assert cost[("loops=uniform",)] == cost[()]
    wide = estimate_run(compose_config(["loops=uniform", "loops.max=5", runs])).flops
    assert wide == estimate_run(compose_config(["layout=1+2R3+1", runs])).flops


# --- sampled-K training, reproducible and resumable ---------------------------------------------------


class Drawn(pl.Callback):
    """The loop count of every training step, as the module draws it; keeps the step-3 checkpoint
    (StepCheckpoint keeps only the newest) as ``kept3.ckpt``."""

    def __init__(self, folder: Path) -> None:
        self.loops: list[int] = []
        self.folder = folder

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:
        self.loops.append(pl_module.training_depth(trainer.global_step).loops)
        if trainer.global_step == 4:
            shutil.copy(self.folder / "step3.ckpt", self.folder / "kept3.ckpt")


def fit(tmp_path: Path, steps: int, resume: Path | None = None):
    """A real tiny MeSH fit at sampled K, checkpointed every 3 steps by the run's own callback."""
    plan = plan_run(compose_config([*SAMPLED, f"max_steps={steps}", f"runs_dir={tmp_path}"]))
    datamodule = TokenDataModule(plan.data, seed=plan.train.seed)
    model_config = plan.train.model_config(padded_vocab(datamodule.vocab_size))
    pl.seed_everything(plan.train.seed, verbose=False)
    module = build_module(plan, model_config, ["shakespeare"])
    drawn = Drawn(tmp_path / "checkpoints")
    trainer = pl.Trainer(
        accelerator="cpu",
        max_steps=steps,
        logger=False,
        callbacks=[drawn, StepCheckpoint(tmp_path / "checkpoints", 3)],
        gradient_clip_val=plan.optim.grad_clip,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        limit_val_batches=0,
        use_distributed_sampler=False,
    )
    trainer.fit(module, datamodule=datamodule, ckpt_path=resume)
    return module, trainer, drawn.loops


def test_sampled_loop_training_is_reproducible_and_resumes_bit_for_bit(tmp_path):
    first, _, drawn = fit(tmp_path / "a", 6)
    assert drawn == [LoopsConfig("uniform", max=4).draw(2, 0, s) for s in range(6)] and len(set(drawn)) > 1
    assert first.model.config.parameter_loops == 4  # MeSH's routers up to the cap
    again, _, _ = fit(tmp_path / "b", 6)
    # resumed from the step-3 checkpoint (what a run killed after it does): the last 3 steps again
    resumed, trainer, tail = fit(tmp_path / "c", 6, resume=tmp_path / "a" / "checkpoints" / "kept3.ckpt")
    assert trainer.global_step == 6 and tail == drawn[3:]
    reference = first.state_dict()
    for name, tensor in reference.items():
        assert torch.equal(again.state_dict()[name], tensor), name
        assert torch.equal(resumed.state_dict()[name], tensor), name


# --- mesh-eval --loops / --exit on the session's run -------------------------------------------------


def test_at_its_own_loop_count_the_run_gives_its_final_validation_loss_exactly(tiny_run):
    config = OmegaConf.to_container(OmegaConf.load(tiny_run.run_dir / "config.yaml"), resolve=True)
    checkpoint = tiny_run.run_dir / "checkpoints" / "last.ckpt"
    report = evaluate_depth(checkpoint, config, DepthSettings(loops=[2], exit=["state", "output"], exit_eps=[0.0]))
    (row,) = [r for r in report["depth"] if r["rule"] == "last"]
    # the same windows, summed the same way: equal in one process (tests of the loop count itself are
    # exact: test_depth.py); under one thread per xdist worker the two passes round apart by a float32
    # ulp (3e-8 relative, cause not yet found), so the run's loss is matched to that resolution here
    assert row["loss"] == pytest.approx(tiny_run.result["val_loss"], rel=1e-7, abs=0)
    assert [r["loss"] for r in report["depth"]] == [row["loss"]] * 2  # both rules: the identity at K
    assert [r["loss"] for r in report["exit"]] == [row["loss"]] * 2 and {r["loops_used"] for r in report["exit"]} == {2}
    # an exit with room for more loops than K, at eps = 0: the full pass at that loop count
    longer = evaluate_depth(checkpoint, config, DepthSettings(loops=[4], exit=["state"], exit_eps=[0.0], exit_loops=4))
    (four,) = [r for r in longer["depth"] if r["rule"] == "last"]
    assert longer["exit"][0]["loss"] == four["loss"] and longer["exit"][0]["loops_used"] == 4


def test_mesh_eval_logs_the_depth_curve_by_loop_count_into_the_run(tiny_run, capsys):
    assert parser().parse_args(["run", "--loops"]).loops == []  # alone: the default list, 1 to 4K
    code = eval_main([str(tiny_run.run_dir), "--loops", "1,2,3", "--exit", "state", "--exit-eps", "0,1e9"])
    assert code == 0, capsys.readouterr().err
    client, run_id = tiny_run.client, tiny_run.run_id
    for key in ("depth/shakespeare/ppl", "depth/last/shakespeare/ppl", "depth/cycle/shakespeare/loss"):
        history = client.get_metric_history(run_id, key)
        assert sorted(m.step for m in history) == [1, 2, 3], key
    at = {m.step: m.value for m in client.get_metric_history(run_id, "depth/shakespeare/loss")}
    assert at[2] == pytest.approx(tiny_run.result["val_loss"], rel=1e-7, abs=0)  # see the test above
    used = {m.step: m.value for m in client.get_metric_history(run_id, "exit/state/shakespeare/loops_used")}
    assert used == {0: 2.0, 1: 1.0}
    artifacts = {a.path for a in client.list_artifacts(run_id, "depth")}
    assert artifacts == {"depth/depth.csv", "depth/exit.csv"}
    exits = (tiny_run.run_dir / "eval" / f"depth-step{tiny_run.steps}" / "exit.csv").read_text().splitlines()
    assert exits[0] == "criterion,eps,loops,set,loss,ppl,loops_used" and len(exits) == 3
    lines = (tiny_run.run_dir / "eval" / f"depth-step{tiny_run.steps}" / "depth.csv").read_text().splitlines()
    assert lines[0] == "loops,rule,set,loss,ppl" and len(lines) == 1 + 3 * 2


def test_a_non_shared_run_refuses_loops_in_one_line(tiny_run, tmp_path, capsys):
    run_dir = tmp_path / "nonshared"
    (run_dir / "checkpoints").mkdir(parents=True)
    config = ModelConfig.from_preset("tiny", layout="1+2+2+1", scheme="mesh")
    model = build_model(config)
    state = {"state_dict": {f"model.{k}": v for k, v in model.state_dict().items()}}
    torch.save({**state, "hyper_parameters": {"model_config": config.to_dict()}}, run_dir / "checkpoints" / "last.ckpt")
    (run_dir / "config.yaml").write_text((tiny_run.run_dir / "config.yaml").read_text())
    assert eval_main([str(run_dir), "--loops", "2", "--no-mlflow"]) == 2
    err = capsys.readouterr().err.strip()
    assert (
        err.startswith("error: --loops=2 is invalid: layout '1+2+2+1' has distinct core segments") and "\n" not in err
    )
    with pytest.raises(RunInputError, match="--rule=first"):
        DepthSettings(rules=["first"]).check()
    with pytest.raises(ConfigError):
        ModelConfig.from_preset("tiny", layout="1+2+2+1", max_loops=3)


def test_the_stability_monitor_logs_at_every_validation(tiny_run):
    for key in ("stability/spectral_radius", "stability/change_ratio", "stability/change_ratio_trained"):
        history = tiny_run.client.get_metric_history(tiny_run.run_id, key)
        assert sorted(m.step for m in history) == [5, 10], key
        assert all(math.isfinite(m.value) and m.value >= 0 for m in history)


# --- depth_eval: a grid's cells evaluated as they end ------------------------------------------------


def test_a_run_with_depth_eval_is_evaluated_once_when_it_ends_and_again_only_for_new_settings(
    compose_run, tmp_path, capsys
):
    from experiments.train import train

    short = ("scheme=mesh", "max_steps=4", "val_every=4", "probes.enabled=false", "data.seq_len=32")
    asked = ("depth_eval.loops=[1,3]", "depth_eval.exit=[state]", "depth_eval.exit_eps=[0,1e9]")
    cfg = compose_run(*short, *asked, f"runs_dir={tmp_path}")
    plain = compose_run(*short, f"runs_dir={tmp_path}")
    assert plan_run(cfg).config_hash == plan_run(plain).config_hash  # an evaluation is not the run's identity
    result = train(cfg)
    run_dir = Path(result["run_dir"])
    folder = run_dir / "eval" / "depth-step4"
    depth = folder / "depth.csv"
    assert depth.read_text().splitlines()[0] == "loops,rule,set,loss,ppl" and len(depth.read_text().splitlines()) == 5
    assert "[mesh-train] depth evaluation at step 4" in capsys.readouterr().err
    client = __import__("mlflow").MlflowClient(f"sqlite:///{tmp_path / 'mlflow.db'}")
    at = {m.step: m.value for m in client.get_metric_history(result["run_id"], "depth/shakespeare/loss")}
    thresholds = {m.step for m in client.get_metric_history(result["run_id"], "exit/state/eps")}
    assert sorted(at) == [1, 3] and thresholds == {0, 1}
    assert client.get_run(result["run_id"]).data.metrics["time/depth_eval_s"] > 0  # what it cost
    # its final validation loss is the K' = K pass's: the K = 2 row of a second list, on the finished run
    stamp = depth.stat().st_mtime_ns
    assert train(cfg)["run_id"] == result["run_id"] and depth.stat().st_mtime_ns == stamp  # done already
    assert "done already" in capsys.readouterr().err
    train(compose_run(*short, "depth_eval.loops=[2]", "depth_eval.rules=[last]", f"runs_dir={tmp_path}"))
    (row,) = [line.split(",") for line in depth.read_text().splitlines()[1:]]
    assert row[:2] == ["2", "last"] and float(row[3]) == pytest.approx(result["val_loss"], rel=1e-7, abs=0)
    capsys.readouterr()
    assert train(plain)["run_id"] == result["run_id"]  # no depth_eval: nothing evaluated, nothing said
    assert "depth evaluation" not in capsys.readouterr().err


@pytest.mark.parametrize(
    ("override", "field"),
    [
        ("depth_eval.loops=[0,2]", "depth_eval.loops=[0, 2]"),
        ("depth_eval.rules=[first]", "depth_eval.rules='first'"),
        ("depth_eval.exit=[entropy]", "depth_eval.exit='entropy'"),
        ("depth_eval.exit_eps=[-1]", "depth_eval.exit_eps=-1"),
        ("depth_eval.exit_loops=0", "depth_eval.exit_loops=0"),
    ],
)
def test_bad_depth_eval_settings_are_refused_in_one_line_before_training(override, field, compose_run, tmp_path):
    with pytest.raises(InputError) as error:
        plan_run(compose_run(override, f"runs_dir={tmp_path}"))
    assert str(error.value).startswith(field) and "\n" not in str(error.value)


def test_a_grid_rerun_with_depth_eval_evaluates_the_cells_it_had_trained_and_then_nothing(
    grid_cell_overrides, tmp_path
):
    import io

    from sweeps.sweep import run_sweep

    args = [
        *grid_cell_overrides("scheme=mesh", "probes.enabled=false"),
        "seeds=1",
        "launcher=local",
        f"runs_dir={tmp_path}",
    ]
    asked = ["depth_eval.loops=[1,3]", "depth_eval.rules=[last]"]
    said = []
    for extra in ([], asked, asked):
        out = io.StringIO()
        assert run_sweep("schemes", [*args, *extra], out=out) == 0
        said.append(out.getvalue())
    assert "0 already finished, 1 to run" in said[0] and "0 already finished, 1 to run" in said[1]
    assert "1 already finished, 0 to run" in said[2]
    (depth,) = tmp_path.glob("schemes/*/eval/depth-step6/depth.csv")
    assert [line.split(",")[:2] for line in depth.read_text().splitlines()[1:]] == [["1", "last"], ["3", "last"]]
