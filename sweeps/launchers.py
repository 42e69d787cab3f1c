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
import sys
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import submitit

from mesh_model import ConfigError
from sweeps.cells import Cell, CellOutcome, run_cell, run_cell_reporting_stops, stop_note
from sweeps.packing import GB, PROCESS_BYTES, CellNeeds, Packing, choose_packing, usable_cores

if TYPE_CHECKING:
    from experiments.plan import RunPlan
    from sweeps.config import ResourcesConfig


class LaunchError(RuntimeError):
    """A launcher cannot start on this machine; the message is one line."""


@dataclass
class Launcher:
    """The interface. ``launch`` yields one outcome per cell, in the order cells finish."""

    @property
    def name(self) -> str:
        """The option that selects it (``launcher=<name>``)."""
        return next(name for name, cls in LAUNCHERS.items() if type(self) is cls)

    def validate(self) -> None:
        """Refuse bad settings in one line (a ConfigError)."""

    def check(self, folder: Path, resources: ResourcesConfig) -> None:
        """Fail fast, before anything is logged, when this launcher cannot run here."""

    @property
    def concurrency(self) -> int:
        """How many cells run at once (an Optuna search asks for that many trials per round)."""
        return 1

    def cell_overrides(self, resources: ResourcesConfig) -> list[str]:
        """Overrides every cell needs to use what ``resources`` asks for."""
        return []

    def prepare(self, plans: Sequence[RunPlan]) -> str | None:
        """Decide, before anything is logged, how the runs of ``plans`` will share this machine;
        returns a line saying so (None: nothing to say). Refuses (LaunchError) what cannot fit."""
        return None

    def launch(self, cells: Sequence[Cell], resources: ResourcesConfig, folder: Path) -> Iterator[CellOutcome]:
        raise NotImplementedError


@dataclass
class LocalLauncher(Launcher):
    """Sequentially, in this process: imports and the tokenized corpus are paid for once."""

    def launch(self, cells: Sequence[Cell], resources: ResourcesConfig, folder: Path) -> Iterator[CellOutcome]:
        yield from self.launch_with_threads(cells, None)

    def launch_with_threads(self, cells: Sequence[Cell], threads: int | None) -> Iterator[CellOutcome]:
        """Each cell in turn, with ``threads`` torch threads (None: leave the process's setting)."""
        for cell in cells:
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
        per_cell = max((n.memory_bytes for n in needs), default=0) + PROCESS_BYTES
        at_once = min(packing.workers, len(needs))
        if available is not None and not any(n.alone for n in needs) and at_once * per_cell > available:
            raise LaunchError(
                f"launcher.workers={packing.workers} is too many: {at_once} cells at once need about "
                f"{at_once * per_cell / GB:.1f} GB but {available / GB:.1f} GB are available; "
                "lower launcher.workers, or leave it out to choose"
            )
        self._packing = packing
        return f"packing: {packing.describe(len(plans))}"

    def launch(self, cells: Sequence[Cell], resources: ResourcesConfig, folder: Path) -> Iterator[CellOutcome]:
        packing = self._packing or Packing(self.workers or 1, self.threads, "not prepared")
        if packing.workers == 1 and not self.in_processes:
            yield from LocalLauncher().launch_with_threads(cells, packing.threads)
        else:
            yield from run_in_processes(cells, packing.workers, packing.threads)


@dataclass
class ParallelLauncher(PackedLauncher):
    """``workers`` spawned processes share the machine, one process per cell, even when one
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
# terminated in the middle of their runs. Here each cell has its own process, which sends its
# CellOutcome back through a pipe; a process that ends without sending one failed its cell alone.

# After Ctrl-C: how long the cells get to stop on their own (they got the terminal's SIGINT
# too), then after SIGINT, SIGTERM and SIGKILL sent by us. A second Ctrl-C kills them at once.
STOP_GRACE_S = (10.0, 10.0, 10.0, 5.0)
EXIT_AFTER_OUTCOME_S = 60.0  # a process that sent its outcome but does not exit is killed


@dataclass
class _Worker:
    cell: Cell
    process: Any  # multiprocessing's SpawnProcess
    reader: Any  # the parent's end of the pipe
    outcome: CellOutcome | None = None
    sent_at: float | None = None
    closed: bool = False  # the pipe reached EOF


def _cell_process(writer: Any, cell: Cell, threads: int | None) -> None:
    """The body of a worker process: train the cell, send what became of it."""
    outcome = run_cell_reporting_stops(cell, threads)
    writer.send(outcome)
    writer.close()


def _start(context: Any, cell: Cell, threads: int | None) -> _Worker:
    reader, writer = context.Pipe(duplex=False)
    process = context.Process(target=_cell_process, args=(writer, cell, threads), name=f"mesh-cell-{cell.index}")
    process.start()
    writer.close()  # the child holds the only writing end: its death is EOF here
    return _Worker(cell, process, reader)


def _receive(worker: _Worker) -> None:
    """Read the worker's outcome if it is there (never blocks)."""
    while not worker.closed and worker.outcome is None:
        try:
            if not worker.reader.poll():
                return
            worker.outcome = worker.reader.recv()
            worker.sent_at = time.monotonic()
        except (EOFError, OSError):
            worker.closed = True


def _wait(workers: Sequence[_Worker], timeout: float | None) -> list[_Worker]:
    """Wait until a worker's process exits (or ``timeout``); read outcomes meanwhile. Returns the
    workers whose process has exited, joined."""
    waitables = [w.process.sentinel for w in workers]
    waitables += [w.reader for w in workers if w.outcome is None and not w.closed]
    multiprocessing.connection.wait(waitables, timeout)
    for worker in workers:
        _receive(worker)
    exited = [w for w in workers if w.process.exitcode is not None]
    for worker in exited:
        worker.process.join()
        _receive(worker)  # sent just before exiting
        worker.reader.close()
        worker.closed = True
    return exited


def _died(exitcode: int) -> str:
    if exitcode < 0:
        return f"worker died (signal {-exitcode})"
    return f"worker exited with code {exitcode}"


def _result(worker: _Worker) -> CellOutcome:
    """What became of an exited worker's cell."""
    if worker.outcome is not None:
        return worker.outcome
    return CellOutcome.failed(worker.cell, _died(worker.process.exitcode))


def run_in_processes(cells: Sequence[Cell], workers: int, threads: int | None) -> Iterator[CellOutcome]:
    """Run each cell in a spawned process of its own, at most ``workers`` at a time; yield each
    outcome as its process ends. On Ctrl-C (raised while waiting here, or thrown in at a yield),
    no further cell starts, the running ones are stopped (:data:`STOP_GRACE_S`) and reported,
    then KeyboardInterrupt is raised again."""
    context = multiprocessing.get_context("spawn")
    queue = list(cells)
    running: list[_Worker] = []
    try:
        while queue or running:
            while queue and len(running) < workers:
                running.append(_start(context, queue.pop(0), threads))
            lingering = [w for w in running if w.sent_at is not None]
            for worker in lingering:
                if time.monotonic() - worker.sent_at > EXIT_AFTER_OUTCOME_S:
                    worker.process.kill()
            for worker in _wait(running, 5.0 if lingering else None):
                running.remove(worker)
                yield _result(worker)
    except KeyboardInterrupt:
        yield from _stop(running)
        raise
    finally:
        for worker in running:  # closed without being drained (an error, or close()): leave no orphan
            if worker.process.is_alive():
                worker.process.kill()
                worker.process.join()


def _stop(running: list[_Worker]) -> Iterator[CellOutcome]:
    """Stop the running cells after Ctrl-C and report each: what it sent (FINISHED if it got
    there, INTERRUPTED if it stopped on the signal) or INTERRUPTED."""
    steps = zip((None, signal.SIGINT, signal.SIGTERM, signal.SIGKILL), STOP_GRACE_S, strict=True)
    if running:
        print(
            f"[mesh-sweep] Ctrl-C: stopping {len(running)} running cell(s), starting no more (Ctrl-C again kills them)",
            file=sys.stderr,
            flush=True,
        )
    try:
        for sent, grace in steps:
            alive = [w for w in running if w.process.exitcode is None]
            if not alive:
                break
            for worker in alive:
                if sent is not None:
                    os.kill(worker.process.pid, sent)
            deadline = time.monotonic() + grace
            while any(w.process.exitcode is None for w in alive) and time.monotonic() < deadline:
                _wait([w for w in alive if w.process.exitcode is None], max(0.0, deadline - time.monotonic()))
    except KeyboardInterrupt:  # a second Ctrl-C: no more waiting
        for worker in running:
            if worker.process.exitcode is None:
                worker.process.kill()
    while running:
        worker = running[0]
        worker.process.join()
        _wait([worker], 0)
        running.pop(0)
        if worker.outcome is not None:
            yield worker.outcome
        else:
            yield CellOutcome.interrupted(worker.cell, f"interrupted ({_died(worker.process.exitcode)})")


class CellJob(submitit.helpers.Checkpointable):
    """A submitit job running one cell. Inherits ``checkpoint()``: on preemption or timeout,
    submitit requeues the same call, and ``train`` resumes the cell's checkpoint and MLflow run."""

    def __call__(self, cell: Cell, threads: int | None = None) -> CellOutcome:
        return run_cell_reporting_stops(cell, threads)


def _job_outcome(job: Any, cell: Cell) -> CellOutcome:
    """Wait for ``job``; a job that ends without a result (killed, out of memory...) fails its cell."""
    try:
        return job.result()
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


def _collect(jobs: Sequence[Any], cells: Sequence[Cell], stop_wait_s: float = 0.0) -> Iterator[CellOutcome]:
    """Each job's outcome in order; one job's death does not stop the others being collected.
    On Ctrl-C the jobs not yet collected are cancelled (waiting up to ``stop_wait_s`` for them
    to end), reported, and KeyboardInterrupt is raised again."""
    pending = list(zip(jobs, cells, strict=True))
    try:
        while pending:
            job, cell = pending[0]
            outcome = _job_outcome(job, cell)
            pending.pop(0)
            yield outcome
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
                    outcome = job.result()
                except Exception:
                    outcome = None
            yield outcome if outcome is not None else CellOutcome.interrupted(cell, f"interrupted (job {job.job_id})")
        raise


def _submitit_parameters(resources: ResourcesConfig) -> dict[str, Any]:
    return {
        "name": "mesh-sweep",
        "timeout_min": resources.time_min,
        "gpus_per_node": resources.gpus_per_node,
        "tasks_per_node": max(1, resources.gpus_per_node),  # one task per GPU: Lightning reads SLURM's ranks
        "nodes": resources.nodes,
        "cpus_per_task": resources.cpus_per_task,
    }


@dataclass
class SubmititLocalLauncher(WorkersLauncher):
    """submitit's local executor (SLURM's code path without SLURM), in waves of ``workers`` jobs."""

    def executor(self, folder: Path, resources: ResourcesConfig) -> submitit.AutoExecutor:
        executor = submitit.AutoExecutor(folder=folder, cluster="local")
        executor.update_parameters(**_submitit_parameters(resources))
        return executor

    def launch(self, cells: Sequence[Cell], resources: ResourcesConfig, folder: Path) -> Iterator[CellOutcome]:
        executor = self.executor(folder, resources)
        threads = max(1, resources.cpus_per_task // self.workers)
        for start in range(0, len(cells), self.workers):
            wave = cells[start : start + self.workers]
            with executor.batch():
                jobs = [executor.submit(CellJob(), cell, threads) for cell in wave]
            yield from _collect(jobs, wave, stop_wait_s=sum(STOP_GRACE_S))


@dataclass
class SlurmLauncher(Launcher):
    """One SLURM job per cell, submitted as one job array throttled by ``max_parallel``."""

    partition: str | None = None
    account: str | None = None
    qos: str | None = None
    max_parallel: int = 64  # SLURM array parallelism
    setup: list[str] = field(default_factory=list)  # shell lines run before each SLURM job
    additional_parameters: dict[str, str] = field(default_factory=dict)  # any other #SBATCH flag

    def validate(self) -> None:
        if self.max_parallel < 1:
            raise ConfigError("launcher.max_parallel", self.max_parallel, "must be >= 1")

    def check(self, folder: Path, resources: ResourcesConfig) -> None:
        self.executor(folder, resources)

    @property
    def concurrency(self) -> int:
        return self.max_parallel

    def cell_overrides(self, resources: ResourcesConfig) -> list[str]:
        if resources.gpus_per_node == 0:
            return []
        return [f"trainer.devices={resources.gpus_per_node}", f"trainer.num_nodes={resources.nodes}"]

    def executor(self, folder: Path, resources: ResourcesConfig) -> submitit.AutoExecutor:
        if shutil.which("srun") is None:
            raise LaunchError(
                "launcher=slurm needs SLURM (no srun on PATH): run mesh-sweep on a cluster login node, "
                "or try the same code path here with launcher=submitit_local"
            )
        executor = submitit.AutoExecutor(folder=folder, cluster="slurm")
        slurm = {
            "mem_gb": resources.mem_gb,
            "slurm_partition": self.partition,
            "slurm_account": self.account,
            "slurm_qos": self.qos,
            "slurm_setup": list(self.setup),
            "slurm_additional_parameters": dict(self.additional_parameters),
            "slurm_array_parallelism": self.max_parallel,
        }
        params = {**_submitit_parameters(resources), **slurm}
        executor.update_parameters(**{k: v for k, v in params.items() if v is not None})
        return executor

    def launch(self, cells: Sequence[Cell], resources: ResourcesConfig, folder: Path) -> Iterator[CellOutcome]:
        executor = self.executor(folder, resources)
        with executor.batch():
            jobs = [executor.submit(CellJob(), cell, None) for cell in cells]
        yield from _collect(jobs, cells)


# The options of sweeps/conf/launcher/ and the class that types each one.
LAUNCHERS: dict[str, type[Launcher]] = {
    "auto": PackedLauncher,
    "local": LocalLauncher,
    "parallel": ParallelLauncher,
    "submitit_local": SubmititLocalLauncher,
    "slurm": SlurmLauncher,
}
