"""Read runs from the MLflow store into a tidy frame: one row per run, tags and final metrics as columns.

Only cell runs are read (a sweep's parent run, tag ``kind=sweep``, is left out). Every run is kept
whatever its status; :mod:`results.aggregate` averages only the FINISHED ones and the report lists the
others. A metric's value is MLflow's latest (the last step logged).

A run logs only its summary probe metrics to MLflow (:data:`experiments.probing.files.SUMMARY_METRICS`);
every other ``probe/*`` value is read from its final probe table (:func:`final_probe_table`). A run
of before that logged them all, and keeps them: what MLflow holds wins.
"""

from __future__ import annotations

import math
import os
import tempfile
from collections.abc import Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pandas as pd

from experiments.identity import distinguishes_rows
from experiments.store.check import check_tracking_uri
from experiments.store.sqlite import reading_uri, resolve_tracking_uri, sqlite_path, store_damage

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
# the tag's line as its error, its own row (results.aggregate) and its own count in the report.
NONFINITE_TAG = "nonfinite"
NONFINITE = "NONFINITE"
RUN_COLUMNS = ("run_id", "run_name", "experiment", "status", "start_time", "end_time", *TAG_COLUMNS, "params")
AXIS_PARAMS = ("model", "scheme", "layout", "buffer_slots")  # shown in their own columns
FINAL_PROBES = "probes/final"  # a run's final probe files, under its run dir and as artifacts
QUIET_ARTIFACTS = {"MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR": "false"}  # one bar per file otherwise


class ResultsError(ValueError):
    """A bad request (unknown experiment, missing store); the message is one line."""


def tracking_uri_for(tracking_uri: str | None, runs_dir: str | Path = "runs", environment: bool = True) -> str:
    """``--tracking-uri``, then ``$MLFLOW_TRACKING_URI`` (unless not ``environment``: a ``--runs-dir``
    given on the command line names its store whatever the environment holds), then
    ``sqlite:///<runs_dir>/mlflow.db`` (as mesh-train resolves it); a sqlite file that does not exist
    is an error, not a new store."""
    uri = resolve_tracking_uri(tracking_uri, Path(runs_dir).expanduser(), os.environ if environment else {})
    uri = reading_uri(uri)  # a store this process cannot write is read read-only (experiments/store/sqlite.py)
    if (path := sqlite_path(uri)) is not None:
        if not path.exists():
            raise ResultsError(f"no MLflow store at {path}; run a sweep first, or pass --tracking-uri / --runs-dir")
        from experiments.store.sqlite import TrackingError, check_store_intact

        try:  # a damaged store answers in one line, as mesh-train does, not with SQLAlchemy's traceback
            check_store_intact(uri)
        except TrackingError as error:
            raise ResultsError(str(error)) from None
    else:
        try:
            check_tracking_uri(uri)
        except Exception as error:
            raise ResultsError(str(error)) from None
    return uri


def open_client(tracking_uri: str) -> Any:
    import mlflow

    return mlflow.MlflowClient(tracking_uri)


def experiment_ids(client: Any, names: Sequence[str]) -> dict[str, str]:
    """name -> id for each name; all experiments when ``names`` is empty. Unknown names fail with the known ones."""
    known = {e.name: e.experiment_id for e in client.search_experiments()}
    if not names:
        return known
    missing = [n for n in names if n not in known]
    if missing:
        listed = ", ".join(sorted(n for n in known if n != "Default")) or "(none)"
        raise ResultsError(f"experiment {', '.join(map(repr, missing))} not found in the store; known: {listed}")
    return {n: known[n] for n in names}


def _search(client: Any, ids: list[str], filter_string: str) -> Iterable[Any]:
    token = None
    while True:
        page = client.search_runs(ids, filter_string, max_results=1000, page_token=token)
        yield from page
        token = page.token
        if not token:
            return


def collect_runs(client: Any, experiments: Sequence[str] = (), filter_string: str = "") -> pd.DataFrame:
    """One row per cell run of ``experiments`` (all when empty) that passes ``filter_string``:
    the columns of :data:`RUN_COLUMNS` (``params`` holds the run's params as a dict), then one
    column per metric, named as in MLflow (``val/shakespeare/ppl``, ``val_loss``...), and the
    ``probe/*`` values a run that logged probes has in its final probe table and not in MLflow."""
    ids = experiment_ids(client, experiments)
    names = {v: k for k, v in ids.items()}
    try:
        runs = list(_search(client, list(ids.values()), filter_string))
    except Exception as error:  # a bad filter string (a damaged store is said by the caller)
        if store_damage(error) is not None:
            raise
        raise ResultsError(f"--filter {filter_string!r} is invalid: {str(error).splitlines()[0]}") from None
    records = []
    with tempfile.TemporaryDirectory() as tables:  # where a table not on this machine is downloaded
        for run in runs:
            if run.data.tags.get("kind") != "sweep":
                records.append({**_run_record(run, names), **_probe_values_not_logged(client, run, Path(tables))})
    frame = pd.DataFrame.from_records(records, columns=None if records else list(RUN_COLUMNS))
    for column in RUN_COLUMNS:
        if column not in frame:
            frame[column] = ""
    frame = add_main_set(frame)
    order = ["experiment", "preset", "layout", "scheme", "buffer_slots", "seed", "run_name"]
    return frame.sort_values(order, kind="stable", ignore_index=True) if len(frame) else frame


def _run_record(run: Any, experiment_names: dict[str, str]) -> dict[str, Any]:
    """The run's row: its :data:`RUN_COLUMNS`, then its metrics as MLflow holds them."""
    tags = run.data.tags
    record: dict[str, Any] = {
        "run_id": run.info.run_id,
        "run_name": run.info.run_name,
        "experiment": experiment_names.get(run.info.experiment_id, run.info.experiment_id),
        "status": run.info.status,
        "start_time": pd.to_datetime(run.info.start_time, unit="ms") if run.info.start_time else pd.NaT,
        "end_time": pd.to_datetime(run.info.end_time, unit="ms") if run.info.end_time else pd.NaT,
        **{column: tags.get(column, "") for column in TAG_COLUMNS},
        "params": dict(run.data.params),
    }
    if run.info.status == "FINISHED" and tags.get(NONFINITE_TAG):  # finished, on non-finite losses
        record["status"], record["error"] = NONFINITE, tags[NONFINITE_TAG]
    if not record["seed"]:
        record["seed"] = run.data.params.get("seed", "")
    if not record["preset"]:
        record["preset"] = run.data.params.get("model", "")
    return {**record, **run.data.metrics}


def _probe_values_not_logged(client: Any, run: Any, folder: Path) -> dict[str, float]:
    """The ``probe/*`` values of a probed run (one that logged any) that MLflow does not hold, from
    its final probe table; none for a run that logged every one (one with a value beyond
    :data:`~experiments.probing.files.SUMMARY_METRICS`: probed before the table) or none at all."""
    from experiments.probing.files import SUMMARY_METRICS

    logged = run.data.metrics
    probed = [key for key in logged if key.startswith("probe/")]
    if not probed or not set(probed) <= set(SUMMARY_METRICS):  # not probed, or probed before the table
        return {}
    table = final_probe_table(client, run.info.run_id, run.data.tags.get("run_dir", ""), folder)
    return {key: value for key, value in table.items() if key.startswith("probe/") and key not in logged}


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
        ppls.append(float(ppl) if _finite(ppl) else math.nan)
    frame["main_set"] = mains
    frame["val_ppl"] = ppls
    return frame


def _finite(value: Any) -> bool:
    return isinstance(value, (int, float)) and math.isfinite(value)


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


def metric_histories(client: Any, run_ids: Iterable[str], key: str = "train/loss") -> pd.DataFrame:
    """Long frame (run_id, step, value) of ``key`` for each run."""
    rows = []
    for run_id in run_ids:
        rows += [(run_id, m.step, m.value) for m in client.get_metric_history(run_id, key)]
    return pd.DataFrame(rows, columns=["run_id", "step", "value"])


def final_probe_file(client: Any, run_id: str, run_dir: str, name: str, folder: Path) -> Path:
    """The run's final probe file ``name`` (``probes.csv``, ``probes.json``): the one under its run
    dir when this machine has it, else the artifact ``probes/final/<name>`` downloaded into
    ``folder`` (a remote store, or runs moved away); raises when the run has none."""
    local = Path(run_dir) / FINAL_PROBES / name if run_dir else None
    if local is not None and local.is_file():
        return local
    with _environ(QUIET_ARTIFACTS):
        return Path(client.download_artifacts(run_id, f"{FINAL_PROBES}/{name}", str(folder / run_id)))


def final_probe_table(client: Any, run_id: str, run_dir: str, folder: Path) -> dict[str, float]:
    """Every probe value of the run's final probe table (:func:`final_probe_file` ``probes.csv``,
    NaN where empty); empty when it has none or it cannot be read."""
    from experiments.probing.files import TABLE_FILE, read_probe_table

    try:
        return read_probe_table(final_probe_file(client, run_id, run_dir, TABLE_FILE, folder))
    except Exception:  # no table (a run of before it, probes off or failed) or one that does not parse
        return {}


def probe_reports(
    client: Any, rows: Iterable[Sequence[str]], run_dirs: Mapping[str, str] | None = None
) -> dict[str, Any]:
    """For each group of run ids (a row's seeds, in order), the first run's
    :class:`~mesh_model.probes.ProbeReport` read from its final ``probes.json``
    (:func:`final_probe_file`; ``run_dirs``: run id -> its run dir): run id -> report. Groups where
    no run has the file are left out."""
    from experiments.probing.files import REPORT_FILE, load_report

    reports = {}
    with tempfile.TemporaryDirectory() as tmp:
        for run_ids in rows:
            for run_id in run_ids:
                try:
                    path = final_probe_file(client, run_id, (run_dirs or {}).get(run_id, ""), REPORT_FILE, Path(tmp))
                except Exception:  # no probe artifact (probes off, failed, or not logged)
                    continue
                reports[run_id] = load_report(path)
                break
    return reports


@contextmanager
def _environ(values: dict[str, str]) -> Iterator[None]:
    saved = {k: os.environ.get(k) for k in values}
    os.environ.update(values)
    try:
        yield
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


__all__ = [
    "ResultsError",
    "collect_runs",
    "experiment_ids",
    "final_probe_file",
    "final_probe_table",
    "grouping_params",
    "metric_histories",
    "open_client",
    "probe_reports",
    "tracking_uri_for",
    "validation_sets",
]
