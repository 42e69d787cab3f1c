"""The launchers that hand cells to submitit: its local executor (``submitit_local``, SLURM's code
path on this machine) and SLURM (``slurm``), and the collection of their jobs' outcomes. What runs
inside each job is :mod:`sweeps.launch.cell_job`."""

from __future__ import annotations

import contextlib
import shutil
import subprocess
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

import submitit

from mesh_model import ConfigError
from sweeps.cells import Cell, CellOutcome
from sweeps.launch.base import Launcher, LaunchError, OnStart, ResourcesConfig, no_start
from sweeps.launch.cell_job import CellJob
from sweeps.launch.pool import STOP_GRACE_S, death_note
from sweeps.slurm_jobs import PREEMPTED, job_states, record_jobs

if TYPE_CHECKING:
    from experiments.config import TrainerConfig
    from experiments.plan import MemoryLimit


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
        return f"{death_note(code)}, job {job.job_id}"
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
class SubmititLocalLauncher(Launcher):
    """submitit's local executor (SLURM's code path without SLURM), in waves of ``workers`` jobs,
    cpus_per_task // workers torch threads each."""

    name: ClassVar[str] = "submitit_local"
    workers: int = 2

    def validate(self) -> None:
        if not isinstance(self.workers, int) or isinstance(self.workers, bool) or self.workers < 1:
            raise ConfigError("launcher.workers", self.workers, "must be an integer >= 1")

    @property
    def concurrency(self) -> int:
        return self.workers

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
    srun. The jobs of each submission are written to the grid's ``jobs.json`` (sweeps/slurm_jobs.py)."""

    name: ClassVar[str] = "slurm"
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
