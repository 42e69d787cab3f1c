"""A report folder is written beside its place and moved there whole, so an interrupted
``mesh-results`` leaves either the previous report or none, never a folder without ``report.md``.

:func:`report_folder` yields ``.<name>.partial-<pid>`` next to the folder; when the report is
written, it takes the folder's place: by renaming it there when there is none, else by swapping
the two (the old one is renamed aside, then deleted). A folder that holds files a report does not
write (:data:`REPORT_ENTRIES`) is not swapped away: the new entries replace their namesakes one by
one, ``report.md`` last, and the entries of an earlier report that this one does not write are removed. A ``.partial`` folder left by a killed process is removed by the next run
once that process is gone.
"""

from __future__ import annotations

import contextlib
import os
import shutil
from collections.abc import Iterator
from pathlib import Path

REPORT = "report.md"
# What a report writes (results/pipeline.py): a folder holding only these is replaced whole.
REPORT_ENTRIES = frozenset(
    {
        REPORT,
        *(f"{stem}.{ext}" for stem in ("table", "probes") for ext in ("md", "tex", "csv")),
        "claims.md",
        "report.json",
        "stages.json",
        "runs.csv",
        "curves.csv",
        "routing.csv",
        "train_loss.csv",
        "lr.csv",
        "probe_reports",
        "figures",
    }
)


@contextlib.contextmanager
def report_folder(out: Path) -> Iterator[Path]:
    """Yield an empty folder beside ``out``; when the block ends without an error it becomes
    ``out``; on an error it is removed and ``out`` is left as it was."""
    out.parent.mkdir(parents=True, exist_ok=True)
    _remove_abandoned(out)
    partial = out.with_name(f".{out.name}.partial-{os.getpid()}")
    shutil.rmtree(partial, ignore_errors=True)
    partial.mkdir()
    try:
        yield partial
        _put_in_place(partial, out)
    finally:
        shutil.rmtree(partial, ignore_errors=True)


def _put_in_place(partial: Path, out: Path) -> None:
    if not out.exists():
        os.rename(partial, out)
        return
    if all(entry.name in REPORT_ENTRIES for entry in out.iterdir()):
        old = out.with_name(f".{out.name}.old-{os.getpid()}")
        os.rename(out, old)
        os.rename(partial, out)
        shutil.rmtree(old, ignore_errors=True)
        return
    written = {entry.name for entry in partial.iterdir()}
    for stale in out.iterdir():  # what an earlier report wrote and this one does not: gone with it
        if stale.name in REPORT_ENTRIES and stale.name not in written and stale.name != REPORT:
            shutil.rmtree(stale) if stale.is_dir() and not stale.is_symlink() else stale.unlink()
    for entry in sorted(partial.iterdir(), key=lambda e: e.name == REPORT):  # report.md last
        target = out / entry.name
        if target.is_dir() and not target.is_symlink():
            aside = out / f".{entry.name}.old-{os.getpid()}"
            os.rename(target, aside)
            os.rename(entry, target)
            shutil.rmtree(aside, ignore_errors=True)
        else:
            os.replace(entry, target)


def _remove_abandoned(out: Path) -> None:
    """The ``.partial`` and ``.old`` folders of ``out`` whose process is gone."""
    for leftover in out.parent.glob(f".{out.name}.*-*"):
        kind, _, pid = leftover.name.removeprefix(f".{out.name}.").partition("-")
        if kind in ("partial", "old") and pid.isdigit() and not _alive(int(pid)):
            shutil.rmtree(leftover, ignore_errors=True)


def _alive(pid: int) -> bool:
    if pid == os.getpid():
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


__all__ = ["REPORT_ENTRIES", "report_folder"]
