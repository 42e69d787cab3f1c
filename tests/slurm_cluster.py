"""The one-node SLURM cluster of ``make slurm`` (slurm/cluster.sh), for the tests that run
``launcher=slurm`` on it: whether it answers, starting it where this process may, and reading
its jobs back (``sacct``: accounting is on, see slurm/slurm.conf.in).

Imported by tests/test_slurm_cluster.py (pytest puts tests/ on ``sys.path``).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SKIP_REASON = "no local SLURM cluster: start one with `make slurm` (root, Debian)"
DAEMONS = ("munged", "mariadbd", "slurmdbd", "slurmctld", "slurmd")
# What a job's allocations say in sacct: one row per allocation with -D (a requeued job has several).
FIELDS = ("JobID", "JobIDRaw", "State", "Partition", "Timelimit", "ReqCPUS", "ReqMem", "Start", "End", "ExitCode")
UNSETTLED = {"PENDING", "RUNNING", "REQUEUED", "COMPLETING", "SUSPENDED", "RESIZING", "REQUEUE_HOLD"}


def _ok(*command: str) -> bool:
    try:
        return subprocess.run(command, capture_output=True, timeout=30).returncode == 0
    except (OSError, subprocess.SubprocessError):
        return False


def answers() -> bool:
    """The cluster schedules (a node is up) and keeps accounts (``sacct`` answers)."""
    if not _ok("sinfo", "-h", "-o", "%R"):
        return False
    states = subprocess.run(["sinfo", "-h", "-o", "%T"], capture_output=True, text=True, timeout=30).stdout.split()
    return any(s.rstrip("*") in ("idle", "mixed", "allocated") for s in states) and _ok("sacct", "-n", "-X")


def unavailable() -> str | None:
    """Why the cluster tests cannot run here (one line), or None: the cluster answers, or this
    process may start it (root, and the daemons are installed). Cheap: it starts nothing."""
    if answers() or (os.geteuid() == 0 and all(shutil.which(daemon) for daemon in DAEMONS)):
        return None
    return SKIP_REASON


def ensure_cluster() -> None:
    """Start the cluster with ``make slurm`` unless it answers; RuntimeError when that fails."""
    if answers():
        return
    started = subprocess.run(["make", "-s", "slurm"], cwd=ROOT, capture_output=True, text=True, timeout=600)
    if started.returncode != 0 or not answers():
        raise RuntimeError(f"make slurm failed (exit {started.returncode}): {started.stderr.strip()[-2000:]}")


def partitions() -> list[str]:
    out = subprocess.run(["sinfo", "-h", "-o", "%R"], capture_output=True, text=True, timeout=30, check=True).stdout
    return sorted(set(out.split()))


def allocations(job_id: str, settle_s: float = 60.0) -> list[dict[str, str]]:
    """Every allocation of job ``job_id`` (an array's id gives all its tasks), requeued ones
    included, in the order they started, once each job's last one has ended: the sweep may
    finish (its results are files) a moment before slurmctld tells slurmdbd that the job did."""
    deadline = time.monotonic() + settle_s
    while True:
        out = subprocess.run(
            ["sacct", "-X", "-D", "-P", "-n", "-j", job_id, "-o", ",".join(FIELDS)],
            capture_output=True,
            text=True,
            timeout=30,
            check=True,
        ).stdout
        rows = [dict(zip(FIELDS, line.split("|"), strict=True)) for line in out.splitlines() if line]
        last = {row["JobID"]: row["State"] for row in rows}  # each job's latest allocation
        if (rows and not set(last.values()) & UNSETTLED) or time.monotonic() > deadline:
            return rows
        time.sleep(1)


def job_ids(submitit_folder: Path) -> list[str]:
    """The SLURM job ids submitit submitted from ``submitit_folder`` (``12`` for a lone job,
    ``12_0``, ``12_1``... for an array's tasks), sorted."""
    ids = {path.name.removesuffix("_submitted.pkl") for path in submitit_folder.glob("*_submitted.pkl")}
    return sorted(ids, key=lambda job: [int(part) for part in job.split("_")])
