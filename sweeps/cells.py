"""A cell of a grid (one run's overrides) and what became of it; :func:`run_cell` trains one.

Every launcher runs the same picklable :func:`run_cell`, which composes the cell's config and
calls :func:`experiments.train.train`. A cell that raises is reported as FAILED (its MLflow run is
already marked FAILED with the error by ``train``) and the grid goes on. Ctrl-C is not a failure:
it propagates, and the launcher reports the cell INTERRUPTED and starts nothing more.
"""

from __future__ import annotations

import os
import sys
import traceback
from dataclasses import dataclass
from pathlib import Path

# What became of a cell. FAILED and INTERRUPTED cells whose process could not close its MLflow
# run (a worker killed by a signal) are closed by the sweep (sweeps/closing.py).
FINISHED, SKIPPED, FAILED, PRUNED = "FINISHED", "SKIPPED", "FAILED", "PRUNED"
INTERRUPTED = "INTERRUPTED"  # stopped by Ctrl-C (or SIGTERM) while it ran; re-running resumes it
NOT_STARTED = "NOT_STARTED"  # the grid was interrupted before this cell started
STATUSES = (FINISHED, SKIPPED, FAILED, PRUNED, INTERRUPTED, NOT_STARTED)
# Where a cell stands while its grid runs, as ``mesh-sweep --status`` finds it (sweeps/status.py).
RUNNING = "RUNNING"  # a process here, or a SLURM job, trains it now
PENDING = "PENDING"  # its SLURM job is queued


@dataclass
class Cell:
    index: int
    overrides: list[str]
    label: str = ""  # the grid coordinates, e.g. "scheme=mesh seed=1"


@dataclass
class CellOutcome:
    index: int
    overrides: list[str]
    status: str  # one of STATUSES
    label: str = ""
    val_loss: float | None = None
    run_id: str | None = None
    run_dir: str | None = None
    error: str | None = None
    val_ppl: float | None = None
    steps: int | None = None
    steps_per_s: float | None = None  # training steps per second of training time (no validation, no set-up)
    wall_s: float | None = None  # the run's wall time (train() entry to end), else as the sweep measured it

    @classmethod
    def from_result(cls, cell: Cell, status: str, result: dict) -> CellOutcome:
        """From what ``train`` returns (or wrote to ``result.json``)."""
        timing = result.get("timing") or {}
        train_s = timing.get("steps_s", 0.0) + timing.get("between_steps_s", 0.0)
        steps = result.get("steps")
        # The steps this process trained over its training time (experiments/callbacks/timing.py);
        # results of older versions have no such count: their global step over the time (which, for
        # a resumed run, counts the steps trained before the resume too).
        steps_per_s = timing.get("steps_per_s") or (steps / train_s if steps and train_s > 0 else None)
        return cls(
            cell.index,
            cell.overrides,
            status,
            cell.label,
            val_loss=result["val_loss"],
            run_id=result["run_id"],
            run_dir=result["run_dir"],
            val_ppl=result.get("val_ppl"),
            steps=steps,
            steps_per_s=steps_per_s,
            wall_s=timing.get("total_s"),
        )

    @classmethod
    def failed(cls, cell: Cell, error: str) -> CellOutcome:
        return cls(cell.index, cell.overrides, FAILED, cell.label, error=error)

    @classmethod
    def interrupted(cls, cell: Cell, note: str = "interrupted") -> CellOutcome:
        return cls(cell.index, cell.overrides, INTERRUPTED, cell.label, error=note)

    @classmethod
    def not_started(cls, cell: Cell) -> CellOutcome:
        return cls(cell.index, cell.overrides, NOT_STARTED, cell.label, error="never ran (the grid was interrupted)")


def stop_note(stop: BaseException) -> str:
    """How a cell stopped on purpose: Ctrl-C (KeyboardInterrupt) or SIGTERM (``SystemExit``, after
    ``train`` saved a checkpoint)."""
    if isinstance(stop, KeyboardInterrupt):
        return "interrupted (Ctrl-C)"
    return f"stopped (exit code {stop.code}); re-run to resume" if isinstance(stop, SystemExit) else str(stop)


def run_cell(cell: Cell, threads: int | None = None) -> CellOutcome:
    """Compose and train one cell; never raises for a failing run (Ctrl-C and SIGTERM stops do)."""
    import torch

    from experiments.compose import compose_config
    from experiments.locks import RunInUseError
    from experiments.store.sqlite import damaged_store_error
    from experiments.train import is_pruned, train

    if threads:
        torch.set_num_threads(threads)
    cfg = None
    try:
        cfg = compose_config(cell.overrides)
        result = train(cfg)
    except RunInUseError as error:  # another process trains it now (a worker of a grid that died): not a failure
        print(f"[mesh-sweep] {error}", file=sys.stderr)
        return CellOutcome.interrupted(cell, str(error))
    except Exception as error:  # the grid goes on; train() already marked the MLflow run FAILED
        if is_pruned(error):
            return CellOutcome(cell.index, cell.overrides, PRUNED, cell.label, error=str(error))
        if cfg is not None and (damaged := damaged_store_error(error, _store_uri(cfg))) is not None:
            print(f"error: {damaged}", file=sys.stderr)  # a store damaged while the grid ran: its one line
            return CellOutcome.failed(cell, str(damaged))
        if getattr(error, "one_line", False):  # a divergence, a full disk: its line says it all
            print(f"error: {error}", file=sys.stderr)
        else:
            traceback.print_exc()
        return CellOutcome.failed(cell, f"{type(error).__name__}: {error}".splitlines()[0])
    return CellOutcome.from_result(cell, FINISHED, result)


def _store_uri(cfg: object) -> str:
    from experiments.store.sqlite import resolve_tracking_uri

    runs_dir = Path(str(cfg.runs_dir)).expanduser()  # type: ignore[attr-defined]
    return resolve_tracking_uri(cfg.tracking.tracking_uri, runs_dir, os.environ)  # type: ignore[attr-defined]


def run_cell_reporting_stops(cell: Cell, threads: int | None = None) -> CellOutcome:
    """:func:`run_cell` for a cell that runs in a process of its own: a Ctrl-C or SIGTERM stop is
    reported as an INTERRUPTED outcome instead of raised, so the launcher hears it."""
    try:
        return run_cell(cell, threads)
    except (KeyboardInterrupt, SystemExit) as stop:
        return CellOutcome.interrupted(cell, stop_note(stop))
