"""Read runs from the MLflow store into a tidy frame: one row per run, tags and final metrics as columns.

Only cell runs are read (a sweep's parent run, tag ``kind=sweep``, is left out). Every run is kept
whatever its status; :mod:`results.rows.aggregate` averages only the FINISHED ones and the report lists the
others. A metric's value is MLflow's latest (the last step logged).

A run logs only its summary probe metrics to MLflow (:data:`experiments.probing.files.SUMMARY_METRICS`);
every other ``probe/*`` value is read from its final probe table (:func:`final_probe_table`). A run
of before that logged them all, and keeps them: what MLflow holds wins.
"""

from __future__ import annotations

import math
import re
from collections.abc import Sequence
from typing import Any

import pandas as pd

from experiments.identity import distinguishes_rows

TAG_COLUMNS = (
    "preset",
    "scheme",
    "layout",
    "seed",
    "buffer_slots",
    "config_hash",
    "git_commit",
    "sweep",
    "run_dir",
    "optuna_trial",
    "error",
    "pruned",
)


# A run that trained on past a non-finite loss (allow_nonfinite=true) ends FINISHED with this tag
# (experiments.callbacks.divergence.NONFINITE_TAG); it is read back with the status NONFINITE and
# the tag's line as its error, its own row (results.rows.aggregate) and its own count in the report.
NONFINITE_TAG = "nonfinite"


NONFINITE = "NONFINITE"


READ_ERROR = "read_error"  # what of a run could not be read back (its probe table...): listed by the report
RUN_COLUMNS = (
    "run_id",
    "run_name",
    "experiment",
    "status",
    "start_time",
    "end_time",
    *TAG_COLUMNS,
    READ_ERROR,
    "params",
)


AXIS_PARAMS = ("model", "scheme", "layout", "buffer_slots")  # shown in their own columns


class ResultsError(ValueError):
    """A bad request (unknown experiment, missing store); the message is one line."""


def validation_sets(frame: pd.DataFrame) -> list[str]:
    """The validation sets that runs report (``val/<set>/loss``): main sets first, then the others by name."""
    sets = sorted({c.split("/")[1] for c in frame.columns if c.startswith("val/") and c.endswith("/loss")})
    main = frame["main_set"].value_counts().index.tolist() if "main_set" in frame and len(frame) else []
    return [s for s in main if s in sets] + [s for s in sets if s not in main]


def add_main_set(frame: pd.DataFrame) -> pd.DataFrame:
    """Columns ``main_set`` (the run's ``data.corpus``, or the set whose loss is ``val_loss``) and
    ``val_ppl`` (the PPL of that set): every run's headline numbers, whatever its corpus."""
    frame = frame.copy()
    sets = sorted({c.split("/")[1] for c in frame.columns if c.startswith("val/") and c.endswith("/loss")})
    mains, ppls = [], []
    for _, run in frame.iterrows():
        main = run["params"].get("data.corpus", "") if isinstance(run["params"], dict) else ""
        if main not in sets:
            loss = run.get("val_loss")
            close = [s for s in sets if _finite(run.get(f"val/{s}/loss")) and _finite(loss)]
            close = [s for s in close if math.isclose(run[f"val/{s}/loss"], loss, rel_tol=1e-9)]
            main = close[0] if close else (sets[0] if len(sets) == 1 else "")
        mains.append(main)
        ppl = run.get(f"val/{main}/ppl") if main else None
        ppls.append(float(ppl) if ppl is not None and _finite(ppl) else math.nan)
    frame["main_set"] = mains
    frame["val_ppl"] = ppls
    return frame


def _finite(value: Any) -> bool:
    return isinstance(value, (int, float)) and math.isfinite(value)


# The params a report reads beyond those that set rows apart (the steps and corpus of "What was run",
# the LR of the LR sensitivity): kept in runs.csv as ``param:<key>`` columns, so that a report rebuilt
# from its folder reads what the store gave.
KEPT_PARAMS = ("max_steps", "data.corpus", "peak_lr")
PARAM_COLUMN = "param:"


def runs_table(frame: pd.DataFrame) -> pd.DataFrame:
    """``runs.csv``: ``frame`` without its params dicts, with a ``param:<key>`` column per
    :data:`KEPT_PARAMS` (empty where a run did not log it)."""
    table = frame.drop(columns=["params"])
    for key in KEPT_PARAMS:
        table[PARAM_COLUMN + key] = [
            p.get(key, "") if isinstance(p, dict) else "" for p in frame.get("params", [None] * len(frame))
        ]
    return table


def grouping_params(frame: pd.DataFrame) -> list[str]:
    """The params (besides the seed and the axes of their own columns) whose value differs between
    finished runs: the other overrides that make two runs different rows. Only params that every
    finished run logged count (runs logged without params group by their tags alone)."""
    finished = frame[frame["status"] == "FINISHED"]
    dicts = [p for p in finished["params"] if isinstance(p, dict)]
    if not dicts or len(dicts) < len(finished):
        return []
    every = set().union(*(set(p) for p in dicts))
    free = {*FREE_MAPPINGS, *(k for p in dicts for k, v in p.items() if v == "{}")}
    keys = []
    for key in sorted(every):
        if key in AXIS_PARAMS or not distinguishes_rows(key):  # experiments.identity: one definition
            continue
        values = [_param(p, key, free) for p in dicts]
        if None not in values and len(set(values)) > 1:
            keys.append(key)
    return keys


# Mappings whose keys a run sets freely (flatten logs one param per key set, or ``{}`` when none
# is): a key a run did not log under them is unset there, not unknown.
FREE_MAPPINGS = ("model_overrides", "optim.lr_by_scheme")


def _param(params: dict[str, str], key: str, free: set[str]) -> str | None:
    """``params[key]``; "" (unset) for a key under a free mapping the run did not set (MeSH's
    control beside an arm's ``model_overrides.mesh_router_init=own_slot``, or one arm's
    ``mesh_router_norm`` beside another's ``mesh_router_init``); None where the run did not log
    it (a run of an older version, without the setting: its rows are told apart by the rest)."""
    if key in params:
        return params[key]
    parts = key.split(".")
    return "" if any(".".join(parts[:i]) in free for i in range(1, len(parts))) else None


def overrides_label(params: dict[str, str] | Any, keys: Sequence[str]) -> str:
    """``key=value`` of each key the run set (a key it left unset, such as the control's override of
    an arm, says nothing)."""
    if not isinstance(params, dict):
        return ""
    return " ".join(f"{k}={params[k]}" for k in keys if params.get(k, "") != "")


_KEY = re.compile(r"(?:^| )([A-Za-z_+][\w.+-]*)=")


def parse_overrides(label: str) -> dict[str, str]:
    """``optim.lr=0.004 model_overrides.mesh_router_z_coef=0.001`` -> ``{key: value}`` (a value may
    hold spaces: it runs to the next `` key=``): what :func:`overrides_label` wrote, read back."""
    starts = list(_KEY.finditer(label))
    return {
        m.group(1): label[m.end() : starts[i + 1].start() if i + 1 < len(starts) else len(label)].strip()
        for i, m in enumerate(starts)
    }
