"""Where the cells of a grid run: one small class per launcher, behind one interface.

Each launcher is a dataclass whose fields are its settings; ``launcher=<name>`` picks the file
``sweeps/conf/launcher/<name>.yaml``, which is typed by that class, so the composed config *is*
the launcher object (``OmegaConf.to_object``) and nothing dispatches on a name.

Requeue on SLURM is owned by submitit: a preempted or timed-out job gets ``checkpoint()``
called, which resubmits the same cell; the new job re-runs ``train`` on the same config, which
resumes ``last.ckpt`` and re-attaches to the same MLflow run. Lightning's own SLURM auto-requeue
is switched off in training (experiments/trainer.py) so the two never both requeue.
"""

from __future__ import annotations

import contextlib
import multiprocessing
import multiprocessing.connection
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import submitit

from mesh_model import ConfigError
from sweeps.cells import INTERRUPTED, Cell, CellOutcome, run_cell, run_cell_reporting_stops, stop_note
from sweeps.jobs import PREEMPTED, job_states, record_jobs, wait_for_states
from sweeps.jobs import RUNNING as SLURM_RUNNING
from sweeps.packing import GB, CellNeeds, Packing, choose_packing, usable_cores

if TYPE_CHECKING:
    from experiments.config import TrainerConfig
    from experiments.plan import MemoryLimit, RunPlan
    from sweeps.config import ResourcesConfig


class LaunchError(RuntimeError):
    """A launcher cannot start on this machine; the message is one line."""


OnStart = Callable[[Cell], None]


def no_start(cell: Cell) -> None:
    """The default ``on_start``: nobody listens."""


@dataclass
class Launcher:
    """The interface. ``launch`` yields one outcome per cell, in the order cells finish, and calls
    ``on_start(cell)`` when a cell starts (for a batch scheduler: when it is submitted)."""

    @property
    def name(self) -> str:
        """The option that selects it (``launcher=<name>``)."""
        return next(name for name, cls in LAUNCHERS.items() if type(self) is cls)

    def validate(self) -> None:
        """Refuse bad settings in one line (a ConfigError)."""

    def check(self, folder: Path, resources: ResourcesConfig) -> None:
        """Fail fast, before anything is logged, when this launcher cannot run here."""

    @property
    def detaches(self) -> bool:
        """Whether its cells run without this process (``mesh-sweep --detach``, :meth:`submit`)."""
        return False

    @property
    def concurrency(self) -> int:
        """How many cells run at once (an Optuna search asks for that many trials per round)."""
        return 1

    def cell_overrides(self, resources: ResourcesConfig) -> list[str]:
        """Overrides every cell needs to use what ``resources`` asks for."""
        return []

    def memory_limit(self, resources: ResourcesConfig) -> MemoryLimit | None:
        """What a cell's training step must fit in where the cell runs; None: this machine's
        memory, measured (every launcher that runs cells here)."""
        return None

    def check_trainer(self, trainer: TrainerConfig, resources: ResourcesConfig) -> None:
        """Refuse (one line) a cell whose trainer contradicts what ``resources`` asks for."""

    def prepare(self, plans: Sequence[RunPlan]) -> str | None:
        """Decide, before anything is logged, how the runs of ``plans`` will share this machine;
        returns a line saying so (None: nothing to say). Refuses (LaunchError) what cannot fit."""
        return None

    def launch(
        self, cells: Sequence[Cell], resources: ResourcesConfig, folder: Path, on_start: OnStart = no_start
    ) -> Iterator[CellOutcome]:
        """Run the cells; ``folder`` is ``<sweep dir>/submitit`` (submitit's files)."""
        raise NotImplementedError

    def submit(self, cells: Sequence[Cell], resources: ResourcesConfig, folder: Path) -> list[str]:
        """Hand the cells to a batch scheduler and return their job ids, in order, without waiting
        for them (only where :attr:`detaches`)."""
        raise LaunchError(f"launcher={self.name} runs its cells in this process or its children")


@dataclass
class LocalLauncher(Launcher):
    """Sequentially, in this process: imports and the tokenized corpus are paid for once."""

    def launch(
        self, cells: Sequence[Cell], resources: ResourcesConfig, folder: Path, on_start: OnStart = no_start
    ) -> Iterator[CellOutcome]:
        yield from self.launch_with_threads(cells, None, on_start)

    def launch_with_threads(
        self, cells: Sequence[Cell], threads: int | None, on_start: OnStart = no_start
    ) -> Iterator[CellOutcome]:
        """Each cell in turn, with ``threads`` torch threads (None: leave the process's setting)."""
        for cell in cells:
            on_start(cell)
            try:
                outcome = run_cell(cell, threads)
            except (KeyboardInterrupt, SystemExit) as stop:  # Ctrl-C: this cell stops, none other starts
                yield CellOutcome.interrupted(cell, stop_note(stop))
                raise
            yield outcome


@dataclass
class PackedLauncher(Launcher):
    """The local default: as many cells at once, with as many torch threads each, as finish the
    grid soonest on this machine without running out of memory (:mod:`sweeps.packing`).
    ``workers`` and ``threads`` override the choice. One cell at a time runs in this process
    (imports and corpus paid once); more run in processes of their own (:func:`run_in_processes`)."""

    workers: int | None = None
    threads: int | None = None

    def __post_init__(self) -> None:
        self._packing: Packing | None = None

    def validate(self) -> None:
        for name in ("workers", "threads"):
            value = getattr(self, name)
            if value is not None and (not isinstance(value, int) or isinstance(value, bool) or value < 1):
                raise ConfigError(f"launcher.{name}", value, "must be an integer >= 1, or null to choose")

    @property
    def concurrency(self) -> int:
        if self._packing is not None:
            return self._packing.workers
        return self.workers or usable_cores()

    @property
    def in_processes(self) -> bool:
        """Whether cells run in processes of their own even one at a time."""
        return False

    def prepare(self, plans: Sequence[RunPlan]) -> str | None:
        from experiments.plan import available_memory

        found = available_memory("cpu")
        available = found[0] if found else None
        needs = [CellNeeds(plan.memory.total, plan.alone) for plan in plans]
        packing = choose_packing(needs, usable_cores(), available, self.workers, self.threads)
        need = min(packing.workers, len(needs)) * packing.per_cell_bytes  # 0 when not estimated
        if available is not None and need > available:
            raise LaunchError(
                f"launcher.workers={packing.workers} is too many: {min(packing.workers, len(needs))} cells at once "
                f"need about {need / GB:.1f} GB but {available / GB:.1f} GB are available; "
                "lower launcher.workers, or leave it out to choose"
            )
        self._packing = packing
        return f"packing: {packing.describe(len(plans))}"

    def launch(
        self, cells: Sequence[Cell], resources: ResourcesConfig, folder: Path, on_start: OnStart = no_start
    ) -> Iterator[CellOutcome]:
        packing = self._packing or Packing(self.workers or 1, self.threads, "not prepared")
        if packing.workers == 1 and not self.in_processes:
            yield from LocalLauncher().launch_with_threads(cells, packing.threads, on_start)
        else:
            yield from run_in_processes(cells, packing.workers, packing.threads, on_start)


@dataclass
class ParallelLauncher(PackedLauncher):
    """``workers`` spawned worker processes share the machine, even when one
    (:func:`run_in_processes`): a worker that dies fails its own cell and no other. ``threads``
    defaults to the usable cores // workers."""

    workers: int | None = 2

    @property
    def in_processes(self) -> bool:
        return True


@dataclass
class WorkersLauncher(Launcher):
    """A launcher that runs ``workers`` cells at once on this machine, cpus_per_task // workers
    torch threads each."""

    workers: int = 2

    def validate(self) -> None:
        if not isinstance(self.workers, int) or isinstance(self.workers, bool) or self.workers < 1:
            raise ConfigError("launcher.workers", self.workers, "must be an integer >= 1")

    @property
    def concurrency(self) -> int:
        return self.workers


# ---------------------------------------------------------------- a small process pool
#
# Not concurrent.futures.ProcessPoolExecutor: when one of its workers dies (SIGKILL, the OOM
# killer) the whole pool is "broken", every pending future fails and the surviving workers are
# terminated in the middle of their runs. Here each worker process trains one cell at a time,
# sent through its own pipe, and sends the CellOutcome back; a worker that ends while it holds a
# cell failed that cell alone, and a new worker takes the cells still queued. A worker runs cell
# after cell, so its imports (torch, Lightning, MLflow: seconds each time) are paid once.

# After Ctrl-C: how long the cells get to stop on their own (they got the terminal's SIGINT
# too), then after SIGINT, SIGTERM and SIGKILL sent by us. A second Ctrl-C kills them at once.
STOP_GRACE_S = (10.0, 10.0, 10.0, 5.0)
EXIT_AFTER_OUTCOME_S = 60.0  # a worker told to exit that does not is killed


@dataclass
class _Worker:
    process: Any  # multiprocessing's SpawnProcess
    pipe: Any  # the parent's end of a duplex pipe
    cell: Cell | None = None  # the cell it trains now
    outcome: CellOutcome | None = None  # what it sent back for ``cell``
    closed: bool = False  # the pipe reached EOF
    told_to_exit_at: float | None = None


def _worker_process(pipe: Any, threads: int | None) -> None:
    """The body of a worker process: train each cell it is sent, send back what became of it;
    stop at None, or after a cell that was stopped (Ctrl-C, SIGTERM)."""
    while (cell := pipe.recv()) is not None:
        outcome = run_cell_reporting_stops(cell, threads)
        pipe.send(outcome)
        if outcome.status == INTERRUPTED:
            break
    pipe.close()


def _start(context: Any, number: int, threads: int | None) -> _Worker:
    parent, child = context.Pipe(duplex=True)
    process = context.Process(target=_worker_process, args=(child, threads), name=f"mesh-worker-{number}")
    process.start()
    child.close()  # the worker holds the only other end: its death is EOF here
    return _Worker(process, parent)


def _assign(worker: _Worker, cell: Cell | None, on_start: OnStart = no_start) -> None:
    """Give ``worker`` its next cell, or None: exit."""
    worker.cell, worker.outcome = cell, None
    if cell is None:
        worker.told_to_exit_at = time.monotonic()
    try:
        worker.pipe.send(cell)
    except (BrokenPipeError, OSError):  # it died: _wait finds it exited
        worker.closed = True
    if cell is not None:
        on_start(cell)


def _receive(worker: _Worker) -> None:
    """Read the worker's outcome if it is there (never blocks)."""
    while not worker.closed and worker.outcome is None:
        try:
            if not worker.pipe.poll():
                return
            worker.outcome = worker.pipe.recv()
        except (EOFError, OSError):
            worker.closed = True


def _wait(workers: Sequence[_Worker], timeout: float | None) -> list[_Worker]:
    """Wait until a worker sends an outcome or its process exits (or ``timeout``); read outcomes.
    Returns the workers whose process has exited, joined."""
    waitables = [w.process.sentinel for w in workers]
    waitables += [w.pipe for w in workers if not w.closed]
    multiprocessing.connection.wait(waitables, timeout)
    for worker in workers:
        _receive(worker)
    exited = [w for w in workers if w.process.exitcode is not None]
    for worker in exited:
        worker.process.join()
        _receive(worker)  # sent just before exiting
        worker.pipe.close()
        worker.closed = True
    return exited


def _died(exitcode: int) -> str:
    if exitcode < 0:
        return f"worker died (signal {-exitcode})"
    return f"worker exited with code {exitcode}"


def run_in_processes(
    cells: Sequence[Cell], workers: int, threads: int | None, on_start: OnStart = no_start
) -> Iterator[CellOutcome]:
    """Run the cells in at most ``workers`` spawned worker processes, one cell at a time each, in
    grid order (``on_start(cell)`` as each is sent to its worker); yield each outcome as it
    arrives. A worker that dies fails its own cell and is
    replaced while cells are queued. On Ctrl-C (raised while waiting here, or thrown in at a
    yield), no further cell starts, the running ones are stopped (:data:`STOP_GRACE_S`) and
    reported, then KeyboardInterrupt is raised again."""
    context = multiprocessing.get_context("spawn")
    queue = list(cells)
    pool: list[_Worker] = []
    started = 0
    try:
        while queue or any(w.cell is not None for w in pool):
            for worker in pool:  # idle workers take the next cell
                if worker.cell is None and worker.told_to_exit_at is None and not worker.closed:
                    _assign(worker, queue.pop(0) if queue else None, on_start)
            while queue and len(pool) < workers:
                pool.append(_start(context, started, threads))
                started += 1
                _assign(pool[-1], queue.pop(0), on_start)
            lingering = [w for w in pool if w.told_to_exit_at is not None]
            for worker in lingering:
                if time.monotonic() - worker.told_to_exit_at > EXIT_AFTER_OUTCOME_S:
                    worker.process.kill()
            exited = _wait(pool, 5.0 if lingering else None)
            for worker in pool:
                if worker.cell is not None and worker.outcome is not None:
                    outcome, worker.cell = worker.outcome, None
                    if outcome.status == INTERRUPTED:  # it stops after a stopped cell
                        worker.told_to_exit_at = time.monotonic()
                    yield outcome
            for worker in exited:
                pool.remove(worker)
                if worker.cell is not None:  # died holding a cell
                    yield CellOutcome.failed(worker.cell, _died(worker.process.exitcode))
        for worker in pool:
            if worker.told_to_exit_at is None:
                _assign(worker, None)
        while pool:
            for worker in _wait(pool, EXIT_AFTER_OUTCOME_S):
                pool.remove(worker)
            for worker in pool:
                if (
                    worker.told_to_exit_at is not None
                    and time.monotonic() - worker.told_to_exit_at > EXIT_AFTER_OUTCOME_S
                ):
                    worker.process.kill()
    except KeyboardInterrupt:
        yield from _stop([w for w in pool if w.cell is not None], pool)
        raise
    finally:
        for worker in pool:  # closed without being drained (an error, or close()): leave no orphan
            if worker.process.is_alive():
                worker.process.kill()
                worker.process.join()


def _stop(running: list[_Worker], pool: list[_Worker]) -> Iterator[CellOutcome]:
    """Stop the workers after Ctrl-C and report each running cell: what its worker sent (FINISHED
    if it got there, INTERRUPTED if it stopped on the signal) or INTERRUPTED."""
    steps = zip((None, signal.SIGINT, signal.SIGTERM, signal.SIGKILL), STOP_GRACE_S, strict=True)
    if running:
        print(
            f"[mesh-sweep] Ctrl-C: stopping {len(running)} running cell(s), starting no more (Ctrl-C again kills them)",
            file=sys.stderr,
            flush=True,
        )
    for worker in pool:  # idle ones exit at once; busy ones after their cell
        if worker.cell is None:
            _assign(worker, None)
    try:
        for sent, grace in steps:
            alive = [w for w in pool if w.process.exitcode is None]
            if not alive:
                break
            for worker in alive:
                if sent is not None:
                    os.kill(worker.process.pid, sent)
            deadline = time.monotonic() + grace
            while any(w.process.exitcode is None for w in alive) and time.monotonic() < deadline:
                _wait([w for w in alive if w.process.exitcode is None], max(0.0, deadline - time.monotonic()))
    except KeyboardInterrupt:  # a second Ctrl-C: no more waiting
        for worker in pool:
            if worker.process.exitcode is None:
                worker.process.kill()
    for worker in pool:
        worker.process.join()
        _wait([worker], 0)
    for worker in running:
        if worker.outcome is not None:
            yield worker.outcome
        else:
            yield CellOutcome.interrupted(worker.cell, f"interrupted ({_died(worker.process.exitcode)})")
    pool.clear()


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


def _job_outcome(job: Any, cell: Cell) -> CellOutcome:
    """Wait for ``job``; a job that ends without a result (killed, out of memory...) fails its cell.
    A job of several tasks (DDP ranks) reports what its first task, global rank 0, returned."""
    try:
        return job.task(0).result()
    except Exception as error:
        return CellOutcome.failed(cell, _job_death(job, error))


def _job_death(job: Any, error: Exception) -> str:
    process = getattr(job, "_process", None)  # submitit's local job: its controller process
    code = process.poll() if process is not None else None
    if code is not None and code < 0:
        return f"{_died(code)}, job {job.job_id}"
    if isinstance(error, submitit.core.utils.UncompletedJobError):
        state = getattr(job, "state", "") if process is None else ""  # SLURM's word (OUT_OF_MEMORY...)
        return f"worker died (job {job.job_id} ended without a result{f', state {state}' if state else ''})"
    message = f"{type(error).__name__}: {error}".strip().splitlines()[-1]
    return f"job {job.job_id}: {message}"


COLLECT_POLL_S = 1.0  # how often submitit's jobs are looked at (a result file, a process)
SCHEDULER_POLL_S = 30.0  # how often SLURM itself is asked about the jobs not done


def _collect(
    jobs: Sequence[Any],
    cells: Sequence[Cell],
    stop_wait_s: float = 0.0,
    scheduler_states: Callable[[list[str]], dict[str, str] | None] | None = None,
) -> Iterator[CellOutcome]:
    """Each job's outcome as it ends; one job's death does not stop the others being collected.

    submitit counts a job PREEMPTED as not yet done (SLURM may requeue it), so a job preempted
    and cancelled (``PreemptMode=CANCEL``) would be waited for forever: ``scheduler_states``
    (SLURM's word, asked every :data:`SCHEDULER_POLL_S`) ends it, its cell stopped.
    On Ctrl-C the jobs not yet collected are cancelled (waiting up to ``stop_wait_s`` for them
    to end), reported, and KeyboardInterrupt is raised again."""
    pending = list(zip(jobs, cells, strict=True))
    asked = time.monotonic()
    try:
        while pending:
            states: dict[str, str] = {}
            if scheduler_states is not None and time.monotonic() - asked >= SCHEDULER_POLL_S:
                states, asked = scheduler_states([job.job_id for job, _ in pending]) or {}, time.monotonic()
            for job, cell in list(pending):
                if job.done():
                    outcome = _job_outcome(job, cell)
                elif states.get(job.job_id) == PREEMPTED:
                    outcome = CellOutcome.interrupted(
                        cell, f"SLURM job {job.job_id} ended PREEMPTED (not requeued); re-run the grid to resume"
                    )
                else:
                    continue
                pending.remove((job, cell))
                yield outcome
            if pending:
                time.sleep(COLLECT_POLL_S)
    except KeyboardInterrupt:
        for job, _ in pending:
            with contextlib.suppress(Exception):  # already gone
                job.cancel(check=False)
        deadline = time.monotonic() + stop_wait_s
        while time.monotonic() < deadline and not all(job.done() for job, _ in pending):
            time.sleep(0.5)
        for job, cell in pending:
            outcome = None
            if job.done():
                try:
                    outcome = job.task(0).result()
                except Exception:
                    outcome = None
            yield outcome if outcome is not None else CellOutcome.interrupted(cell, f"interrupted (job {job.job_id})")
        raise


def _ddp_overrides(resources: ResourcesConfig) -> list[str]:
    """What a cell needs to be one run over the tasks a submitit executor starts for it:
    Lightning's devices and nodes are the tasks per node and the nodes; several processes on
    CPUs are DDP (over gloo)."""
    if resources.gpus_per_node == 0 and resources.tasks * resources.nodes == 1:
        return []
    overrides = [f"trainer.devices={resources.tasks}", f"trainer.num_nodes={resources.nodes}"]
    return [*overrides, "trainer.strategy=ddp"] if resources.gpus_per_node == 0 else overrides


def _submitit_parameters(resources: ResourcesConfig) -> dict[str, Any]:
    return {
        "name": "mesh-sweep",
        "timeout_min": resources.time_min,
        "gpus_per_node": resources.gpus_per_node,
        "tasks_per_node": resources.tasks,  # one process per rank, started by srun: Lightning reads SLURM's ranks
        "nodes": resources.nodes,
        "cpus_per_task": resources.cpus_per_task,
    }


@dataclass
class SubmititLocalLauncher(WorkersLauncher):
    """submitit's local executor (SLURM's code path without SLURM), in waves of ``workers`` jobs."""

    def check(self, folder: Path, resources: ResourcesConfig) -> None:
        if resources.nodes > 1:
            raise ConfigError("resources.nodes", resources.nodes, "launcher=submitit_local runs on this machine: use 1")

    def cell_overrides(self, resources: ResourcesConfig) -> list[str]:
        """A cell of several tasks is one DDP run (over gloo without GPUs), as on SLURM."""
        return _ddp_overrides(resources)

    def executor(self, folder: Path, resources: ResourcesConfig) -> submitit.AutoExecutor:
        executor = submitit.AutoExecutor(folder=folder, cluster="local")
        executor.update_parameters(**_submitit_parameters(resources))
        return executor

    def launch(
        self, cells: Sequence[Cell], resources: ResourcesConfig, folder: Path, on_start: OnStart = no_start
    ) -> Iterator[CellOutcome]:
        executor = self.executor(folder, resources)
        threads = max(1, resources.cpus_per_task // self.workers)
        for start in range(0, len(cells), self.workers):
            wave = cells[start : start + self.workers]
            with executor.batch():
                jobs = [executor.submit(CellJob(), cell, threads) for cell in wave]
            for cell in wave:
                on_start(cell)
            yield from _collect(jobs, wave, stop_wait_s=sum(STOP_GRACE_S))


@dataclass
class SlurmLauncher(Launcher):
    """One SLURM job per cell, submitted as one job array throttled by ``max_parallel``; a cell of
    several tasks (``resources.tasks_per_node`` x ``nodes``) is one DDP run, its ranks started by
    srun. The jobs of each submission are written to the grid's ``jobs.json`` (sweeps/jobs.py)."""

    partition: str | None = None
    account: str | None = None
    qos: str | None = None
    max_parallel: int = 64  # SLURM array parallelism
    max_requeues: int = 3  # times a cell's job is requeued at its time limit before the cell fails
    # Seconds between SLURM's USR2 warning and the time limit; null: a tenth of the limit, at most
    # 90 s. Raise it when a step and its checkpoint take long to write (a large model).
    signal_delay_s: int | None = None
    setup: list[str] = field(default_factory=list)  # shell lines run before each SLURM job
    additional_parameters: dict[str, str] = field(default_factory=dict)  # any other #SBATCH flag

    def validate(self) -> None:
        if self.max_parallel < 1:
            raise ConfigError("launcher.max_parallel", self.max_parallel, "must be >= 1")
        if self.max_requeues < 0:
            raise ConfigError("launcher.max_requeues", self.max_requeues, "must be >= 0")
        if self.signal_delay_s is not None and self.signal_delay_s < 1:
            raise ConfigError("launcher.signal_delay_s", self.signal_delay_s, "must be >= 1 (seconds), or null")

    def signal_delay(self, resources: ResourcesConfig) -> int:
        """Seconds between USR2 and the time limit: ``signal_delay_s``, else a tenth of the limit,
        at most submitit's 90 s. SLURM checks limits every 30 s and sends it up to 30 s earlier
        still, never later."""
        return self.signal_delay_s or min(90, resources.time_min * 6)

    def check(self, folder: Path, resources: ResourcesConfig) -> None:
        self.executor(folder, resources)
        known = slurm_partitions()
        if self.partition is not None and known and self.partition not in known:
            raise ConfigError("launcher.partition", self.partition, f"partitions here: {', '.join(known)}")

    @property
    def detaches(self) -> bool:
        return True

    @property
    def concurrency(self) -> int:
        return self.max_parallel

    def cell_overrides(self, resources: ResourcesConfig) -> list[str]:
        """Lightning's devices and nodes are SLURM's tasks per node and nodes; several processes
        on CPUs are DDP (over gloo)."""
        return _ddp_overrides(resources)

    def memory_limit(self, resources: ResourcesConfig) -> MemoryLimit:
        """A job's node, not the login node: a CPU cell's processes share the ``mem_gb`` asked
        for (SLURM's G is GiB); a GPU node's memory is not known from here."""
        from experiments.plan import MemoryLimit

        if resources.gpus_per_node:
            return MemoryLimit(None, "")
        return MemoryLimit(
            resources.mem_gb * 2**30, f" per node (resources.mem_gb={resources.mem_gb} GiB)", "resources.mem_gb"
        )

    def check_trainer(self, trainer: TrainerConfig, resources: ResourcesConfig) -> None:
        """GPUs asked for and a CPU trainer (the default ``trainer=cpu``) would train on the CPUs
        of a GPU node; a GPU trainer without GPUs fails only once the job starts."""
        gpus, accelerator = resources.gpus_per_node, str(trainer.accelerator)
        if gpus and accelerator == "cpu":
            raise ConfigError(
                "trainer.accelerator",
                accelerator,
                f"resources ask for {gpus} GPU(s) per node: add trainer=gpu (or trainer=ddp), or drop the GPUs "
                "(resources=cpu)",
            )
        if not gpus and accelerator in ("gpu", "cuda"):
            raise ConfigError(
                "trainer.accelerator",
                accelerator,
                "resources ask SLURM for no GPU: add resources=gpu1 (or gpu4, gpu8x2, resources.gpus_per_node=N), "
                "or trainer=cpu",
            )

    def executor(self, folder: Path, resources: ResourcesConfig) -> submitit.AutoExecutor:
        if shutil.which("srun") is None:
            raise LaunchError(
                "launcher=slurm needs SLURM (no srun on PATH): run mesh-sweep on a cluster login node, "
                "or try the same code path here with launcher=submitit_local"
            )
        executor = submitit.AutoExecutor(folder=folder, cluster="slurm", slurm_max_num_timeout=self.max_requeues)
        slurm = {
            "mem_gb": resources.mem_gb,
            "slurm_partition": self.partition,
            "slurm_account": self.account,
            "slurm_qos": self.qos,
            "slurm_setup": list(self.setup),
            "slurm_additional_parameters": dict(self.additional_parameters),
            "slurm_array_parallelism": self.max_parallel,
            "slurm_signal_delay_s": self.signal_delay(resources),
        }
        params = {**_submitit_parameters(resources), **slurm}
        executor.update_parameters(**{k: v for k, v in params.items() if v is not None})
        return executor

    def launch(
        self, cells: Sequence[Cell], resources: ResourcesConfig, folder: Path, on_start: OnStart = no_start
    ) -> Iterator[CellOutcome]:
        """``on_start`` hears of each cell when the array is submitted: when SLURM starts a job
        is not known here."""
        jobs = self._submit(cells, resources, folder)
        for cell in cells:
            on_start(cell)
        yield from _collect(jobs, cells, scheduler_states=job_states)

    def submit(self, cells: Sequence[Cell], resources: ResourcesConfig, folder: Path) -> list[str]:
        return [job.job_id for job in self._submit(cells, resources, folder)]

    def _submit(self, cells: Sequence[Cell], resources: ResourcesConfig, folder: Path) -> list[Any]:
        """One job array (a lone job for one cell); its ids go to ``<sweep dir>/jobs.json``."""
        if not cells:
            return []
        executor = self.executor(folder, resources)
        job = CellJob(stop_within_s=self.signal_delay(resources) * 2 / 3)
        with executor.batch():
            jobs = [executor.submit(job, cell, None) for cell in cells]
        record_jobs(folder.parent, {cell.index: job.job_id for cell, job in zip(cells, jobs, strict=True)})
        return jobs


def slurm_partitions() -> list[str]:
    """The partitions ``sinfo`` lists here; empty when it does not answer."""
    try:
        found = subprocess.run(["sinfo", "-h", "-o", "%R"], capture_output=True, text=True, timeout=30, check=True)
    except (OSError, subprocess.SubprocessError):
        return []
    return sorted(set(found.stdout.split()))


# The options of sweeps/conf/launcher/ and the class that types each one.
LAUNCHERS: dict[str, type[Launcher]] = {
    "auto": PackedLauncher,
    "local": LocalLauncher,
    "parallel": ParallelLauncher,
    "submitit_local": SubmititLocalLauncher,
    "slurm": SlurmLauncher,
}
