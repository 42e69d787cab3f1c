"""Rebuild ``claims.md`` from a committed ``runs.csv`` when the MLflow store is not at hand (with its
"Over training" section from the ``curves.csv`` beside it, the sequential design's decisions from
the ``seeds_auto.log`` in the folder), and refresh the ranking, the claims and the design in the
``report.md`` there (its tables and figures stay as they were).

``runs.csv`` (written by every report) holds each run's tags and final metrics but not its params;
:func:`read_runs_csv` reads it back into the frame :func:`results.runs.store.collect_runs` gives
(tags as strings, times as timestamps, metrics as floats, ``params`` an empty dict per run), so
:func:`results.rows.aggregate.aggregate` groups it as it would the store's runs. Rows that differed only
by a param override (not a tag) cannot be told apart without the params, so a runs.csv whose
``overrides`` column is set is refused (one line) rather than grouped wrongly.
"""

from __future__ import annotations

import re
from pathlib import Path

import pandas as pd

from results.rows.frame import RUN_COLUMNS, TAG_COLUMNS, ResultsError, add_main_set

TEXT_COLUMNS = ("run_id", "run_name", "experiment", "status", *TAG_COLUMNS)


DERIVED = ("main_set", "val_ppl", "row", "duplicate_of")  # aggregate() and add_main_set() recompute them


def read_runs_csv(path: str | Path) -> pd.DataFrame:
    """The frame of ``collect_runs`` from a report's ``runs.csv``."""
    path = Path(path)
    try:
        frame = pd.read_csv(path, dtype={c: str for c in (*TEXT_COLUMNS, "overrides")}, keep_default_na=False)
    except (OSError, pd.errors.ParserError, pd.errors.EmptyDataError) as error:
        raise ResultsError(f"--from-csv {path}: cannot be read: {str(error).splitlines()[0]}") from None
    missing = [c for c in RUN_COLUMNS if c != "params" and c not in frame]
    if missing:
        raise ResultsError(f"--from-csv {path}: no column {missing[0]!r}; give a runs.csv written by mesh-results")
    for column in frame.columns:
        if column in ("start_time", "end_time"):
            frame[column] = pd.to_datetime(frame[column].replace("", None), errors="coerce")
        elif column not in (*TEXT_COLUMNS, "overrides"):
            frame[column] = pd.to_numeric(frame[column].replace("", None), errors="coerce")
    frame["buffer_slots"] = [_integer_text(v) for v in frame["buffer_slots"]]
    frame["seed"] = [_integer_text(v) for v in frame["seed"]]
    overrides = sorted({o for o in frame.pop("overrides") if o}) if "overrides" in frame else []
    if overrides:
        raise ResultsError(
            f"--from-csv {path}: rows differ by param overrides ({overrides[0]!r}), which runs.csv does not "
            "keep; rebuild from the MLflow store (mesh-results NAME)"
        )
    frame = frame.drop(columns=[c for c in DERIVED if c in frame]).copy()
    frame["params"] = [{} for _ in range(len(frame))]
    return add_main_set(frame)


def _integer_text(value: str) -> str:
    """``5.0`` -> ``5`` (a column pandas once wrote as floats); other text unchanged."""
    return value[:-2] if re.fullmatch(r"-?\d+\.0", value) else value


def read_curves_csv(path: Path) -> pd.DataFrame | None:
    """A report's ``curves.csv`` (every validation step of every run), or None when there is none."""
    if not path.is_file():
        return None
    frame = pd.read_csv(path, dtype={"run_id": str, "row": str, "scheme": str, "seed": str, "block": str})
    frame["seed"] = [_integer_text(v) for v in frame["seed"]]
    return frame
