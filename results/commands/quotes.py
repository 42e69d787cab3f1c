"""The pages that quote results, written from their templates: the last step of ``make reports``.

    python -m results.commands.quotes [TEMPLATE ...] [--check]

Each ``*.template.md`` (default: every one under ``results/cpu-reproduction``) becomes the page beside
it with its placeholders resolved from the committed report folders (:mod:`results.publish.quotes`).
``--check`` writes nothing and lists every page that differs from what its template gives (exit 1).
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1] / "cpu-reproduction"


def templates(paths: Sequence[Path]) -> list[Path]:
    """The templates named, or every ``*.template.md`` under the reproduction."""
    from results.publish.quotes import TEMPLATE_SUFFIX

    return sorted(paths) if paths else sorted(ROOT.rglob(f"*{TEMPLATE_SUFFIX}"))


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m results.commands.quotes", description=__doc__.split("\n\n")[0])
    parser.add_argument("templates", nargs="*", type=Path, help=f"templates (default: every one under {ROOT})")
    parser.add_argument("--check", action="store_true", help="write nothing; list the pages that differ (exit 1)")
    args = parser.parse_args(argv)
    from results.publish.quotes import write_page
    from results.rows.frame import ResultsError

    failed = 0
    for template in templates(args.templates):
        try:
            page, text = write_page(template)
        except ResultsError as error:
            print(f"[quotes] {template}: error: {error}", file=sys.stderr)
            failed += 1
            continue
        if args.check:
            same = page.is_file() and page.read_text() == text
            failed += not same
            print(f"[quotes] {page}: {'as its template gives' if same else 'differs from its template'}")
        else:
            page.write_text(text)
            print(f"[quotes] {page}: written from {template.name}")
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
