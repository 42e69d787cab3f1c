"""mesh-sweep: every grid composes, 2x2 grids run end to end with each launcher, bookkeeping."""

from __future__ import annotations

import io
import json
import os
import re
import signal
import time
from pathlib import Path

import mlflow
import optuna
import pytest
import submitit
import torch
from helpers import run_tool
from omegaconf import OmegaConf

from experiments.compose import compose_config
from experiments.plan import InputError, plan_run
from experiments.train import train
from mesh_model import ConfigError
from sweeps.catalogue import sweep_names
from sweeps.cells import FINISHED, Cell, CellOutcome
from sweeps.grid import compose_launch, expand_cells
from sweeps.launch import cell_job
from sweeps.launch.base import ResourcesConfig
from sweeps.launch.cell_job import CellJob
from sweeps.launch.slurm import SlurmLauncher
from sweeps.sweep import main, run_sweep

# Every sweep file must appear here with its default grid: a new file without a test fails.
EXPECTED_GRIDS = {
    "schemes": {"scheme": ["vanilla", "base", "residual", "anchor", "anchor_emb", "mesh"]},
    "buffer_slots": {"buffer_slots": ["3", "4", "5", "6"]},
    "skip_combos": {
        "scheme": [
            "vanilla",
            "base",
            "anchor",
            "residual+anchor",
            "residual+anchor+anchor_emb",
            "anchor+anchor_emb",
            "static",
            "dynamic",
            "mesh",
        ]
    },
    "loops": {"layout": ["1+4R1+1", "1+2R2+1", "0+2R3+0", "1+1R4+1"], "scheme": ["base", "mesh"]},
    "layer_distribution": {
        "layout": ["1+2R2+1", "2+1R2+2", "0+3R2+0", "1+1R4+1", "0+2R3+0"],
        "scheme": ["base", "mesh"],
    },
    "scale": {"model": ["tiny", "mini", "small"], "scheme": ["vanilla", "base", "mesh"]},
    "nonshared": {"layout": ["1+2+2+1", "1+2R2+1"], "scheme": ["base", "mesh"]},
    "moe": {"scheme": ["vanilla", "base", "anchor", "mesh"]},  # at tiny-moe (tests/test_moe_training.py)
    "lr": {"scheme": ["vanilla", "base", "anchor_emb", "mesh"], "optim.lr": ["0.001", "0.002", "0.004", "0.008"]},
    "depth": {
        "scheme": ["base", "anchor", "anchor_emb", "mesh"],
        "loops": ["fixed", "poisson_lognormal"],
        "seed": ["200", "201", "202"],
    },
    "size_tokens": {
        "arm": ["base", "anchor", "anchor_emb", "mesh", "mesh_residual_read"],
        "seed": ["300", "301", "302"],
    },
    "schemes_relr": {"scheme": ["vanilla", "base", "anchor", "anchor_emb", "mesh"]},
    "z_loss_lr": {"arm": ["mesh_z_loss", "base"], "seed": ["500", "501", "502", "503", "504", "505"]},
    "size_lr": {"arm": ["anchor", "anchor_emb"], "seed": ["300", "301", "302"]},
    "mesh_open_choices": {
        "arm": [
            "mesh",
            "mesh_own_slot",
            "mesh_router_lr",
            "mesh_rmsnorm",
            "mesh_z_loss",
            "mesh_residual_read",
            "mesh_warmup",
            "frozen_routing",
            "base",
            "anchor",
        ]
    },
}
# Optuna searches: their search space (a search also counts as tested here).
EXPECTED_SEARCHES = {
    "search_lr": {"optim.lr": "FloatDistribution(high=0.03, log=True, low=0.0003, step=None)"},
    "search_skip_coefficients": {
        "core": "FloatDistribution(high=1.5, log=False, low=0.25, step=None)",
        "anchor": "FloatDistribution(high=1.5, log=False, low=0.0, step=None)",
        "anchor_emb": "FloatDistribution(high=1.5, log=False, low=0.0, step=None)",
    },
}


@pytest.fixture
def fast(grid_cell_overrides) -> list[str]:
    """A grid cell (conftest's GRID_CELL), without probes: these tests count runs, not probes."""
    return grid_cell_overrides("probes.enabled=false")


def test_every_sweep_file_has_a_test():
    assert sorted([*EXPECTED_GRIDS, *EXPECTED_SEARCHES]) == sweep_names()


@pytest.mark.parametrize("name", sorted(EXPECTED_SEARCHES))
def test_every_search_composes_with_its_space(name, tmp_path):
    from sweeps.search import distributions, trial_overrides

    cfg = compose_config([f"+sweep={name}", f"runs_dir={tmp_path}"])
    search = OmegaConf.to_object(cfg.search)
    assert search.n_trials > 0
    space = distributions(search)
    assert {k: str(v) for k, v in space.items()} == EXPECTED_SEARCHES[name]
    sample = {k: (v.low + v.high) / 2 for k, v in space.items()}
    trial_cfg = compose_config([f"+sweep={name}", f"runs_dir={tmp_path}", *trial_overrides(search, sample)])
    plan_run(trial_cfg)  # a trial's config is a valid run
    if name == "search_skip_coefficients":
        assert trial_cfg.scheme == "0.8750*core+0.7500*anchor+0.7500*anchor_emb"


@pytest.mark.parametrize("name", sorted(EXPECTED_GRIDS))
def test_every_sweep_composes_and_expands_to_its_grid(name, tmp_path):
    cells = expand_cells(name, [f"runs_dir={tmp_path}"], seeds=[])
    grid = EXPECTED_GRIDS[name]
    expected = 1
    for values in grid.values():
        expected *= len(values)
    assert len(cells) == expected
    for key, values in grid.items():
        assert sorted({o.split("=", 1)[1] for c in cells for o in c.overrides if o.startswith(f"{key}=")}) == sorted(
            values
        )
    for cell in cells:  # each cell composes into a valid, checkable run
        cfg = compose_config(cell.overrides)
        assert cfg.tracking.experiment == name
        plan = plan_run(cfg)
        assert plan.run_dir.parent.name == name
    # Distinct cells are distinct runs.
    assert len({plan_run(compose_config(c.overrides)).run_dir for c in cells}) == len(cells)


def test_vanilla_cell_is_the_compute_matched_plain_model(tmp_path):
    cfg = compose_config(["+sweep=schemes", "scheme=vanilla", "layout=1+2R3+1", f"runs_dir={tmp_path}"])
    plan = plan_run(cfg)
    assert plan.model_config.layout == "8" and plan.model_config.scheme == "base"


def test_seeds_repeat_cells_and_command_line_lists_replace_axes(tmp_path):
    launch = compose_launch(["seeds=3"])
    assert launch.seeds == [0, 1, 2]
    assert compose_launch(["seeds=[4,7]"]).seeds == [4, 7]
    cells = expand_cells("schemes", ["scheme=base,mesh", f"runs_dir={tmp_path}"], seeds=[0, 1, 2])
    assert [c.label for c in cells] == [f"scheme={s} seed={d}" for s in ("base", "mesh") for d in range(3)]
    pinned = expand_cells("loops", ["scheme=mesh", f"runs_dir={tmp_path}"], seeds=[])
    assert [c.label for c in pinned] == [
        f"layout={lay} scheme=mesh" for lay in ("1+4R1+1", "1+2R2+1", "0+2R3+0", "1+1R4+1")
    ]


def test_dry_run_lists_the_runs_and_starts_nothing(tmp_path):
    out = io.StringIO()
    assert run_sweep("buffer_slots", ["seeds=2", f"runs_dir={tmp_path}"], dry_run=True, out=out) == 0
    text = out.getvalue()
    assert text.startswith("buffer_slots: 8 cells (4 configs x 2 seeds)\nbuffer_slots: estimate: ")
    assert "buffer_slots=3 seed=0" in text and "buffer_slots=6 seed=1" in text
    assert text.endswith(
        "every run: global batch 16 x 128 tokens = 2,048 tokens/step; 200 steps = 409.6k tokens; LR warmup 2 steps, cosine to 10% at step 200\n"
        "the grid: 3.3M tokens in 8 runs\n"
        "per cell: 2 seeds x 200 steps; the main job (mesh-demo) runs 2 seeds x 400 steps: this grid differs "
        "(200 steps, not 400)\n"
    )
    assert not (tmp_path / "mlflow.db").exists()
    # the grid's defaults (1 seed) said against the main job's, and the main job's own settings as the same
    out = io.StringIO()
    assert run_sweep("loops", [f"runs_dir={tmp_path}"], dry_run=True, out=out) == 0
    assert out.getvalue().splitlines()[-1].endswith("this grid differs (200 steps, not 400, 1 seed, not 2)")
    out = io.StringIO()
    assert run_sweep("schemes", ["seeds=2", "max_steps=400", f"runs_dir={tmp_path}"], dry_run=True, out=out) == 0
    assert (
        out.getvalue().splitlines()[-1]
        == "per cell: 2 seeds x 400 steps; the main job (mesh-demo) runs 2 seeds x 400 steps, as here"
    )


def test_dry_run_shows_the_papers_global_batch_on_the_cluster_it_asks_for(tmp_path):
    """recipe=pythia on 2 nodes of 8 GPUs: 512 sequences a step are 8 per GPU x 4 accumulated x 16."""
    out = io.StringIO()
    request = ["model=pythia-160m", "recipe=pythia", "trainer=gpu", "launcher=slurm", "resources=gpu8x2"]
    assert run_sweep("schemes", [*request, "scheme=base,mesh"], dry_run=True, out=out) == 0
    assert out.getvalue().splitlines()[-3:-1] == [
        "every run: global batch 512 (8 x 4 accumulated x 16 processes) x 4096 tokens = 2,097,152 tokens/step; "
        "119,210 steps = 250.0B tokens; LR warmup 1,192 steps, cosine to 10% at step 119,210",
        "the grid: 500.0B tokens in 2 runs",
    ]
    # Budgets that differ are shown under each cell.
    out = io.StringIO()
    assert run_sweep("schemes", ["scheme=base", "data.batch_size=8,16"], dry_run=True, out=out) == 0
    assert (
        "       global batch 8 x 128 tokens = 1,024 tokens/step; 200 steps = 204.8k tokens; LR warmup 2 steps, cosine to 10% at step 200"
        in (out.getvalue())
    )


# A step of about 20 TB (MeSH's coefficients grow as K^3): more than any machine running the suite.
HUGE_STEP = ["model=tiny", "layout=1+2R1000+1", "scheme=mesh", "data.batch_size=64"]


@pytest.mark.parametrize(
    ("arguments", "message"),
    [
        (
            ["resources=gpu1"],
            "trainer.accelerator='cpu' is invalid: resources ask for 1 GPU(s) per node: add trainer=gpu "
            "(or trainer=ddp), or drop the GPUs (resources=cpu)",
        ),
        (
            ["trainer=gpu"],
            "trainer.accelerator='gpu' is invalid: resources ask SLURM for no GPU: add resources=gpu1 "
            "(or gpu4, gpu8x2, resources.gpus_per_node=N), or trainer=cpu",
        ),
        (
            [*HUGE_STEP, "resources.mem_gb=1000"],
            " GB are available per node (resources.mem_gb=1000 GiB); raise resources.mem_gb, lower K",
        ),
        # 2 tasks of about 18,700 GiB each do not fit in 30,000 GiB; one would.
        ([*HUGE_STEP, "resources=ddp_cpu", "resources.mem_gb=30000"], "needs about 2 processes x "),
    ],
)
def test_a_slurm_grid_is_checked_against_the_nodes_it_asks_for(capsys, tmp_path, arguments, message):
    """Planned on a login node, a SLURM cell's memory is the node's ``mem_gb`` (shared by its
    tasks), and a trainer that contradicts the GPUs asked for is refused before anything is submitted."""
    assert main(["schemes", "scheme=mesh", "launcher=slurm", f"runs_dir={tmp_path}", *arguments, "--dry-run"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("error: ") and message in err, err


def test_a_slurm_cell_larger_than_this_machine_is_planned_for_its_node_and_a_gpu_node_is_not_measured_here(tmp_path):
    out = io.StringIO()
    arguments = ["scheme=mesh", "launcher=slurm", f"runs_dir={tmp_path}", *HUGE_STEP]
    assert run_sweep("schemes", [*arguments, "resources.mem_gb=100000"], dry_run=True, out=out) == 0
    assert run_sweep("schemes", [*arguments, "trainer=gpu", "resources=gpu1"], dry_run=True, out=out) == 0
    with pytest.raises(InputError, match=r" GB are available in RAM; lower K"):  # the same cell run here
        run_sweep("schemes", ["scheme=mesh", "launcher=local", f"runs_dir={tmp_path}", *HUGE_STEP], dry_run=True)
    assert not (tmp_path / "mlflow.db").exists()


def test_bad_sweep_requests_answer_in_one_line(capsys, tmp_path):
    assert main(["nosuch"]) == 2
    assert capsys.readouterr().err.strip() == (
        "error: sweep='nosuch' is invalid: known sweeps: " + ", ".join(sweep_names())
    )
    assert main(["schemes", "seed=5", "seeds=2", "--dry-run"]) == 2  # seeds= would drop seed=5 silently
    assert capsys.readouterr().err.strip() == (
        "error: seed=5 is invalid beside seeds=: a grid's seeds come from seeds= alone (seeds=[5] runs seed 5; seeds=3 runs 0,1,2)"
    )
    assert main(["schemez"]) == 2  # a typo gets the closest name first
    assert capsys.readouterr().err.startswith(
        "error: sweep='schemez' is invalid: did you mean 'schemes' or 'schemes_relr'? known sweeps: "
    )
    assert main(["schemes", "launcher=slurmx", "--dry-run"]) == 2
    assert (
        "launcher='slurmx' is invalid: did you mean 'slurm'? known options: auto, local, parallel, slurm, submitit_local"
        in capsys.readouterr().err
    )
    assert main(["schemes", "layout=4+8R0+4", f"runs_dir={tmp_path}", "--dry-run"]) == 2
    assert "layout='4+8R0+4' is invalid" in capsys.readouterr().err
    assert main(["schemes", "nokey=1", "--dry-run"]) == 2
    assert "'nokey' is not a config key" in capsys.readouterr().err


def test_slurm_launcher_composes_with_its_resources(tmp_path, monkeypatch):
    # submitit only checks that an `srun` exists; a stand-in lets us render the real sbatch file.
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "srun").write_text("#!/bin/sh\nexit 0\n")
    (bin_dir / "srun").chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}:{os.environ['PATH']}")
    launch = compose_launch(
        ["launcher=slurm", "launcher.partition=gpu", "launcher.account=lab", "resources=gpu4", "resources.time_min=90"]
    )
    assert isinstance(launch.launcher, SlurmLauncher) and launch.launcher.partition == "gpu"
    assert launch.resources.gpus_per_node == 4 and launch.resources.time_min == 90
    executor = launch.launcher.executor(tmp_path, launch.resources)
    script = executor._executor._make_submission_file_text("python job.py", "uid")
    for line in ("#SBATCH --partition=gpu", "#SBATCH --account=lab", "#SBATCH --gpus-per-node=4"):
        assert line in script
    assert "#SBATCH --ntasks-per-node=4" in script and "#SBATCH --time=90" in script


def test_slurm_launcher_without_slurm_says_so_in_one_line(capsys, tmp_path, monkeypatch, fast):
    empty = tmp_path / "bin"  # a PATH with no SLURM on it, also on a machine that has SLURM in /usr/bin
    empty.mkdir()
    monkeypatch.setenv("PATH", str(empty))
    args = ["schemes", "scheme=base", *fast, f"runs_dir={tmp_path}", "launcher=slurm"]
    assert main(args) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: launcher=slurm needs SLURM (no srun on PATH)") and "\n" not in err


@pytest.mark.parametrize("ends", ["finished", "stopped"])
def test_a_slurm_cell_ignores_usr2_once_it_has_ended_and_hands_it_to_submitit_after_a_stop(ends, monkeypatch):
    """SLURM's warning before the time limit (USR2) can come after a cell has finished: while
    submitit writes the result, or while Python shuts down (it puts handlers back to the default,
    terminate, so the job would end FAILED with exit 140, as seen on the local cluster). A cell
    that ran to its end ignores it; after a stop (Ctrl-C, SIGTERM) submitit's handler is back."""
    usr2 = submitit.JobEnvironment._usr_sig()
    heard: list[int] = []

    def submitits(signum, frame):  # stands for submitit's checkpoint-and-requeue handler
        heard.append(signum)

    def run_cell(cell, threads):
        if ends == "stopped":
            raise KeyboardInterrupt
        return CellOutcome(cell.index, cell.overrides, FINISHED, cell.label, val_loss=1.0)

    previous = signal.signal(usr2, submitits)
    monkeypatch.setenv("SUBMITIT_EXECUTOR", "slurm")
    monkeypatch.setattr(cell_job, "run_cell", run_cell)
    cell = Cell(0, ["scheme=base"], "scheme=base")
    try:
        if ends == "finished":
            assert CellJob()(cell).status == FINISHED
            assert signal.getsignal(usr2) is signal.SIG_IGN
        else:
            with pytest.raises(KeyboardInterrupt):
                CellJob()(cell)
            assert signal.getsignal(usr2) is submitits
        os.kill(os.getpid(), usr2)  # handled (or ignored) before the next bytecode
        assert heard == ([] if ends == "finished" else [usr2])
    finally:
        signal.signal(usr2, previous)


def test_a_training_that_does_not_stop_in_time_after_usr2_is_handed_to_submitit_anyway(monkeypatch):
    """After USR2 the cell has ``stop_within_s`` to stop and save; past it, submitit requeues the
    job from its last periodic checkpoint, rather than SLURM ending it TIMEOUT at the limit."""
    usr2 = submitit.JobEnvironment._usr_sig()
    heard: list[int] = []
    previous = signal.signal(usr2, lambda signum, frame: heard.append(signum))  # submitit's requeue
    sigterm = signal.signal(signal.SIGTERM, lambda signum, frame: None)  # a stop still in progress
    try:
        with cell_job._usr2_stops_training_first(stop_within_s=0.2):
            signal.signal(signal.SIGTERM, lambda signum, frame: None)  # training: its own handler
            os.kill(os.getpid(), usr2)
            time.sleep(0.1)
            assert heard == []  # still the training's turn
            time.sleep(0.4)
            assert heard == [usr2]  # handed over at 0.2 s
    finally:
        signal.signal(usr2, previous)
        signal.signal(signal.SIGTERM, sigterm)
    assert signal.getitimer(signal.ITIMER_REAL) == (0.0, 0.0)


def test_the_usr2_warning_is_a_tenth_of_the_limit_at_most_90_s_or_what_is_asked(tmp_path):

    assert SlurmLauncher().signal_delay(ResourcesConfig(time_min=5)) == 30
    assert SlurmLauncher().signal_delay(ResourcesConfig(time_min=2880)) == 90
    assert SlurmLauncher(signal_delay_s=600).signal_delay(ResourcesConfig(time_min=2880)) == 600
    with pytest.raises(ConfigError, match=r"launcher.signal_delay_s=0 is invalid: must be >= 1"):
        SlurmLauncher(signal_delay_s=0).validate()


def client_for(runs_dir):
    return mlflow.MlflowClient(f"sqlite:///{runs_dir / 'mlflow.db'}")


def sweep_runs(runs_dir, experiment="schemes"):
    client = client_for(runs_dir)
    exp = client.get_experiment_by_name(experiment)
    runs = client.search_runs([exp.experiment_id])
    parents = [r for r in runs if r.data.tags.get("kind") == "sweep"]
    children = [r for r in runs if r.data.tags.get("kind") != "sweep"]
    return parents, children


def check_grid(runs_dir, expected_children=4):
    parents, children = sweep_runs(runs_dir)
    assert len(parents) == 1 and parents[0].info.status == "FINISHED"
    assert len(children) == expected_children
    for run in children:
        assert run.info.status == "FINISHED"
        assert run.data.tags["mlflow.parentRunId"] == parents[0].info.run_id
        assert len(run.data.tags["config_hash"]) == 12
        history = client_for(runs_dir).get_metric_history(run.info.run_id, "val/shakespeare/loss")
        assert [m.step for m in history] == [3, 6]  # nothing lost, even from parallel writers
    assert {(r.data.params["scheme"], r.data.params["seed"]) for r in children} == {
        (s, d) for s in ("base", "mesh") for d in ("0", "1")
    }
    return parents[0]


GRID_2X2 = ["scheme=base,mesh", "seeds=2"]


@pytest.mark.slow
@pytest.mark.parametrize("launcher", ["local", "submitit_local", "parallel"])
def test_2x2_grid_runs_end_to_end_and_a_rerun_starts_nothing(launcher, tmp_path, fast):
    out = io.StringIO()
    args = [*GRID_2X2, *fast, f"runs_dir={tmp_path}", f"launcher={launcher}"]
    assert run_sweep("schemes", args, out=out) == 0, out.getvalue()
    parent = check_grid(tmp_path)
    assert parent.data.metrics["cells_finished"] == 4
    assert "all cells finished" in out.getvalue()
    # Each cell's start, as the launcher reports it, comes before its end; the last end has no more to wait for.
    said = [line.split("[mesh-sweep] ", 1)[1] for line in out.getvalue().splitlines() if "[mesh-sweep] " in line]
    labels = [f"scheme={s} seed={d}" for s in ("base", "mesh") for d in (0, 1)]
    for number, label in enumerate(labels, 1):
        started = said.index(f"cell {number}/4 started {label}")
        (ended,) = [i for i, e in enumerate(said) if e.startswith(f"cell {number}/4 FINISHED {label} · ")]
        assert started < ended
    assert said[-1].endswith(" · ETA 0s") and parent.data.tags["launcher"] == launcher

    again = io.StringIO()
    assert run_sweep("schemes", args, out=again) == 0
    assert "4 already finished, 0 to run" in again.getvalue()
    parents, children = sweep_runs(tmp_path)
    assert len(parents) == 1 and len(children) == 4  # the same parent, no new run
    assert parents[0].data.metrics["cells_skipped"] == 4


@pytest.mark.slow
def test_a_submitit_local_cell_of_two_tasks_is_one_ddp_run_logged_by_rank_0(tmp_path, fast, capsys):
    """submitit's local executor starts the two tasks itself; they join as one DDP run, as srun's
    tasks do on SLURM (tests/test_slurm_cluster.py), instead of two processes training one run."""
    out = io.StringIO()
    args = ["scheme=base", *fast, f"runs_dir={tmp_path}", "launcher=submitit_local", "resources=ddp_cpu"]
    assert run_sweep("schemes", args, out=out) == 0, out.getvalue()
    parents, (run,) = sweep_runs(tmp_path)
    assert run.info.status == "FINISHED" and parents[0].info.status == "FINISHED"
    assert (run.data.params["trainer.devices"], run.data.params["trainer.strategy"]) == ("2", "ddp")
    history = client_for(tmp_path).get_metric_history(run.info.run_id, "train/loss")
    every, steps = int(run.data.params["log_every"]), int(run.data.params["max_steps"])
    assert [m.step for m in history] == list(range(every - 1, steps, every))  # once each: rank 0 alone logs
    result = json.loads((Path(run.data.tags["run_dir"]) / "result.json").read_text())
    assert result["world_size"] == 2 and result["run_id"] == run.info.run_id

    assert main(["schemes", *args, "resources.nodes=2"]) == 2  # one machine has one node
    assert capsys.readouterr().err == (
        "error: resources.nodes=2 is invalid: launcher=submitit_local runs on this machine: use 1\n"
    )


@pytest.mark.slow
def test_a_failing_cell_is_recorded_and_the_others_finish(tmp_path, fast):
    args = [*GRID_2X2, *fast, f"runs_dir={tmp_path}"]
    # Plant an intact checkpoint of no model in one cell's run dir: its resume fails at run time.
    (cell,) = [c for c in expand_cells("schemes", [*args[:1], *fast, f"runs_dir={tmp_path}"], [1]) if "mesh" in c.label]
    broken = plan_run(compose_config(cell.overrides)).run_dir / "checkpoints" / "last.ckpt"
    broken.parent.mkdir(parents=True)
    torch.save({"state_dict": {}, "global_step": 3}, broken)
    out = io.StringIO()
    assert run_sweep("schemes", args, out=out) == 1
    text = out.getvalue()
    assert "| scheme=mesh seed=1 | FAILED |" in text and "\n1 failed\n" in text
    parents, children = sweep_runs(tmp_path)
    assert parents[0].info.status == "FAILED" and parents[0].data.metrics["cells_failed"] == 1
    statuses = sorted(r.info.status for r in children)
    assert statuses == ["FAILED", "FINISHED", "FINISHED", "FINISHED"]
    failed = [r for r in children if r.info.status == "FAILED"][0]
    assert failed.data.params["scheme"] == "mesh" and failed.data.params["seed"] == "1"
    assert failed.data.tags["error"]


def test_sweep_console_script_dry_run(tmp_path):
    env = {k: v for k, v in os.environ.items() if k != "MLFLOW_TRACKING_URI"}
    result = run_tool("mesh-sweep", "schemes", "seeds=2", "--dry-run", f"runs_dir={tmp_path}", env=env)
    assert result.returncode == 0 and result.stdout.startswith("schemes: 12 cells (6 configs x 2 seeds)\n")


# --- Optuna -------------------------------------------------------------------------------------


def study_of(runs_dir, name="search_lr"):
    storage = f"sqlite:///{runs_dir / 'optuna.db'}"
    (summary,) = optuna.get_all_study_summaries(storage=storage)
    assert summary.study_name.startswith(name)
    return optuna.load_study(study_name=summary.study_name, storage=storage)


@pytest.mark.slow
def test_optuna_search_resumes_when_extended_and_runs_trials_in_parallel(tmp_path, fast):
    search = [*fast, "search.pruner=none"]
    out = io.StringIO()
    assert run_sweep("search_lr", [*search, f"runs_dir={tmp_path}", "search.n_trials=4"], out=out) == 0, out.getvalue()
    study = study_of(tmp_path)
    assert [t.state.name for t in study.trials] == ["COMPLETE"] * 4
    first = [(t.number, t.params) for t in study.trials]
    assert all(3e-4 <= p["optim.lr"] <= 3e-2 for _, p in first)

    more = io.StringIO()
    args = [*search, f"runs_dir={tmp_path}", "search.n_trials=6", "launcher=parallel", "launcher.workers=2"]
    assert run_sweep("search_lr", args, out=more) == 0, more.getvalue()
    study = study_of(tmp_path)
    assert len(study.trials) == 6 and [t.state.name for t in study.trials] == ["COMPLETE"] * 6
    assert [(t.number, t.params) for t in study.trials][:4] == first  # resumed, not restarted
    new_lrs = [t.params["optim.lr"] for t in study.trials[4:]]
    assert all(lr not in [p["optim.lr"] for _, p in first] for lr in new_lrs)  # no replayed suggestions
    assert "best: trial" in more.getvalue()
    said = [line.split("[mesh-sweep] ", 1)[1] for line in more.getvalue().splitlines() if "[mesh-sweep] " in line]
    assert said[0].startswith("search_lr: Optuna search to 6 trials, 4 already finished")
    assert sorted(e.split(" optim.lr=")[0] for e in said if " started " in e) == [
        "trial 5/6 started",
        "trial 6/6 started",
    ]
    ended = [e for e in said if " FINISHED " in e]
    assert len(ended) == 2 and all(re.search(r" · val PPL [\d.]+ · wall \d+s · ETA \S+$", e) for e in ended)
    assert ended[-1].endswith("ETA 0s")

    parents, children = sweep_runs(tmp_path, "search_lr")
    assert len(parents) == 1 and len(children) == 6
    tags = parents[0].data.tags  # this invocation's; the params were logged once, at creation
    assert tags["search.n_trials"] == "6" and tags["launcher"] == "parallel" and tags["command"].endswith("workers=2")
    assert (
        parents[0].data.params["sweep"] == "search_lr"
        and "search.n_trials=4" not in parents[0].data.params["overrides"]
    )
    assert tags["mlflow.note.content"].startswith("search_lr: 6 trials\n\n| trial | state | value |")
    assert tags["progress"] == "6/6: 2 finished, 4 skipped"  # the trials of the first invocation count as skipped
    assert parents[0].data.metrics["cells_finished"] == 2 and parents[0].data.metrics["cells_skipped"] == 4
    assert sorted(int(r.data.tags["optuna_trial"]) for r in children) == list(range(6))
    for run in children:
        assert run.data.tags["mlflow.parentRunId"] == parents[0].info.run_id
        trial = study.trials[int(run.data.tags["optuna_trial"])]
        assert float(run.data.params["optim.lr"]) == pytest.approx(trial.params["optim.lr"])
        assert run.data.metrics["val_loss"] == pytest.approx(trial.value)


def test_a_trial_worse_than_the_median_is_pruned_from_inside_training(tmp_path, fast):
    storage = f"sqlite:///{tmp_path / 'optuna.db'}"
    study = optuna.create_study(
        study_name="prune", storage=storage, pruner=optuna.pruners.MedianPruner(n_startup_trials=0)
    )
    lr = optuna.distributions.FloatDistribution(1e-4, 1e-2)
    study.add_trial(  # a finished trial that was far better at every step
        optuna.trial.create_trial(
            params={"optim.lr": 1e-3}, distributions={"optim.lr": lr}, value=0.5, intermediate_values={3: 0.5, 6: 0.5}
        )
    )
    trial = study.ask({"optim.lr": lr})
    cfg = compose_config(
        [
            *fast,
            f"runs_dir={tmp_path}",
            "search.study_name=prune",
            f"search.storage={storage}",
            f"search.trial_id={trial._trial_id}",
            "search.pruner_startup_trials=0",
        ]
    )
    with pytest.raises(optuna.TrialPruned):
        train(cfg)
    client = client_for(tmp_path)
    (run,) = client.search_runs([client.get_experiment_by_name("mesh").experiment_id])
    assert run.info.status == "KILLED" and "pruned at step 3" in run.data.tags["pruned"]
    # The trial heard the validation loss of its first validation, the one MLflow logged, and no more.
    (logged,) = client.get_metric_history(run.info.run_id, "val/shakespeare/loss")
    assert logged.step == 3 and logged.value > 0.5  # worse than the finished trial: pruned
    assert study.trials[1].intermediate_values == {3: pytest.approx(logged.value, rel=1e-6)}
