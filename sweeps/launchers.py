"""Where sweep cells run: this process, a pool of local processes, or submitit (local or SLURM).

Every launcher runs the same picklable :func:`run_cell`, which composes the cell's config and
calls :func:`experiments.train.train`. A cell that raises is reported as FAILED (its MLflow run is
already marked FAILED with the error by ``train``) and the grid goes on.

Requeue on SLURM is owned by submitit: a preempted or timed-out job gets ``checkpoint()``
called, which resubmits the same cell; the new job re-runs ``train`` on the same config, which
resumes ``last.ckpt`` and re-attaches to the same MLflow run. Lightning's own SLURM auto-requeue
is switched off in ``train`` so the two never both requeue.
"""

from __future__ import annotations

import multiprocessing
import shutil
import traceback
from collections.abc import Iterator, Sequence
from concurrent.futures import ProcessPoolExecutor, as_completed
from dataclasses import dataclass
from pathlib import Path

import submitit

from experiments.sweep_config import LaunchConfig


class LaunchError(RuntimeError):
    """A launcher cannot start on this machine; the message is one line."""


@dataclass
class Cell:
    index: int
    overrides: list[str]
    label: str = ""  # the grid coordinates, e.g. "scheme=mesh seed=1"


@dataclass
class CellOutcome:
    index: int
    overrides: list[str]
    status: str  # FINISHED | FAILED | SKIPPED | PRUNED
    label: str = ""
    val_loss: float | None = None
    run_id: str | None = None
    run_dir: str | None = None
    error: str | None = None

    @classmethod
    def from_result(cls, cell: Cell, status: str, result: dict) -> CellOutcome:
        """From what ``train`` returns (or wrote to ``result.json``)."""
        return cls(
            cell.index,
            cell.overrides,
            status,
            cell.label,
            val_loss=result["val_loss"],
            run_id=result["run_id"],
            run_dir=result["run_dir"],
        )


def run_cell(cell: Cell, threads: int | None = None) -> CellOutcome:
    """Compose and train one cell; never raises for a failing run."""
    import torch

    from experiments.compose import compose_config
    from experiments.train import train

    if threads:
        torch.set_num_threads(threads)
    try:
        result = train(compose_config(cell.overrides))
    except Exception as error:  # the grid goes on; train() already marked the MLflow run FAILED
        if type(error).__name__ == "TrialPruned":  # an Optuna trial stopped early on purpose
            return CellOutcome(cell.index, cell.overrides, "PRUNED", cell.label, error=str(error))
        message = f"{type(error).__name__}: {error}".splitlines()[0]
        traceback.print_exc()
        return CellOutcome(cell.index, cell.overrides, "FAILED", cell.label, error=message)
    return CellOutcome.from_result(cell, "FINISHED", result)


def launch_local(cells: Sequence[Cell]) -> Iterator[CellOutcome]:
    """Sequentially, in this process: imports and the tokenized corpus are paid for once."""
    for cell in cells:
        yield run_cell(cell)


def launch_parallel(cells: Sequence[Cell], workers: int, cpus: int) -> Iterator[CellOutcome]:
    """``workers`` spawned processes share the machine; each gets cpus // workers torch threads."""
    threads = max(1, cpus // workers)
    context = multiprocessing.get_context("spawn")
    with ProcessPoolExecutor(max_workers=workers, mp_context=context) as pool:
        futures = {pool.submit(run_cell, cell, threads): cell for cell in cells}
        for future in as_completed(futures):
            cell = futures[future]
            try:
                yield future.result()
            except Exception as error:  # the worker process itself died
                yield CellOutcome(cell.index, cell.overrides, "FAILED", error=f"{type(error).__name__}: {error}")


class CellJob(submitit.helpers.Checkpointable):
    """A submitit job running one cell. Inherits ``checkpoint()``: on preemption or timeout,
    submitit requeues the same call, and ``train`` resumes the cell's checkpoint and MLflow run."""

    def __call__(self, cell: Cell, threads: int | None = None) -> CellOutcome:
        return run_cell(cell, threads)


def submitit_executor(folder: Path, launch: LaunchConfig, local: bool) -> submitit.AutoExecutor:
    resources, launcher = launch.resources, launch.launcher
    if not local and shutil.which("srun") is None:
        raise LaunchError(
            "launcher=slurm needs SLURM (no srun on PATH): run mesh-sweep on a cluster login node, "
            "or try the same code path here with launcher=submitit_local"
        )
    executor = submitit.AutoExecutor(folder=folder, cluster="local" if local else "slurm")
    tasks = max(1, resources.gpus_per_node)  # one task per GPU: Lightning picks up SLURM's ranks
    params = {
        "name": "mesh-sweep",
        "timeout_min": resources.time_min,
        "gpus_per_node": resources.gpus_per_node,
        "tasks_per_node": tasks,
        "nodes": resources.nodes,
        "cpus_per_task": resources.cpus_per_task,
    }
    if not local:
        params.update(
            mem_gb=resources.mem_gb,
            slurm_partition=launcher.partition,
            slurm_account=launcher.account,
            slurm_qos=launcher.qos,
            slurm_setup=list(launcher.setup),
            slurm_additional_parameters=dict(launcher.additional_parameters),
            slurm_array_parallelism=launcher.max_parallel,
        )
        params = {k: v for k, v in params.items() if v is not None}
    executor.update_parameters(**params)
    return executor


def launch_submitit(cells: Sequence[Cell], folder: Path, launch: LaunchConfig, local: bool) -> Iterator[CellOutcome]:
    """submitit jobs, one per cell. Locally they run in waves of ``launcher.workers`` processes;
    on SLURM as one job array throttled by ``launcher.max_parallel``."""
    executor = submitit_executor(folder, launch, local)
    wave = launch.launcher.workers if local else len(cells)
    threads = max(1, launch.resources.cpus_per_task // max(1, launch.launcher.workers)) if local else None
    for start in range(0, len(cells), max(1, wave)):
        batch = cells[start : start + wave]
        with executor.batch():
            jobs = [executor.submit(CellJob(), cell, threads) for cell in batch]
        for job, cell in zip(jobs, batch, strict=True):
            try:
                yield job.result()
            except Exception as error:  # the job died outside run_cell (killed, out of memory...)
                message = f"{type(error).__name__}: {error}".strip().splitlines()[-1]
                yield CellOutcome(cell.index, cell.overrides, "FAILED", error=f"job {job.job_id}: {message}")
