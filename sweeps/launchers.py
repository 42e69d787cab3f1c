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

import multiprocessing
import shutil
from collections.abc import Iterator, Sequence
from concurrent.futures import ProcessPoolExecutor, as_completed
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import submitit

from mesh_model import ConfigError
from sweeps.cells import Cell, CellOutcome, run_cell

if TYPE_CHECKING:
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

    def launch(self, cells: Sequence[Cell], resources: ResourcesConfig, folder: Path) -> Iterator[CellOutcome]:
        raise NotImplementedError


@dataclass
class LocalLauncher(Launcher):
    """Sequentially, in this process: imports and the tokenized corpus are paid for once."""

    def launch(self, cells: Sequence[Cell], resources: ResourcesConfig, folder: Path) -> Iterator[CellOutcome]:
        for cell in cells:
            yield run_cell(cell)


@dataclass
class WorkersLauncher(Launcher):
    """A launcher that runs ``workers`` cells at once on this machine, cpus_per_task // workers
    torch threads each."""

    workers: int = 2

    def validate(self) -> None:
        if not isinstance(self.workers, int) or self.workers < 1:
            raise ConfigError("launcher.workers", self.workers, "must be an integer >= 1")

    @property
    def concurrency(self) -> int:
        return self.workers


@dataclass
class ParallelLauncher(WorkersLauncher):
    """``workers`` spawned processes share the machine."""

    def launch(self, cells: Sequence[Cell], resources: ResourcesConfig, folder: Path) -> Iterator[CellOutcome]:
        threads = max(1, resources.cpus_per_task // self.workers)
        context = multiprocessing.get_context("spawn")
        with ProcessPoolExecutor(max_workers=self.workers, mp_context=context) as pool:
            futures = {pool.submit(run_cell, cell, threads): cell for cell in cells}
            for future in as_completed(futures):
                try:
                    yield future.result()
                except Exception as error:  # the worker process itself died
                    yield CellOutcome.failed(futures[future], f"{type(error).__name__}: {error}")


class CellJob(submitit.helpers.Checkpointable):
    """A submitit job running one cell. Inherits ``checkpoint()``: on preemption or timeout,
    submitit requeues the same call, and ``train`` resumes the cell's checkpoint and MLflow run."""

    def __call__(self, cell: Cell, threads: int | None = None) -> CellOutcome:
        return run_cell(cell, threads)


def _collect(jobs: Sequence[Any], cells: Sequence[Cell]) -> Iterator[CellOutcome]:
    for job, cell in zip(jobs, cells, strict=True):
        try:
            yield job.result()
        except Exception as error:  # the job died outside run_cell (killed, out of memory...)
            message = f"{type(error).__name__}: {error}".strip().splitlines()[-1]
            yield CellOutcome.failed(cell, f"job {job.job_id}: {message}")


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
            yield from _collect(jobs, wave)


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
    "local": LocalLauncher,
    "parallel": ParallelLauncher,
    "submitit_local": SubmititLocalLauncher,
    "slurm": SlurmLauncher,
}
