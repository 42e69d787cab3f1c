"""``make reports``: every committed report folder rebuilt, whole, from the data it keeps.

    python -m results.commands.reports [FOLDER ...] [--check]

A folder is a report folder when it holds ``report.json`` (the name, experiments and store its report
was built from; :mod:`results.rows.spec`); the default root is ``results/cpu-reproduction``, searched
recursively. Each is rebuilt in place by :func:`results.pipeline.rebuild_report`, the pipeline
``mesh-results`` runs on the store. ``--check`` rebuilds a copy of each instead and lists every
file that differs from the folder's (exit 1 when any does): what the test of the committed reports
runs. After them, every folder holding a ``trend.json`` (:mod:`results.commands.trend`, made from
report folders' runs.csv) is written again, or checked the same way.
"""

from __future__ import annotations

import argparse
import filecmp
import shutil
import sys
import tempfile
import time
from collections.abc import Iterable, Sequence
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1] / "cpu-reproduction"
REPO = ROOT.parents[1]  # where a trend.json's folders are relative to


def report_folders(roots: Iterable[Path]) -> list[Path]:
    """Every folder under ``roots`` (or a root itself) that holds a ``report.json``, sorted."""
    from results.rows.spec import SPEC_FILE

    found: set[Path] = set()
    for root in roots:
        found.update(p.parent for p in Path(root).rglob(SPEC_FILE) if not p.parent.name.startswith("."))
    return sorted(found)


def differing_files(a: Path, b: Path) -> list[str]:
    """Paths (relative) present in one tree and not the other, or with other bytes."""
    names_a = {p.relative_to(a) for p in a.rglob("*") if p.is_file()}
    names_b = {p.relative_to(b) for p in b.rglob("*") if p.is_file()}
    out = sorted(str(p) for p in names_a ^ names_b)
    out += sorted(str(p) for p in names_a & names_b if not filecmp.cmp(a / p, b / p, shallow=False))
    return out


def check_folder(folder: Path) -> list[str]:
    """The files that a rebuild of ``folder`` writes otherwise than they are (a rebuild of a copy,
    beside the folder's parent so that its ``confirmatory.yaml`` is read alike)."""
    from results.pipeline import rebuild_report

    with tempfile.TemporaryDirectory() as tmp:
        parent = Path(tmp) / "parent"
        parent.mkdir()
        for sibling in folder.parent.iterdir():  # the reproduction-level files the report reads
            if sibling.is_file():
                shutil.copy(sibling, parent / sibling.name)
        copy = parent / folder.name
        shutil.copytree(folder, copy)
        rebuild_report(copy)
        return differing_files(folder, copy)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m results.commands.reports", description=__doc__.split("\n\n")[0])
    parser.add_argument("folders", nargs="*", type=Path, help=f"report folders or roots (default: {ROOT})")
    parser.add_argument("--check", action="store_true", help="rebuild copies and list what differs (exit 1)")
    args = parser.parse_args(argv)
    from results.rows.frame import ResultsError

    folders = report_folders(args.folders or [ROOT])
    if not folders:
        print(f"error: no report.json under {', '.join(map(str, args.folders or [ROOT]))}", file=sys.stderr)
        return 2
    from results.pipeline import rebuild_report

    failed = 0
    for folder in folders:
        start = time.perf_counter()
        try:
            if args.check:
                differ = check_folder(folder)
                failed += bool(differ)
                said = "as committed" if not differ else f"{len(differ)} files differ: {', '.join(differ[:5])}"
            else:
                rebuild_report(folder)
                said = "rebuilt"
        except ResultsError as error:
            failed += 1
            said = f"error: {error}"
        print(f"[reports] {folder}: {said} ({time.perf_counter() - start:.1f}s)")
    failed += _trends(args.folders or [ROOT], args.check)
    return 1 if failed else 0


def _trends(roots: Iterable[Path], check: bool) -> int:
    """Write again (or check) every trend folder under ``roots``; the number that failed."""
    from results.commands import trend

    failed = 0
    for spec in sorted({p for root in roots for p in Path(root).rglob(trend.SPEC)}):
        folder = spec.parent
        try:
            if check:
                differ = trend.differing(folder, REPO)
                said = "as committed" if not differ else f"{len(differ)} files differ: {', '.join(differ)}"
            else:
                trend.main([str(folder), "--base", str(REPO)])
                differ, said = [], "rebuilt"
        except ValueError as error:  # bad input, a missing arm (TrendInputError, ResultsError)
            differ, said = [str(error)], f"error: {error}"
        failed += bool(differ)
        print(f"[reports] {folder} (trend): {said}")
    return failed


if __name__ == "__main__":
    raise SystemExit(main())
