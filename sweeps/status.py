"""``mesh-sweep NAME [overrides] --status`` and ``--cancel``: where a grid stands, and stopping it.

The grid is found as running it finds it: the same NAME and overrides give the same cells, hence
the same key and sweep folder (sweeps/grid.py). Nothing trains: the cells' configs are composed
and checked, then the store and SLURM are asked. A cell is

* ``finished``: its run wrote ``result.json`` (or its MLflow run is FINISHED);
* ``pending`` / ``running``: its SLURM job (the grid's ``jobs.json``, sweeps/slurm_jobs.py) is queued /
  holds an allocation; off SLURM, a RUNNING run whose process still holds the run's lock
  (experiments/locks.py) is running;
* ``failed`` / ``killed``: its MLflow run is FAILED / KILLED, or its job ended without a run;
* ``not started``: no run and no job;

with its last logged step and latest validation loss; then one line of counts.

Settling. A run left RUNNING by a process that is gone is closed here, saying why in a tag: a
job SLURM ended outright (scancel, the time limit, a preemption: KILLED, tag ``terminated``; out
of memory, a node failure, a crash: FAILED, tag ``error``), or, off SLURM, a process that no
longer holds its run's lock (KILLED, tag ``interrupted``). Once every cell has ended, a parent run
still RUNNING (a detached grid, or a ``mesh-sweep`` killed outright) is closed as the end of a
grid closes it (sweeps/parent.py): FINISHED, FAILED if a cell failed, else KILLED.

``--cancel`` scancels the grid's queued and running jobs, waits for them to end (at most
:data:`CANCEL_WAIT_S`), closes their runs KILLED (tag ``interrupted``: cancelled) and the parent
KILLED. Re-running the grid continues it: finished cells are skipped, stopped ones resume from
``last.ckpt``. A grid that ran on this machine has no jobs to cancel (Ctrl-C in its terminal
stops it): there ``--cancel`` settles the runs whose process is gone and closes the parent when
no cell still runs; while one does, it names the PID that runs it and exits 1.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Collection, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TextIO

from experiments.locks import RunLock
from experiments.plan import RunPlan
from experiments.store.check import reading_only
from experiments.store.sqlite import is_opened_read_only, peek_run
from experiments.tracking import STOP_TAGS, RunRecord
from sweeps.cells import FAILED, FINISHED, INTERRUPTED, NOT_STARTED, PENDING, RUNNING, Cell, CellOutcome
from sweeps.closing import GridEnd, close_run, conclude
from sweeps.grid import SweepError, grid_cells, grid_key, read_request, sweep_dir_for
from sweeps.parent import DETACHED_TAG, ID_FILE, ParentRun, grids_in
from sweeps.progress import grid_command, summary_table
from sweeps.slurm_jobs import (
    COMPLETING,
    GONE,
    KILLED_BY,
    cancel,
    job_states,
    live,
    read_jobs,
    wait_for_states,
)
from sweeps.slurm_jobs import PENDING as SLURM_PENDING
from sweeps.slurm_jobs import RUNNING as SLURM_RUNNING

CANCEL_WAIT_S = 60.0  # after scancel: SLURM's KillWait between SIGTERM and SIGKILL, and slack
# A cell's state, in the order the count line gives them, and the outcome each stands for in the
# parent's counts and summary.
# A cell's state (cells.py's vocabulary) and its word in the table, in the order the count line
# gives them; a running or pending cell counts as INTERRUPTED in the parent's summary.
STATES = {
    FINISHED: "finished",
    RUNNING: "running",
    PENDING: "pending",
    FAILED: "failed",
    INTERRUPTED: "killed",
    NOT_STARTED: "not started",
}
ENDED = (FINISHED, FAILED, INTERRUPTED)
CANCELLED = "cancelled (mesh-sweep --cancel)"


@dataclass
class Grid:
    """A grid as a run of it is found: its cells, their plans, its key and folder."""

    name: str
    arguments: list[str]
    cells: list[Cell]
    plans: list[RunPlan]
    key: str
    sweep_dir: Path

    @property
    def tracking_uri(self) -> str:
        return self.plans[0].tracking_uri


@dataclass
class CellState:
    cell: Cell
    plan: RunPlan
    state: str = NOT_STARTED  # one of STATES
    step: int | None = None  # the last step its run logged
    val_loss: float | None = None  # the latest validation loss of its main set
    run_id: str | None = None
    job: str | None = None  # its SLURM job
    job_state: str | None = None  # SLURM's word; None without a job, or where SLURM does not answer
    note: str = ""

    def outcome(self) -> CellOutcome:
        """For the parent's counts and summary table."""
        c = self.cell
        return CellOutcome(
            c.index,
            c.overrides,
            self.state if self.state in ENDED or self.state == NOT_STARTED else INTERRUPTED,
            c.label,
            val_loss=self.val_loss,
            run_id=self.run_id,
            run_dir=str(self.plan.run_dir),
            error=self.note or None,
            steps=self.step,
        )


def find_grid(name: str, arguments: Sequence[str]) -> Grid:
    """The grid ``mesh-sweep NAME ARGUMENTS`` runs; SweepError when it has no runs at all."""
    launch, cell_overrides, base = read_request(name, arguments)
    if base.search.n_trials > 0:
        raise SweepError(f"--status and --cancel are for grids; {name} is an Optuna search (re-running it resumes)")
    cells, plans = grid_cells(name, cell_overrides, launch)
    key = grid_key(name, plans)
    grid = Grid(name, list(arguments), cells, plans, key, sweep_dir_for(plans[0], key))
    ran = (grid.sweep_dir / ID_FILE).exists() or any(
        p.result_file.exists() or (p.run_dir / RunRecord.ID_FILE).exists() for p in plans
    )
    if not ran:
        others = grids_in(grid.sweep_dir.parent, name)
        if others:
            listed = "; ".join(f"`{command} --status`" if command else f"key {k}" for k, command in others[:5])
            raise SweepError(
                f"no runs of this grid ({len(cells)} cells, key {key}) in {grid.sweep_dir.parent.parent}, "
                f"but {len(others)} other {name} grid(s) ran there (newest first): {listed}"
            )
        raise SweepError(
            f"no runs of this grid yet ({len(cells)} cells, key {key}, in {grid.sweep_dir.parent.parent}): "
            f"start it with `{grid_command(name, arguments)}`"
        )
    return grid


def survey_and_settle(grid: Grid, by: str, cancelled: Collection[str] = ()) -> list[CellState]:
    """Every cell's state, settling the runs whose process is gone (``by`` says who found it);
    the runs of the jobs in ``cancelled`` are closed as cancelled."""
    jobs = read_jobs(grid.sweep_dir)
    slurm = job_states(jobs[c.index] for c in grid.cells if c.index in jobs)
    client = None  # MLflow only for a cell without result.json: a finished grid is read from its files
    if any(not p.result_file.exists() and (p.run_dir / RunRecord.ID_FILE).exists() for p in grid.plans):
        import mlflow

        client = mlflow.MlflowClient(grid.tracking_uri)
    states = []
    for cell, plan in zip(grid.cells, grid.plans, strict=True):
        state = CellState(cell, plan, job=jobs.get(cell.index))
        if state.job is not None and slurm is not None:
            state.job_state = slurm.get(state.job)
        _read_cell(state, client, by, cancelled)
        states.append(state)
    return states


def _read_cell(s: CellState, client: Any, by: str, cancelled: Collection[str]) -> None:
    if s.plan.result_file.exists():
        result = json.loads(s.plan.result_file.read_text())
        s.state, s.step, s.val_loss, s.run_id = (
            FINISHED,
            result.get("steps"),
            result.get("val_loss"),
            result["run_id"],
        )
        return
    run = _run_of(client, s.plan)
    if run is not None:
        s.run_id = run.info.run_id
        s.step, s.val_loss = _progress(client, run, s.plan)
        s.note = next((run.data.tags[t] for t in STOP_TAGS if t in run.data.tags), "")
    if s.job_state in SLURM_PENDING:
        s.state = PENDING
        return
    if s.job_state in SLURM_RUNNING or s.job_state == COMPLETING:
        s.state = RUNNING
        return
    status = run.info.status if run is not None else None
    if status == "RUNNING" and is_opened_read_only(s.plan.tracking_uri):
        s.state, s.note = RUNNING, "as the read-only store says"
    elif status == "RUNNING":
        _settle(s, client, by, cancelled)
    elif status in ("FINISHED", "FAILED", "KILLED"):
        s.state = {"FINISHED": FINISHED, "FAILED": FAILED, "KILLED": INTERRUPTED}[status]
        if status == "KILLED" and s.job in cancelled:  # its process closed it on scancel's SIGTERM
            _close(s, client, None, "interrupted", f"{CANCELLED}, SLURM job {s.job}; re-run the grid to resume")
    elif s.job is not None and s.job_state is not None:  # the job ended before its run was opened
        s.state = INTERRUPTED if s.job_state in KILLED_BY or s.job_state == GONE or s.job in cancelled else FAILED
        s.note = f"{CANCELLED} before it started" if s.job in cancelled else f"{_ended(s.job_state)} before training"


def _settle(s: CellState, client: Any, by: str, cancelled: Collection[str]) -> None:
    """A RUNNING run whose job has ended, or whose process here is gone: close it, saying why.
    A process that holds the run's lock runs it, whatever an earlier job of the cell says."""
    at = f"at step {s.step}" if s.step is not None else "before its first step"
    if holder := RunLock.holder(s.plan.run_dir):
        s.state, s.note = RUNNING, f"PID {holder}"
    elif s.job is not None and s.job_state is None:
        s.state, s.note = RUNNING, "as MLflow says: SLURM does not answer here"
    elif s.job in cancelled:
        _close(s, client, "KILLED", "interrupted", f"{CANCELLED}, SLURM job {s.job} {at}; re-run the grid to resume")
    elif s.job is not None and (s.job_state in KILLED_BY or s.job_state == GONE):
        text = f"SLURM job {s.job} {_ended(s.job_state)} {at} (found by {by}); re-run the grid to resume"
        _close(s, client, "KILLED", "terminated", text)
    elif s.job is not None:
        _close(s, client, "FAILED", "error", f"SLURM job {s.job} ended {s.job_state} {at} (found by {by})")
    else:
        text = f"its process is gone {at} (found by {by}); re-run the grid to resume"
        _close(s, client, "KILLED", "interrupted", text)


def _ended(job_state: str | None) -> str:
    """How a job ended, in words: ``ended CANCELLED``, or that SLURM keeps no record of it."""
    if job_state == GONE:
        return "ended unrecorded (no squeue or sacct record: cancelled while pending, or purged)"
    return f"ended {job_state}"


def _close(s: CellState, client: Any, status: str | None, tag: str, text: str) -> None:
    """Close the cell's run with ``status`` and the ``tag`` saying why (None: tag it only)."""
    if not close_run(client, s.run_id, status, tag, text):
        return
    s.state = FAILED if status == "FAILED" else INTERRUPTED
    s.note = text


def _run_of(client: Any, plan: RunPlan) -> Any:
    """The cell's MLflow run (``<run_dir>/mlflow_run_id``); None when it has none, or it is gone."""
    from mlflow.exceptions import MlflowException

    id_file = plan.run_dir / RunRecord.ID_FILE
    if client is None or not id_file.exists():
        return None
    try:
        return client.get_run(id_file.read_text().strip())
    except MlflowException:
        return None


def _progress(client: Any, run: Any, plan: RunPlan) -> tuple[int | None, float | None]:
    """(the last step the run logged, its latest validation loss of the cell's corpus)."""
    val = f"val/{plan.data.corpus}/loss"
    steps = [m.step for key in ("train/loss", val) for m in client.get_metric_history(run.info.run_id, key)]
    return max(steps, default=None), run.data.metrics.get(val)


def counts_line(states: Sequence[CellState]) -> str:
    """``4 cells: 2 finished, 1 running, 1 pending``."""
    counts = [f"{n} {word}" for state, word in STATES.items() if (n := sum(s.state == state for s in states))]
    return f"{len(states)} cells: {', '.join(counts)}"


def show(grid: Grid, states: Sequence[CellState], parent: str, out: TextIO) -> None:
    """A line on the grid, one per cell, the counts."""
    slurm = any(s.job for s in states)
    rows = [["#", "cell", "state", "step", "val loss", *(["SLURM job"] if slurm else []), "note"]]
    for s in states:
        step = "-" if s.step is None else str(s.step)
        loss = "-" if s.val_loss is None else f"{s.val_loss:.4f}"
        job = [" ".join(filter(None, [s.job, s.job_state])) or "-"] if slurm else []
        rows.append([str(s.cell.index + 1), s.cell.label, STATES[s.state], step, loss, *job, s.note])
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]) - 1)]
    right = {0, 3, 4}  # numbers
    print(f"{grid.name}: {len(states)} cells · sweep {grid.key} · {parent}", file=out)
    for row in rows:
        cols = [c.rjust(w) if i in right else c.ljust(w) for i, (c, w) in enumerate(zip(row, widths, strict=False))]
        print(("  " + "  ".join([*cols, row[-1]])).rstrip(), file=out)
    print(counts_line(states), file=out)
    out.flush()


def _parent(grid: Grid) -> tuple[ParentRun, Any] | tuple[None, None]:
    found = ParentRun.find(grid.tracking_uri, grid.sweep_dir)
    return found if found is not None else (None, None)


def _ended_parent(grid: Grid) -> str | None:
    """The parent's line where the store's file says it has ended (FINISHED, FAILED, KILLED), read
    without MLflow; None where it runs, is not found so, or the store is not a sqlite file."""
    id_file = grid.sweep_dir / ID_FILE
    if not id_file.exists():
        return None
    run_id = id_file.read_text().strip()
    peeked = peek_run(grid.tracking_uri, run_id, DETACHED_TAG)
    if peeked is None or peeked[0] not in ("FINISHED", "FAILED", "KILLED"):
        return None
    return f"parent run {run_id} {peeked[0]}" + (" (detached)" if peeked[1] is not None else "")


def _describe(parent: ParentRun | None, run: Any) -> str:
    if parent is None:
        return "no parent run"
    status = parent.client.get_run(parent.run_id).info.status
    return f"parent run {parent.run_id} {status}" + (" (detached)" if DETACHED_TAG in run.data.tags else "")


def _conclude(grid: Grid, parent: ParentRun, states: Sequence[CellState], cancelled: bool = False) -> None:
    """Close the parent as the end of the grid (cancelled: KILLED, unless every cell finished)."""
    outcomes = [s.outcome() for s in states]
    stopped = cancelled and any(s.state != FINISHED for s in states)
    table = summary_table(grid.name, outcomes)
    conclude(GridEnd(parent, grid.plans[0], grid.sweep_dir, len(states)), outcomes, table, stopped, CANCELLED)


def grid_status(name: str, arguments: Sequence[str], out: TextIO | None = None) -> int:
    """``--status``: print where every cell stands (settling what needs it); 0."""
    out = out or sys.stdout
    with reading_only():  # --status reads a store it cannot write, settling nothing
        grid = find_grid(name, arguments)
    states = survey_and_settle(grid, "mesh-sweep --status")
    if is_opened_read_only(grid.tracking_uri):
        show(grid, states, _ended_parent(grid) or "parent run as the read-only store says", out)
        print("the store is read-only: runs whose process is gone are shown as it says, not settled", file=out)
        return 0
    if (ended_parent := _ended_parent(grid)) is not None:  # nothing to close: MLflow is not opened
        show(grid, states, ended_parent, out)
        return 0
    parent, run = _parent(grid)
    ended = parent is not None and run.info.status == "RUNNING" and all(s.state in ENDED for s in states)
    if ended:
        _conclude(grid, parent, states)
    show(grid, states, _describe(parent, run), out)
    if ended:
        again = "" if all(s.state == FINISHED for s in states) else "; re-running the grid continues it"
        print(f"every cell has ended: the parent run is closed{again}", file=out)
    return 0


def cancel_grid(name: str, arguments: Sequence[str], out: TextIO | None = None) -> int:
    """``--cancel``: cancel the grid's queued and running SLURM jobs and close their runs and the
    parent KILLED; 0. Off SLURM, see the module's docstring (1 while a cell still runs here)."""
    out = out or sys.stdout
    grid = find_grid(name, arguments)
    jobs = read_jobs(grid.sweep_dir)
    targets: list[str] = []
    if jobs:
        states = job_states(jobs.values())
        if states is None:
            raise SweepError("this grid's cells are SLURM jobs and SLURM does not answer here (no squeue)")
        if any(state == COMPLETING for state in states.values()):
            # A job being requeued passes through COMPLETING on its way back to PENDING: ask again
            # once it is through, or it would escape the cancel and run again.
            states = _after_completing(list(jobs.values()), states)
        targets = sorted(job for job, state in states.items() if live(state))
        if targets:
            if problem := cancel(targets):
                print(f"[mesh-sweep] scancel: {problem}", file=sys.stderr)
            _wait_ended(targets)
    states = survey_and_settle(grid, "mesh-sweep --cancel", targets)
    parent, run = _parent(grid)
    running = [s for s in states if s.state in (RUNNING, PENDING)]
    if parent is not None and run.info.status == "RUNNING" and not running:
        _conclude(grid, parent, states, cancelled=True)
    if targets:
        print(f"[mesh-sweep] cancelled {len(targets)} SLURM job(s): {' '.join(targets)}", file=out)
    elif jobs:
        print("[mesh-sweep] nothing to cancel: no SLURM job of this grid is queued or running", file=out)
    else:
        print(
            "[mesh-sweep] no SLURM jobs to cancel: a grid on this machine stops with Ctrl-C in its terminal", file=out
        )
    show(grid, states, _describe(parent, run), out)
    if running:
        where = ", ".join(f"cell {s.cell.index + 1} ({s.note or f'SLURM job {s.job} {s.job_state}'})" for s in running)
        how = "wait for SLURM to end them" if targets else "stop the mesh-sweep that runs them (Ctrl-C)"
        print(f"still running: {where}; {how}, then --cancel again", file=out)
        return 1
    if any(s.state != FINISHED for s in states):
        print(f"re-run the grid to continue it: {grid_command(name, arguments)}", file=out)
    return 0


def _after_completing(jobs: Sequence[str], states: dict[str, str]) -> dict[str, str]:
    """SLURM's states of ``jobs`` once none is COMPLETING (at most CANCEL_WAIT_S)."""
    through = wait_for_states(jobs, lambda now: now is not None and COMPLETING not in now.values(), CANCEL_WAIT_S)
    return through or states


def _wait_ended(jobs: Sequence[str]) -> None:
    """Until SLURM says none of ``jobs`` is queued, running or completing (at most CANCEL_WAIT_S)."""
    wait_for_states(
        jobs, lambda now: not any(live(state) or state == COMPLETING for state in (now or {}).values()), CANCEL_WAIT_S
    )
