"""What runs inside a submitit job: one cell, with SLURM's signals turned into a clean stop.

Requeue on SLURM is owned by submitit: a preempted or timed-out job gets ``checkpoint()``
called, which resubmits the same cell; the new job re-runs ``train`` on the same config, which
resumes ``last.ckpt`` and re-attaches to the same MLflow run. Lightning's own SLURM auto-requeue
is switched off in training (experiments/trainer.py) so the two never both requeue.
"""

from __future__ import annotations

import contextlib
import os
import signal
import sys
from collections.abc import Callable, Iterator
from typing import Any

import submitit

from sweeps.cells import Cell, CellOutcome, run_cell, run_cell_reporting_stops
from sweeps.slurm_jobs import RUNNING as SLURM_RUNNING
from sweeps.slurm_jobs import wait_for_states


class CellJob(submitit.helpers.Checkpointable):
    """A submitit job running one cell. Inherits ``checkpoint()``: on preemption or timeout,
    submitit requeues the same call, and ``train`` resumes the cell's checkpoint and MLflow run.

    In a SLURM job a cell that was stopped returns nothing: a result would end the job for the
    sweep while SLURM runs it again. USR2 (SLURM's warning before the time limit, or before a
    preemption) first stops training as SIGTERM does, at the end of the step with ``last.ckpt``
    saved (:func:`_usr2_stops_training_first`); then submitit's handler requeues the job.

    A SIGTERM is SLURM ending the job itself: a preemption (its tasks get SIGTERM, then SIGKILL
    after the partition's GraceTime), ``scancel``, ``scontrol requeue``. Training stops the same
    way, and then the job waits for SLURM to end it (:func:`_leave_the_end_to_slurm`): a job
    that exits on its own during a preemption's grace time ends FAILED, neither requeued
    (``PreemptMode=REQUEUE``) nor PREEMPTED (``CANCEL``).

    Once the cell has ended, USR2 is ignored for the rest of the job: the work is done and nothing
    is left to save. Restored to submitit's handler, a warning that came while submitit wrote the
    result would requeue a finished job; and Python resets its handlers to the default (terminate)
    as the interpreter shuts down, so one that came then would end the job FAILED (exit 140)
    after a successful run."""

    def __init__(self, stop_within_s: float | None = None) -> None:
        # After USR2, the time training gets to stop and save before submitit requeues the job
        # anyway (from the last periodic checkpoint): a stop that overran the warning would end
        # the job TIMEOUT, not requeued.
        self.stop_within_s = stop_within_s

    def __call__(self, cell: Cell, threads: int | None = None) -> CellOutcome:
        several = submitit.JobEnvironment().num_tasks > 1
        if several:
            # A port inherited from the submitting shell would be every DDP cell's: each job's
            # ranks meet at a port of their own (on SLURM Lightning's, from the job id).
            os.environ.pop("MASTER_PORT", None)
        if os.environ.get("SUBMITIT_EXECUTOR") != "slurm":
            if several:
                _join_local_tasks()
            return run_cell_reporting_stops(cell, threads)
        with _usr2_stops_training_first(self.stop_within_s) as requeue:
            try:
                return run_cell(cell, threads)
            except (KeyboardInterrupt, SystemExit) as stop:
                requeue()  # after USR2: submitit dumps checkpoint(), runs scontrol requeue and exits
                if isinstance(stop, SystemExit) and stop.code == 128 + signal.SIGTERM:
                    _leave_the_end_to_slurm()
                raise


SLURM_END_WAIT_S = 600.0  # past any usual GraceTime or KillWait; then a SIGTERM SLURM did not send ends it


def _leave_the_end_to_slurm() -> None:
    """After a SIGTERM stop (``last.ckpt`` saved, the run closed): while SLURM still calls the job
    running (a preemption's grace time, or a SIGTERM SLURM did not send), wait for SLURM to end
    it as it means to (requeue, preempt), at most :data:`SLURM_END_WAIT_S`; a job SLURM is already
    ending (``scancel``, ``scontrol requeue``, the time limit) exits at once. The next SIGTERM (the
    grace time is over) ends the process."""
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    job = submitit.JobEnvironment().job_id
    print(
        f"[mesh-sweep] stopped on SIGTERM with last.ckpt saved; SLURM ends job {job} "
        "(requeued, preempted or cancelled, as the cluster's policy says)",
        file=sys.stderr,
        flush=True,
    )

    def ending(states: dict[str, str] | None) -> bool:
        return (states or {}).get(job) not in (None, *SLURM_RUNNING)

    wait_for_states([job], ending, SLURM_END_WAIT_S, interval_s=2)


def _join_local_tasks() -> None:
    """A task of a cell that submitit's local executor started as several processes: they become
    one DDP run as srun's tasks do on SLURM. Lightning takes processes it did not create as ranks
    when ``LOCAL_RANK`` is set; they meet on 127.0.0.1 at a port drawn from the job id (as
    submitit's ``TorchDistributedEnvironment`` draws it), the same in every task of the job."""
    job = submitit.JobEnvironment()
    port = submitit.helpers.TorchDistributedEnvironment().master_port
    os.environ.update(
        MASTER_ADDR="127.0.0.1",
        MASTER_PORT=str(port),
        WORLD_SIZE=str(job.num_tasks),
        RANK=str(job.global_rank),
        LOCAL_RANK=str(job.local_rank),
        LOCAL_WORLD_SIZE=str(job.num_tasks),
        NODE_RANK="0",
    )


@contextlib.contextmanager
def _usr2_stops_training_first(stop_within_s: float | None = None) -> Iterator[Callable[[], None]]:
    """Inside a SLURM job: USR2 sends this process SIGTERM, which Lightning turns into a stop at
    the end of the step (``last.ckpt`` saved, the MLflow run KILLED with tag ``terminated``).
    Yields the call that then hands USR2 to submitit's handler (checkpoint, requeue, exit); it
    does nothing when no USR2 came. Before training has started (SIGTERM still submitit's) there
    is nothing to save: USR2 goes to submitit at once. When the block ends without an exception
    (the cell ran to its end) USR2 is ignored from then on; after one, submitit's handler is back.
    A training that has not stopped ``stop_within_s`` after USR2 is handed to submitit then."""
    usr2 = submitit.JobEnvironment._usr_sig()
    submitits = signal.getsignal(usr2)
    sigterm_before = signal.getsignal(signal.SIGTERM)
    caught: list[int] = []

    def hand_over() -> None:  # once: submitit's handler exits, and that exit passes through here again
        if caught and callable(submitits):
            submitits(caught.pop(), None)

    def stop_training(signum: int, frame: Any) -> None:
        caught.append(signum)
        if signal.getsignal(signal.SIGTERM) is sigterm_before:  # not training (yet, or any more)
            hand_over()
            return
        if stop_within_s:
            signal.signal(signal.SIGALRM, lambda *_: hand_over())
            signal.setitimer(signal.ITIMER_REAL, stop_within_s)
        os.kill(os.getpid(), signal.SIGTERM)

    signal.signal(usr2, stop_training)
    try:
        yield hand_over
    except BaseException:
        signal.signal(usr2, submitits)
        raise
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
    signal.signal(usr2, signal.SIG_IGN)
