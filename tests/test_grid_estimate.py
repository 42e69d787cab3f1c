"""A grid says its cell count and its cost (the FLOP model's CPU- or GPU-hours, its checkpoints on
disk) before its cells are planned, and a grid of more than 200 cells starts only once confirmed:
a terminal asks, elsewhere ``--yes`` is needed.

Planning is made to refuse here (``data.path`` names no file): what is printed before that refusal
was printed before planning, and a command that reaches that refusal went past the confirmation.
``mesh-sweep`` runs its main in this process (tests/helpers.py), off a terminal; the questions
asked on a terminal run it in a process of its own whose stdin is a pseudo-terminal.
"""

from __future__ import annotations

import io
import os
import pty
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from helpers import Ran, run_tool

from experiments.budget import CPU_FLOPS, GPU_FLOPS
from experiments.checkpoints import load_model
from experiments.compose import compose_config
from experiments.plan import estimate_run, plan_run
from mesh_model import ConfigError, count_parameters
from mesh_model.model import build_model
from sweeps.estimate import LARGE_GRID, distinct_configs, estimate_grid
from sweeps.grid import launched_cells, read_request
from sweeps.sweep import run_sweep

MESH_SWEEP = str(Path(sys.executable).parent / "mesh-sweep")
REFUSE_YES = (
    f"error: 240 cells is more than {LARGE_GRID}: add --yes to start them (--dry-run lists them, starts nothing)"
)


def big_grid_arguments(tmp_path: Path) -> list[str]:
    """240 cells (6 schemes x 40 seeds) whose planning refuses: data.path names no file."""
    missing = tmp_path / "missing.txt"
    return ["schemes", "seeds=40", "data=text", f"data.path={missing}", f"runs_dir={tmp_path / 'runs'}"]


def environment() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if k != "MLFLOW_TRACKING_URI"}


def big_grid(tmp_path: Path, *extra: str, monkeypatch: pytest.MonkeyPatch) -> Ran:
    """mesh-sweep of the big grid, its main in this process, off a terminal: its stdin is empty and
    no terminal (as /dev/null is to a process), whatever stdin pytest itself was given."""
    monkeypatch.setattr(sys, "stdin", io.StringIO())
    return run_tool("mesh-sweep", *big_grid_arguments(tmp_path), *extra, env=environment())


def big_grid_on_a_terminal(tmp_path: Path, stdin: int) -> Ran:
    """mesh-sweep of the big grid in a process of its own, whose stdin is the terminal ``stdin``."""
    command = [MESH_SWEEP, *big_grid_arguments(tmp_path)]
    done = subprocess.run(command, stdin=stdin, capture_output=True, text=True, timeout=300, env=environment())
    return Ran(done.returncode, done.stdout, done.stderr)


def planning_refused(done: Ran, tmp_path: Path) -> bool:
    return (
        done.returncode == 2
        and done.stderr == f"error: data.path='{tmp_path / 'missing.txt'}' is invalid: no such file or folder\n"
    )


def test_the_count_and_the_estimate_come_before_planning(tmp_path, monkeypatch):
    done = big_grid(tmp_path, "--dry-run", monkeypatch=monkeypatch)
    assert planning_refused(done, tmp_path), done.stderr
    count, estimate = done.stdout.splitlines()
    assert count == "schemes: 240 cells (6 configs x 40 seeds)"
    assert estimate.startswith("schemes: estimate: ") and " CPU-h (FLOP model, 2e10 FLOP/s per core), " in estimate
    assert estimate.endswith(" GB of checkpoints")
    assert not (tmp_path / "runs").exists()


def test_off_a_terminal_a_big_grid_needs_yes(tmp_path, monkeypatch):
    refused = big_grid(tmp_path, monkeypatch=monkeypatch)
    assert refused.returncode == 2 and refused.stderr == REFUSE_YES + "\n"
    assert refused.stdout.startswith("schemes: 240 cells (6 configs x 40 seeds)\nschemes: estimate: ")
    assert planning_refused(big_grid(tmp_path, "--yes", monkeypatch=monkeypatch), tmp_path)  # --yes: on to planning
    assert not (tmp_path / "runs").exists()


@pytest.mark.parametrize("answer, starts", [("n", False), ("y", True)])
def test_on_a_terminal_a_big_grid_asks_first(tmp_path, answer, starts):
    """A real process whose stdin is a pseudo-terminal: the terminal is the point."""
    terminal, stdin = pty.openpty()
    try:
        os.write(terminal, f"{answer}\n".encode())  # typed ahead: read once the question is asked
        done = big_grid_on_a_terminal(tmp_path, stdin)
    finally:
        os.close(stdin)
        os.close(terminal)
    assert "schemes: estimate: " in done.stdout and "start 240 cells? [y/N] " in done.stdout
    if starts:
        assert planning_refused(done, tmp_path), done.stderr
    else:
        assert done.returncode == 1 and done.stdout.endswith("schemes: not started\n") and done.stderr == ""
    assert not (tmp_path / "runs").exists()


def test_a_grid_of_200_cells_starts_without_asking(tmp_path):
    arguments = ["scheme=base,mesh", "seeds=100", "data=text", f"data.path={tmp_path / 'missing.txt'}"]
    with pytest.raises(ConfigError, match=r"^data\.path=.* is invalid: no such file or folder$"):  # planning reached
        run_sweep("schemes", [*arguments, f"runs_dir={tmp_path}"], out=io.StringIO(), stdin=io.StringIO())


def test_the_estimate_is_the_flop_model_of_every_cell(tmp_path, tiny_run):
    """Each scheme's training FLOPs (count_parameters of the model the run will build: at the
    vocabulary a trained run's model has, and the run's window) x its tokens at 2e10 FLOP/s per
    core, x 2 seeds."""
    vocab = load_model(tiny_run.run_dir / "checkpoints" / "last.ckpt")[0].config.vocab_size
    launch, overrides, _ = read_request("schemes", ["seeds=2", f"runs_dir={tmp_path}"])
    cells = launched_cells("schemes", overrides, launch)
    estimate = estimate_grid(distinct_configs(cells))
    expected = 0.0
    for cell in cells[::2]:  # one seed of each scheme
        plan = plan_run(compose_config(cell.overrides))
        with torch.device("meta"):
            model = build_model(plan.model_config.replace(vocab_size=vocab))
        expected += 2 * count_parameters(model, plan.budget.seq_len)["flops_per_token"] * plan.budget.total_tokens
    assert estimate.cpu_hours == pytest.approx(expected / CPU_FLOPS / 3600, rel=1e-12)
    assert estimate.gpu_hours == 0 and estimate.sampled == estimate.configs == 6
    gpu = estimate_run(compose_config(["trainer=gpu", "trainer.devices=1", f"runs_dir={tmp_path}"]))
    assert gpu.on_gpu and gpu.hours == pytest.approx(gpu.flops / GPU_FLOPS / 3600)


def test_a_grid_of_many_configs_is_estimated_from_a_sample(tmp_path):
    """12 learning rates of one model cost the same: 6 of them, evenly spread, give the whole grid."""
    lrs = ",".join(f"{k}e-4" for k in range(1, 13))
    launch, overrides, _ = read_request("schemes", ["scheme=mesh", f"optim.lr={lrs}", f"runs_dir={tmp_path}"])
    configs = distinct_configs(launched_cells("schemes", overrides, launch))
    estimate = estimate_grid(configs)
    one = estimate_run(compose_config(next(iter(configs.values()))[0].overrides))
    assert (estimate.configs, estimate.sampled) == (12, 6)
    assert estimate.cpu_hours == pytest.approx(12 * one.hours) and estimate.disk_bytes == pytest.approx(
        12 * one.disk_bytes
    )
    assert estimate.describe().endswith(" of checkpoints, from 6 of its 12 configs")


def test_the_disk_estimate_is_the_checkpoints_a_run_leaves(tiny_run, compose_run):
    """The session's tiny run (10 steps, a checkpoint every 10: last.ckpt and step10.ckpt)."""
    on_disk = sum(p.stat().st_size for p in (tiny_run.run_dir / "checkpoints").glob("*.ckpt"))
    assert sorted(p.name for p in (tiny_run.run_dir / "checkpoints").glob("*.ckpt")) == ["last.ckpt", "step10.ckpt"]
    cost = estimate_run(compose_run("max_steps=10", "val_every=5", "scheme=mesh", f"runs_dir={tiny_run.runs_dir}"))
    assert cost.disk_bytes == pytest.approx(on_disk, rel=0.05)
