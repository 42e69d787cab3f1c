"""The SLURM jobs of a grid: which job runs each cell, what SLURM says of them, ``scancel``.

``<sweep dir>/jobs.json`` maps each cell's index (0-based, as in the grid) to the id of the
latest job submitted for it: ``12_3`` for a task of job array 12, ``13`` for a lone job. Every
submission updates it, whether ``mesh-sweep`` then waits for the jobs or detaches from them
(``--detach``), so ``--status`` and ``--cancel`` find them from any terminal.

A job's state is ``squeue``'s while slurmctld still knows the job (queued, running, and
``MinJobAge`` seconds after), else ``sacct``'s latest allocation. A task of an array cancelled
while it was pending may have no accounting record at all: it is :data:`GONE`.
"""

from __future__ import annotations

import json
import re
import subprocess
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path

from experiments.data.cache import atomic_path
from experiments.locks import file_lock

JOBS_FILE = "jobs.json"
# squeue's states of a job that waits for, or holds, an allocation.
PENDING = frozenset({"PENDING", "REQUEUED", "REQUEUE_HOLD", "REQUEUE_FED", "RESV_DEL_HOLD"})
RUNNING = frozenset({"CONFIGURING", "RUNNING", "SUSPENDED", "STOPPED", "RESIZING", "SIGNALING", "STAGE_OUT"})
COMPLETING = "COMPLETING"  # its processes are ending: no longer live, but its run may still be closing
# How a job that ended without finishing its cell leaves the cell's MLflow run: stopped from
# outside (KILLED: re-running resumes it), or broken (FAILED). Any other end state is FAILED.
KILLED_BY = frozenset({"CANCELLED", "TIMEOUT", "PREEMPTED", "DEADLINE"})
GONE = "GONE"  # neither squeue nor sacct knows the job (cancelled while pending, or purged)
# Preempted and not requeued (PreemptMode=CANCEL): submitit waits on such a job as if SLURM might
# still requeue it (sweeps/launch/slurm.py asks SLURM itself).
PREEMPTED = "PREEMPTED"


def jobs_file(sweep_dir: Path) -> Path:
    return sweep_dir / JOBS_FILE


def read_jobs(sweep_dir: Path) -> dict[int, str]:
    """Cell index -> the latest job id submitted for it; empty when the grid never ran on SLURM."""
    path = jobs_file(sweep_dir)
    if not path.exists():
        return {}
    return {int(index): str(job) for index, job in json.loads(path.read_text()).items()}


def record_jobs(sweep_dir: Path, jobs: Mapping[int, str]) -> None:
    """Add (or replace) the jobs of the cells in ``jobs`` to the grid's ``jobs.json``: read, merged
    and replaced under a lock, through a temporary file of this writer's own, so that readers
    see a whole file and no writer loses another's jobs."""
    path = jobs_file(sweep_dir)
    with file_lock(path.with_name(f".{path.name}.lock")):
        known = {**read_jobs(sweep_dir), **jobs}
        with atomic_path(path) as partial:
            partial.write_text(json.dumps({str(k): v for k, v in sorted(known.items())}, indent=2))


def _run(command: list[str]) -> subprocess.CompletedProcess | None:
    try:
        return subprocess.run(command, capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.SubprocessError):
        return None


def job_states(jobs: Iterable[str]) -> dict[str, str] | None:
    """SLURM's state of each job (``RUNNING``, ``PENDING``, ``CANCELLED``...; :data:`GONE` when it
    knows nothing of it); None when SLURM does not answer here (no ``squeue``)."""
    wanted = sorted(set(jobs))
    if not wanted:
        return {}
    queued = _run(["squeue", "-h", "-r", "-o", "%i|%T", "-j", ",".join(wanted)])
    if queued is None or (queued.returncode != 0 and "Invalid job id" not in queued.stderr):
        return None  # an id slurmctld has forgotten makes squeue fail alone: then none is queued
    states = {job: state for job, _, state in _rows(queued.stdout if queued.returncode == 0 else "")}
    ended = [job for job in wanted if job not in states]
    if ended:
        accounted = _run(["sacct", "-X", "-P", "-n", "-j", ",".join(ended), "-o", "JobID,State"])
        for job, _, state in _rows(accounted.stdout if accounted is not None else ""):
            for task in array_tasks(job):
                states.setdefault(task, state.split()[0])  # "CANCELLED by 0" -> CANCELLED
    return {job: states.get(job, GONE) for job in wanted}


def wait_for_states(
    jobs: Sequence[str], settled: Callable[[dict[str, str] | None], bool], timeout_s: float, interval_s: float = 1.0
) -> dict[str, str] | None:
    """Ask SLURM for the states of ``jobs`` (:func:`job_states`) every ``interval_s`` until they are
    ``settled`` or ``timeout_s`` has passed; the last answer (None: SLURM did not answer)."""
    deadline = time.monotonic() + timeout_s
    while True:
        states = job_states(jobs)
        if settled(states) or time.monotonic() >= deadline:
            return states
        time.sleep(interval_s)


def _rows(text: str) -> list[tuple[str, str, str]]:
    return [line.partition("|") for line in text.splitlines() if "|" in line]


def array_tasks(job: str) -> list[str]:
    """``12_[1-3,5]`` (sacct's row for an array's pending tasks) -> ``12_1 12_2 12_3 12_5``."""
    found = re.fullmatch(r"(\d+)_\[([\d,\-]+)(?:%\d+)?\]", job)
    if found is None:
        return [job]
    tasks = []
    for part in found.group(2).split(","):
        low, _, high = part.partition("-")
        tasks += [f"{found.group(1)}_{task}" for task in range(int(low), int(high or low) + 1)]
    return tasks


def live(state: str | None) -> bool:
    """A job that is queued or running (a completing one is not: its processes are ending)."""
    return state in PENDING or state in RUNNING


def cancel(jobs: Iterable[str]) -> str | None:
    """``scancel`` the jobs; None when it worked, else what it said (one line)."""
    wanted = sorted(set(jobs))
    if not wanted:
        return None
    done = _run(["scancel", *wanted])
    if done is None:
        return "scancel could not be run"
    if done.returncode != 0:
        return (done.stderr.strip().splitlines() or [f"scancel exited with code {done.returncode}"])[-1]
    return None
