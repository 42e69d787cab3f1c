"""Read runs from the MLflow store into a tidy frame: one row per run, tags and final metrics as columns.

Only cell runs are read (a sweep's parent run, tag ``kind=sweep``, is left out). Every run is kept
whatever its status; :mod:`results.rows.aggregate` averages only the FINISHED ones and the report lists the
others. A metric's value is MLflow's latest (the last step logged).

A run logs only its summary probe metrics to MLflow (:data:`experiments.probing.files.SUMMARY_METRICS`);
every other ``probe/*`` value is read from its final probe table (:func:`final_probe_table`). A run
of before that logged them all, and keeps them: what MLflow holds wins.
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pandas as pd

from experiments.store.check import check_tracking_uri
from experiments.store.sqlite import reading_uri, resolve_tracking_uri, sqlite_path, store_damage
from results.rows.frame import (
    NONFINITE,
    NONFINITE_TAG,
    READ_ERROR,
    RUN_COLUMNS,
    TAG_COLUMNS,
    ResultsError,
    add_main_set,
)

FINAL_PROBES = "probes/final"  # a run's final probe files, under its run dir and as artifacts


QUIET_ARTIFACTS = {"MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR": "false"}  # one bar per file otherwise


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


def _probe_values_not_logged(client: Any, run: Any, folder: Path) -> dict[str, Any]:
    """The ``probe/*`` values of a probed run (one that logged any) that MLflow does not hold, from
    its final probe table; none for a run that logged every one (one with a value beyond
    :data:`~experiments.probing.files.SUMMARY_METRICS`: probed before the table) or none at all. A
    table that cannot be read is said in the run's ``read_error`` (the report lists it), not skipped."""
    from experiments.probing.files import SUMMARY_METRICS

    logged = run.data.metrics
    probed = [key for key in logged if key.startswith("probe/")]
    if not probed or not set(probed) <= set(SUMMARY_METRICS):  # not probed, or probed before the table
        return {}
    try:
        table = final_probe_table(client, run.info.run_id, run.data.tags.get("run_dir", ""), folder)
    except Exception as error:  # no table, or one that does not parse: the values stay unknown, said so
        return {READ_ERROR: f"probes/final/probes.csv: {type(error).__name__}: {str(error).splitlines()[0][:200]}"}
    return {key: value for key, value in table.items() if key.startswith("probe/") and key not in logged}


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
    NaN where empty); raises when it has none or it cannot be read."""
    from experiments.probing.files import TABLE_FILE, read_probe_table

    return read_probe_table(final_probe_file(client, run_id, run_dir, TABLE_FILE, folder))


def stages_file(client: Any, runs: pd.DataFrame, folder: Path) -> Path | None:
    """The ``stages.json`` of the ``seeds=auto`` grid whose cells are among ``runs``: logged on the
    parent run (tag ``kind=sweep``) of its first stage, downloaded into ``folder``; None when no
    parent of theirs has one."""
    wanted = set(runs["run_id"])
    ids = sorted(experiment_ids(client, sorted(set(runs["experiment"]))).values())
    if not ids or not wanted:
        return None
    for parent in client.search_runs(ids, "tags.kind = 'sweep'", max_results=10_000):
        run_id = parent.info.run_id
        if "stages.json" not in {a.path for a in client.list_artifacts(run_id)}:
            continue
        children = client.search_runs(ids, f"tags.mlflow.parentRunId = '{run_id}'", max_results=10_000)
        if wanted & {child.info.run_id for child in children}:
            with _environ(QUIET_ARTIFACTS):
                return Path(client.download_artifacts(run_id, "stages.json", str(folder / run_id)))
    return None


def probe_report_files(
    client: Any, rows: Iterable[Sequence[str]], run_dirs: Mapping[str, str] | None, folder: Path
) -> dict[str, Path]:
    """For each group of run ids (a row's seeds, in order), the first run's final ``probes.json``
    (:func:`final_probe_file`, downloaded into ``folder`` when not on this machine; ``run_dirs``:
    run id -> its run dir): run id -> path. Groups where no run has the file are left out."""
    from experiments.probing.files import REPORT_FILE

    files = {}
    for run_ids in rows:
        for run_id in run_ids:
            try:
                files[run_id] = final_probe_file(client, run_id, (run_dirs or {}).get(run_id, ""), REPORT_FILE, folder)
            except Exception:  # no probe artifact (probes off, failed, or not logged)
                continue
            break
    return files


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
