"""The end of a grid, written once: the cells' MLflow runs made to agree with their outcomes, and
the grid's own end (``summary.json``, the parent run's description and status, the table and what
to run next). ``mesh-sweep`` ends a grid or search here when its cells are done or Ctrl-C stops
it; ``--status`` and ``--cancel`` (sweeps/status.py) end one whose ``mesh-sweep`` is gone.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TextIO

from experiments.locks import RunLock
from experiments.plan import RunPlan
from experiments.tracking import RunRecord, terminate_run
from sweeps.cells import FAILED, INTERRUPTED, CellOutcome
from sweeps.parent import ParentRun
from sweeps.progress import next_steps, results_command

EXIT_INTERRUPTED = 130  # 128 + SIGINT, as a shell reports Ctrl-C


@dataclass(frozen=True)
class GridEnd:
    """Where a grid's end is written: its parent run, folder and size, and one cell's plan (the
    experiment, the store and ``runs_dir`` every cell shares)."""

    parent: ParentRun
    plan: RunPlan
    sweep_dir: Path
    total: int  # cells (or trials) in the grid


def finish(
    end: GridEnd, outcomes: Sequence[CellOutcome], table: str, interrupted: bool, out: TextIO, say_next: bool = True
) -> None:
    """The end of a grid or search, also after Ctrl-C: :func:`conclude`, then the table and (unless
    the caller says its own, as the main job does) what to run next on ``out``."""
    conclude(end, outcomes, table, interrupted)
    print(f"\n{table}\n", file=out)
    plan = end.plan
    if say_next:
        for line in next_steps(
            plan.experiment, end.parent.experiment_id, plan.tracking_uri, plan.runs_dir, end.parent.view
        ):
            print(line, file=out)
    out.flush()


def conclude(
    end: GridEnd, outcomes: Sequence[CellOutcome], table: str, interrupted: bool = False, reason: str = "Ctrl-C"
) -> None:
    """``summary.json``, the parent's description (``table`` and the ``mesh-results`` command) and
    its final status (:meth:`ParentRun.close`)."""
    summary = end.sweep_dir / "summary.json"
    summary.write_text(json.dumps([o.__dict__ for o in outcomes], indent=2))
    command = results_command(end.plan.experiment, end.plan.tracking_uri, end.plan.runs_dir, relative=False)
    note = f"{table}\n\nThe results: `{command}`"
    try:
        end.parent.describe(note, summary)
    except Exception as failure:  # the run's status matters more than its description
        print(f"[mesh-sweep] could not describe the parent run {end.parent.run_id}: {failure}", file=sys.stderr)
    end.parent.close(outcomes, end.total, interrupted=interrupted, reason=reason)


def exit_code(outcomes: Sequence[CellOutcome], interrupted: bool) -> int:
    """130 after Ctrl-C; 1 when a cell failed or was stopped (the grid is not complete); else 0."""
    if interrupted:
        return EXIT_INTERRUPTED
    return 1 if any(o.status in (FAILED, INTERRUPTED) for o in outcomes) else 0


def close_run(client: Any, run_id: str, status: str | None, tag: str, text: str) -> bool:
    """End a cell's MLflow run with ``status`` and the ``tag`` saying why (None: tag it only);
    False, said in one line, when the store no longer has it."""
    from mlflow.exceptions import MlflowException

    try:
        if status is None:
            client.set_tag(run_id, tag, text)
        else:
            terminate_run(client, run_id, status, tag, text)
    except MlflowException as error:
        print(f"[mesh-sweep] could not close MLflow run {run_id}: {str(error).splitlines()[0]}", file=sys.stderr)
        return False
    return True


def settle_run(tracking_uri: str, run_dir: Path, outcome: CellOutcome) -> None:
    """Make the cell's MLflow run agree with its outcome when the cell's process could not close
    it (a worker killed by a signal leaves it RUNNING): FAILED with the ``error`` tag, or KILLED
    with the ``interrupted`` tag. A run its process closed is left as it is; one stopped on
    purpose elsewhere (KILLED with ``interrupted``: ``mesh-sweep --cancel`` from another terminal
    while this sweep waits on SLURM) makes a failed outcome (its job "died") an interrupted one."""
    import mlflow
    from mlflow.exceptions import MlflowException

    id_file = run_dir / RunRecord.ID_FILE
    if outcome.status not in (FAILED, INTERRUPTED) or not id_file.exists():
        return
    if RunLock.holder(run_dir):  # another process trains the run (a cell refused as "in use", say)
        return
    run_id = id_file.read_text().strip()
    outcome.run_id = outcome.run_id or run_id
    outcome.run_dir = outcome.run_dir or str(run_dir)
    client = mlflow.MlflowClient(tracking_uri)
    try:
        run = client.get_run(run_id)
    except MlflowException as error:  # the run is gone from the store: nothing to settle
        print(f"[mesh-sweep] could not close MLflow run {run_id}: {str(error).splitlines()[0]}", file=sys.stderr)
        return
    if run.info.status != "RUNNING":
        stopped = run.data.tags.get("interrupted")
        if outcome.status == FAILED and run.info.status == "KILLED" and stopped:
            outcome.status, outcome.error = INTERRUPTED, stopped
        return
    if outcome.status == FAILED:
        close_run(client, run_id, "FAILED", "error", outcome.error or "failed")
    else:
        close_run(client, run_id, "KILLED", "interrupted", outcome.error or "interrupted")
