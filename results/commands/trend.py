"""MeSH's gaps at size and token points against a reference point, from report folders' runs.csv.

    python -m results.commands.trend OUT --reference "tiny, 5.1M tokens=FOLDER[,FOLDER...]" \\
        --point "tiny, 11.7M tokens=FOLDER" --point "mini, 5.1M tokens=FOLDER" [--compare mesh:anchor ...]
    python -m results.commands.trend OUT            # written again from the trend.json OUT keeps
    python -m results.commands.trend OUT --check    # exit 1 when that would change a file

Each FOLDER is a report folder written by ``mesh-results`` (its runs.csv is read), optionally with
``@KEY=VALUE`` after it to keep the runs whose row-setting overrides include that (``one-pass/depth@
loops.distribution=fixed``); a comparison at a point takes the first of the point's folders where both
its arms ran on a common seed. Arms are named
as in experiments/conf/arm (``mesh_residual_read``). The default comparisons are the ones declared in
sweeps/conf/sweep/size_tokens.yaml. Writes trend.md, trend.csv and trend.json (what it was built from)
into OUT: :mod:`results.verdicts.trend` holds the rule.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pandas as pd

SPEC = "trend.json"
DECLARED = (
    ("mesh", "anchor"),
    ("mesh", "anchor_emb"),
    ("mesh", "base"),
    ("mesh_residual_read", "anchor"),
    ("mesh_residual_read", "anchor_emb"),
    ("mesh_residual_read", "base"),
)
TITLE = "MeSH against anchor and base at more tokens and at a larger size"


class TrendInputError(ValueError):
    """Bad input: one line naming the argument and the fix."""


def _point_text(text: str, flag: str) -> tuple[str, list[str]]:
    name, sep, folders = text.partition("=")
    if not sep or not name.strip() or not folders.strip():
        raise TrendInputError(
            f'{flag} {text!r}: give NAME=FOLDER[,FOLDER...], e.g. "tiny, 11.7M tokens=one-pass/size_tokens/tokens"'
        )
    return name.strip(), [f.strip() for f in folders.split(",") if f.strip()]


def _compare_text(text: str) -> tuple[str, str]:
    first, sep, second = text.partition(":")
    if not sep or not first or not second:
        raise TrendInputError(f"--compare {text!r}: give FIRST:SECOND arm names, e.g. mesh:anchor")
    return first, second


def read_runs(base: Path, text: str, flag: str) -> pd.DataFrame:
    """The runs.csv of the folder ``text`` names (relative to ``base``), kept to the runs whose
    overrides hold every ``@KEY=VALUE`` after the folder's name."""
    folder, *tokens = text.split("@")
    path = base / folder / "runs.csv"
    try:
        frame = pd.read_csv(path, dtype={"overrides": str, "status": str}, keep_default_na=False)
    except (OSError, pd.errors.ParserError, pd.errors.EmptyDataError) as error:
        raise TrendInputError(
            f"{flag}: {path} cannot be read ({str(error).splitlines()[0]}); give a folder mesh-results wrote"
        ) from None
    missing = [c for c in ("run_id", "status", "scheme", "seed", "val_loss") if c not in frame]
    if missing:
        raise TrendInputError(f"{flag}: {path} has no column {missing[0]!r}; give a runs.csv written by mesh-results")
    frame["val_loss"] = pd.to_numeric(frame["val_loss"].replace("", None), errors="coerce")
    frame["seed"] = pd.to_numeric(frame["seed"].replace("", None), errors="coerce")
    frame = frame[frame["seed"].notna()]
    if tokens:
        from results.rows.frame import parse_overrides

        wanted = dict(token.partition("=")[::2] for token in tokens)
        labels = frame.get("overrides", pd.Series("", index=frame.index)).fillna("")
        frame = frame[labels.map(lambda label: wanted.items() <= parse_overrides(label).items()).astype(bool)]
        if frame.empty:
            raise TrendInputError(f"{flag}: no run of {base / folder} has the overrides {' '.join(tokens)}")
    return frame


def build(spec: dict[str, Any], out: Path, base: Path) -> list[Path]:
    """Write the trend ``spec`` describes into ``out``; folders are relative to ``base``."""
    from results.render.trend import write_trend
    from results.rows.arms import arm_spec
    from results.verdicts.trend import Point, study

    def point(name: str, folders: Sequence[str], flag: str) -> Point:
        return Point(name, tuple((f, read_runs(base, f, flag)) for f in folders))

    name, folders = spec["reference"]
    reference = point(name, folders, "--reference")
    points = [point(name, folders, "--point") for name, folders in spec["points"]]
    arms = {name: arm_spec(name) for pair in spec["comparisons"] for name in pair}
    comparisons = [(arms[a], arms[b]) for a, b in spec["comparisons"]]
    written = write_trend(study(reference, points, comparisons), out, spec["title"])
    (out / SPEC).write_text(json.dumps(spec, indent=2) + "\n")
    return [*written, out / SPEC]


def differing(out: Path, base: Path) -> list[str]:
    """The files of ``out`` that building it again from its trend.json would change."""
    spec = json.loads((out / SPEC).read_text())
    with tempfile.TemporaryDirectory() as tmp:
        written = build(spec, Path(tmp), base)
        return [p.name for p in written if not (out / p.name).exists() or (out / p.name).read_bytes() != p.read_bytes()]


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m results.commands.trend", description=__doc__.splitlines()[0])
    parser.add_argument("out", type=Path, help="the folder trend.md, trend.csv and trend.json go to")
    parser.add_argument("--reference", help="NAME=FOLDER[,FOLDER...]: the point every other is compared with")
    parser.add_argument("--point", action="append", default=[], help="NAME=FOLDER[,FOLDER...], once per point")
    parser.add_argument("--compare", action="append", default=[], help="FIRST:SECOND arms (default: the declared six)")
    parser.add_argument("--title", default=TITLE)
    parser.add_argument("--base", type=Path, default=Path("."), help="folders are relative to this (default: .)")
    parser.add_argument("--check", action="store_true", help="change nothing; exit 1 when a rebuild would")
    args = parser.parse_args(argv)
    try:
        if args.reference or args.point:
            if not (args.reference and args.point):
                raise TrendInputError("give --reference and at least one --point (or neither, to rebuild OUT)")
            spec: dict[str, Any] = {
                "title": args.title,
                "reference": _point_text(args.reference, "--reference"),
                "points": [_point_text(p, "--point") for p in args.point],
                "comparisons": [_compare_text(c) for c in args.compare] or [list(c) for c in DECLARED],
            }
        elif (args.out / SPEC).is_file():
            spec = json.loads((args.out / SPEC).read_text())
        else:
            raise TrendInputError(f"{args.out}: no {SPEC} to rebuild from; give --reference and --point")
        if args.check:
            changed = differing(args.out, args.base)
            for name in changed:
                print(f"{args.out / name}: differs from a rebuild")
            print(f"{args.out}: " + ("as committed" if not changed else f"{len(changed)} files differ"))
            return 1 if changed else 0
        for path in build(spec, args.out, args.base):
            print(path)
        return 0
    except TrendInputError as error:
        print(f"trend: {error}", file=sys.stderr)
        return 2
    except Exception as error:
        from results.rows.frame import ResultsError

        if isinstance(error, ResultsError):
            print(f"trend: {error}", file=sys.stderr)
            return 2
        raise


if __name__ == "__main__":
    sys.exit(main())
