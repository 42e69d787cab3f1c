"""Packing a local grid: how many cells at once and with how many threads, within memory, and
that packed cells compute exactly what sequential ones do."""

from __future__ import annotations

import dataclasses
import io
import json

import mlflow
import pytest

from experiments.compose import compose_config
from experiments.plan import plan_run
from sweeps.grid import compose_launch
from sweeps.launch.base import LaunchError
from sweeps.launch.local import PackedLauncher
from sweeps.packing import GB, PROCESS_BYTES, CellNeeds, choose_packing
from sweeps.sweep import run_sweep

SMALL = CellNeeds(int(0.25 * GB))


def test_a_cpu_grid_runs_one_cell_per_core_with_one_thread_each():
    packing = choose_packing([SMALL] * 12, cores=2, available_bytes=20 * GB)
    assert (packing.workers, packing.threads) == (2, 1)
    packing = choose_packing([SMALL] * 12, cores=8, available_bytes=64 * GB)
    assert (packing.workers, packing.threads) == (8, 1)


def test_cores_left_over_by_a_short_grid_become_threads():
    assert (choose_packing([SMALL], cores=2, available_bytes=20 * GB).workers, 2) == (1, 2)
    packing = choose_packing([SMALL] * 3, cores=8, available_bytes=64 * GB)
    assert (packing.workers, packing.threads) == (3, 2)


def test_memory_caps_the_cells_at_once():
    per_cell = SMALL.memory_bytes + PROCESS_BYTES
    packing = choose_packing([SMALL] * 12, cores=8, available_bytes=int(3.5 * per_cell / 0.8))
    assert (packing.workers, packing.threads) == (3, 2)
    assert "limited by memory" in packing.why
    # Too little memory even for one: still one at a time (the run's own check refuses what cannot fit).
    assert choose_packing([SMALL] * 4, cores=8, available_bytes=1).workers == 1


def test_explicit_workers_and_threads_are_kept():
    assert (choose_packing([SMALL] * 12, 2, 20 * GB, workers=1).workers, 2) == (1, 2)
    packing = choose_packing([SMALL] * 12, cores=8, available_bytes=64 * GB, threads=4)
    assert (packing.workers, packing.threads) == (2, 4)
    packing = choose_packing([SMALL] * 12, cores=8, available_bytes=64 * GB, workers=3, threads=1)
    assert (packing.workers, packing.threads) == (3, 1)


def test_accelerator_cells_run_one_at_a_time():
    packing = choose_packing([CellNeeds(GB, alone=True)] * 4, cores=16, available_bytes=100 * GB)
    assert packing.workers == 1 and packing.threads is None


def test_auto_is_the_default_launcher_and_takes_workers_and_threads():
    launch = compose_launch([])
    assert isinstance(launch.launcher, PackedLauncher) and launch.launcher.name == "auto"
    launch = compose_launch(["launcher.workers=3", "launcher.threads=1"])
    assert (launch.launcher.workers, launch.launcher.threads) == (3, 1)


def test_explicit_workers_that_do_not_fit_in_memory_are_refused_before_compute(tmp_path, grid_cell_overrides):
    plan = plan_run(compose_config(grid_cell_overrides(f"runs_dir={tmp_path}")))
    huge = dataclasses.replace(plan, memory=dataclasses.replace(plan.memory, activations=10_000 * GB))
    with pytest.raises(LaunchError, match=r"^launcher.workers=2 is too many: 2 cells at once need about"):
        PackedLauncher(workers=2).prepare([huge, huge])
    assert PackedLauncher().prepare([plan] * 4).startswith("packing: 4 cell(s),")


def _final_losses(runs_dir):
    client = mlflow.MlflowClient(f"sqlite:///{runs_dir / 'mlflow.db'}")
    experiment = client.get_experiment_by_name("schemes")
    runs = [r for r in client.search_runs([experiment.experiment_id]) if r.data.tags.get("kind") != "sweep"]
    losses = {(r.data.params["scheme"], r.data.params["seed"]): r.data.metrics["train/loss"] for r in runs}
    spans = sorted((r.info.start_time, r.info.end_time) for r in runs)
    return losses, spans


def _overlapping(spans) -> bool:
    return any(later[0] < earlier[1] for earlier, later in zip(spans, spans[1:], strict=False))


@pytest.mark.slow
def test_packed_and_sequential_grids_give_the_same_final_losses(tmp_path, grid_cell_overrides):
    fast = [o for o in grid_cell_overrides() if not o.startswith("runs_dir")]
    grid = ["scheme=base,mesh", "seeds=2", *fast]
    sequential, packed = tmp_path / "sequential", tmp_path / "packed"
    out = io.StringIO()
    assert (
        run_sweep("schemes", [*grid, f"runs_dir={sequential}", "launcher.workers=1", "launcher.threads=1"], out=out)
        == 0
    )
    assert "1 at a time" in out.getvalue()
    out = io.StringIO()
    args = [*grid, f"runs_dir={packed}", "launcher.workers=2", "launcher.threads=1"]
    assert run_sweep("schemes", args, out=out) == 0, out.getvalue()
    assert "packing: 4 cell(s), 2 at a time with 1 thread(s) each" in out.getvalue()

    one_at_a_time, packed_losses = _final_losses(sequential), _final_losses(packed)
    assert len(one_at_a_time[0]) == 4
    assert packed_losses[0] == one_at_a_time[0]  # bit-identical, cell by cell
    assert _overlapping(packed_losses[1]) and not _overlapping(one_at_a_time[1])
    for folder in (sequential, packed):
        results = sorted(folder.glob("schemes/*/result.json"))
        assert len(results) == 4 and all(json.loads(p.read_text())["val_loss"] > 0 for p in results)
