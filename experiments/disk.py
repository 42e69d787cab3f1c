"""A full disk, recognised wherever it surfaces (an ``OSError``, SQLite's SQLITE_FULL through
SQLAlchemy and MLflow), and the filesystem to name in the one line that says so. Nothing heavy is
imported: ``mesh-results`` answers a full disk with it too."""

from __future__ import annotations

import errno
import os
from pathlib import Path

# SQLite's result code and messages for a full disk (SQLITE_FULL), as MLflow and SQLAlchemy wrap it.
SQLITE_FULL = 13
FULL_TEXTS = ("database or disk is full", "No space left on device", "Disk quota exceeded")


def disk_full(error: BaseException | None) -> bool:
    """Whether ``error`` (anywhere along its causes: MLflow's, SQLAlchemy's, sqlite3's, an
    ``OSError``) says a disk filled up."""
    seen: set[int] = set()
    while error is not None and id(error) not in seen:
        seen.add(id(error))
        if isinstance(error, OSError) and error.errno in (errno.ENOSPC, errno.EDQUOT):
            return True
        if getattr(error, "sqlite_errorcode", None) == SQLITE_FULL or any(t in str(error) for t in FULL_TEXTS):
            return True
        error = getattr(error, "orig", None) or error.__cause__ or error.__context__
    return False


def fullest_filesystem(paths: list[Path]) -> tuple[str, str]:
    """(mount point, free space) of the filesystem with the least free space among ``paths``'."""
    found = []
    for path in paths:
        existing = next((p for p in [path, *path.parents] if p.exists()), Path("/"))
        try:
            stat = os.statvfs(existing)
        except OSError:
            continue
        found.append((stat.f_bavail * stat.f_frsize, _mount_point(existing)))
    if not found:
        return "?", "unknown"
    free, mount = min(found)
    return str(mount), f"{free // 1024} KiB" if free < 1 << 20 else f"{free >> 20} MiB"


def _mount_point(path: Path) -> Path:
    path = path.resolve()
    device = path.stat().st_dev
    while path.parent != path and path.parent.stat().st_dev == device:
        path = path.parent
    return path


def report_disk_full(error: BaseException, out: Path) -> str | None:
    """``mesh-results``' one line for a disk that filled while it wrote the report to ``out``
    (written aside, so ``out`` is as it was: results/outdir.py), else None."""
    if not disk_full(error):
        return None
    mount, free = fullest_filesystem([out])
    return (
        f"no space left on the filesystem at {mount} ({free} free) while writing the report to {out}: "
        f"{out} is as it was; freed space lets the same command write it"
    )
