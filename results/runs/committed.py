"""A report folder's data read back: ``runs.csv`` (every run's tags, final metrics and the overrides
that set rows apart), ``curves.csv``, ``routing.csv``, ``train_loss.csv``, the probe reports under
``probe_reports/`` and ``report.json``: everything :func:`results.pipeline.rebuild_report` needs to
write the report again, whole, without the MLflow store.

:func:`read_runs_csv` reads ``runs.csv`` into the frame :func:`results.runs.store.collect_runs`
gives (tags as strings, times as timestamps, metrics as floats). Its ``params`` are the ones that
set rows apart, rebuilt from the ``overrides`` column (``key=value`` of each, as
:func:`results.rows.frame.overrides_label` wrote it; a key a run did not set is ``""``, unset), so
:func:`results.rows.aggregate.aggregate` groups the runs into the rows the store's params gave.
"""

from __future__ import annotations

import re
from pathlib import Path

import pandas as pd

from results.rows.depth import DepthData
from results.rows.frame import (
    PARAM_COLUMN,
    READ_ERROR,
    RUN_COLUMNS,
    TAG_COLUMNS,
    ResultsError,
    add_main_set,
    parse_overrides,
)

TEXT_COLUMNS = ("run_id", "run_name", "experiment", "status", *TAG_COLUMNS, READ_ERROR)


DERIVED = ("main_set", "val_ppl", "row", "duplicate_of")  # aggregate() and add_main_set() recompute them


def read_runs_csv(path: str | Path) -> pd.DataFrame:
    """The frame of ``collect_runs`` from a report's ``runs.csv``."""
    path = Path(path)
    try:
        header = pd.read_csv(path, nrows=0).columns
        text = (*TEXT_COLUMNS, "overrides", *(c for c in header if c.startswith(PARAM_COLUMN)))
        frame = pd.read_csv(path, dtype={c: str for c in text}, keep_default_na=False)
    except (OSError, pd.errors.ParserError, pd.errors.EmptyDataError) as error:
        raise ResultsError(f"--from-csv {path}: cannot be read: {str(error).splitlines()[0]}") from None
    if READ_ERROR not in frame:  # a runs.csv of before the column: nothing was recorded as unread
        frame = frame.assign(**{READ_ERROR: ""})
    missing = [c for c in RUN_COLUMNS if c != "params" and c not in frame]
    if missing:
        raise ResultsError(f"--from-csv {path}: no column {missing[0]!r}; give a runs.csv written by mesh-results")
    for column in frame.columns:
        if column in ("start_time", "end_time"):
            frame[column] = pd.to_datetime(frame[column].replace("", None), errors="coerce")
        elif column not in text:
            frame[column] = pd.to_numeric(frame[column].replace("", None), errors="coerce")
    frame["buffer_slots"] = [_integer_text(v) for v in frame["buffer_slots"]]
    frame["seed"] = [_integer_text(v) for v in frame["seed"]]
    labels = list(frame.pop("overrides")) if "overrides" in frame else [""] * len(frame)
    kept = {
        c.removeprefix(PARAM_COLUMN): [str(v) for v in frame.pop(c)] for c in list(frame) if c.startswith(PARAM_COLUMN)
    }
    frame = frame.drop(columns=[c for c in DERIVED if c in frame]).copy()
    params = params_from_overrides(labels)
    for key, values in kept.items():  # the params the report reads besides (KEPT_PARAMS); "" not logged
        for p, value in zip(params, values, strict=True):
            if value != "":
                p.setdefault(key, value)
    frame["params"] = params
    return add_main_set(frame)


def params_from_overrides(labels: list[str]) -> list[dict[str, str]]:
    """Each run's params that set rows apart, from its overrides label: every key any run's label
    names is given to every run (``""`` where its label does not name it: unset, as in the store)."""
    parsed = [parse_overrides(label or "") for label in labels]
    keys = sorted(set().union(*parsed)) if parsed else []
    return [{k: p.get(k, "") for k in keys} for p in parsed]


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


def read_routing_csv(path: Path) -> pd.DataFrame:
    """A report's ``routing.csv`` (the routing curves of its looped rows); empty when there is none."""
    from results.rows.routing import COLUMNS

    if not path.is_file():
        return pd.DataFrame(columns=list(COLUMNS))
    frame = pd.read_csv(path, dtype={"run_id": str, "row": str, "scheme": str, "seed": str})
    frame["seed"] = [_integer_text(v) for v in frame["seed"]]
    return frame


def read_histories_csv(path: Path) -> pd.DataFrame | None:
    """A report's ``train_loss.csv`` (run_id, step, value), or None when the folder does not keep it."""
    if not path.is_file():
        return None
    return pd.read_csv(path, dtype={"run_id": str})


def probe_report_files(folder: Path) -> dict[str, Path]:
    """run id -> its final ``probes.json`` kept under ``probe_reports/`` (none when not kept)."""
    return {p.stem: p for p in sorted(folder.glob("*.json"))} if folder.is_dir() else {}


def read_depth_csvs(folder: Path) -> DepthData:
    """A report's ``depth.csv`` and ``exit.csv`` (the depth study's curves); empty where not kept."""
    from results.rows.depth import DEPTH_COLUMNS, DEPTH_FILE, EXIT_COLUMNS, EXIT_FILE

    frames = []
    for name, columns in ((DEPTH_FILE, DEPTH_COLUMNS), (EXIT_FILE, EXIT_COLUMNS)):
        path = folder / name
        frames.append(
            pd.read_csv(
                path,
                dtype={"run_id": str, "rule": str, "set": str, "criterion": str, "training": str, "loop_rule": str},
            )
            if path.is_file()
            else pd.DataFrame(columns=list(columns))
        )
    return DepthData(*frames)
