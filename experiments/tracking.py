"""MLflow: where runs go, the check that the store answers, the record every run keeps, and where
the UI shows them (:func:`runs_list_url`).

:class:`RunRecord` is a training run's MLflow run (open or resume, log its facts, mark it failed,
finish it); :func:`log_metrics` and :func:`log_params` are the one place that batches writes to
MLflow's per-request limits.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import shlex
import sqlite3
import subprocess
import sys
import threading
import time
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from experiments.console import script_command
from experiments.locks import file_lock
from experiments.store_template import copy_empty_store, forget_engine, forget_template

DEFAULT_DB = "mlflow.db"
# A sqlite database's files: the database, and its rollback journal or WAL and shared memory.
SQLITE_FILE_SUFFIXES = ("", "-journal", "-wal", "-shm")
# MLflow's per-request limits of log_batch.
METRICS_PER_BATCH = 1000
PARAMS_PER_BATCH = 100
PARAM_VALUE_LIMIT = 6000


class TrackingError(RuntimeError):
    """The tracking store cannot be used; the message is one line."""


def resolve_tracking_uri(configured: str | None, runs_dir: Path, environ: Mapping[str, str]) -> str:
    """Config key, then ``$MLFLOW_TRACKING_URI``, then a sqlite file in ``runs_dir``."""
    uri = configured or environ.get("MLFLOW_TRACKING_URI")
    if uri:
        return uri
    return f"sqlite:///{(runs_dir / DEFAULT_DB).resolve()}"


def prepare_sqlite_store(uri: str, rebuild: bool = False) -> None:
    """Make sure a local sqlite store exists and is complete, and put it in WAL mode.

    Creation is serialised by a file lock beside the database, so the first runs of a parallel
    grid do not race to create its tables. Creating a store leaves a ``.<name>.creating`` marker
    beside it until the store opens: a store whose creation was cut short (a full disk, a kill)
    still has it, and is moved aside and created again. A store that is damaged (truncated,
    malformed) is never replaced on its own, as its runs would vanish from every report: it stops
    with one line saying how to recover it, unless ``rebuild`` (``tracking.rebuild_store=true``)
    sets it aside. WAL lets the processes of a parallel sweep write side by side (readers never
    block, writers queue); it is a property of the file and needs a local disk (not NFS): on a
    cluster, use an MLflow server with a database.
    """
    path = sqlite_path(uri)
    if path is None:
        return
    path.parent.mkdir(parents=True, exist_ok=True)
    with file_lock(path.with_name(f".{path.name}.lock")):
        _open_or_rebuild(uri, path, rebuild)
        with sqlite3.connect(path, timeout=60) as connection:
            if connection.execute("PRAGMA journal_mode").fetchone()[0].lower() != "wal":
                connection.execute("PRAGMA journal_mode=WAL")


def _creating_marker(path: Path) -> Path:
    return path.with_name(f".{path.name}.creating")


def is_being_created(path: Path) -> bool:
    """Whether this tool began creating the store ``path`` and never finished (it may be replaced)."""
    return _creating_marker(path).exists()


def _open_or_rebuild(uri: str, path: Path, rebuild: bool = False) -> None:
    existed = path.exists() and path.stat().st_size > 0
    marker = _creating_marker(path)
    if not existed:
        marker.touch()  # removed once the store opens: left behind, it says creation never finished
        _create(uri, path)
        return
    try:
        _open_store(uri)
        marker.unlink(missing_ok=True)  # it opens: whatever made it finished
        return
    except Exception as error:  # sqlalchemy/MLflow raise several kinds for a half-made schema
        reason = _first_line(error)
    if marker.exists():
        _set_aside(uri, path, "incomplete", f"was incomplete ({reason})")
    elif rebuild:
        _set_aside(uri, path, "damaged", f"cannot be opened ({reason}); tracking.rebuild_store=true")
    elif (damage := sqlite_damage(path)) is not None or _count_runs(path) > 0:
        raise TrackingError(damaged_store_line(path, damage or reason)) from None
    else:  # intact sqlite, no run in it: a store cut short before the creation marker existed
        _set_aside(uri, path, "incomplete", f"was incomplete ({reason})")
    marker.touch()
    _create(uri, path)


def _create(uri: str, path: Path) -> None:
    try:
        if not _open_copied_empty_store(uri, path):
            _open_store(uri)
    except Exception as error:  # creating it failed now (a full disk...): the next start rebuilds it
        raise TrackingError(f"the MLflow store {path} could not be created ({_first_line(error)})") from None
    _creating_marker(path).unlink(missing_ok=True)


def _set_aside(uri: str, path: Path, label: str, why: str) -> None:
    aside = path.with_name(f"{path.name}.{label}-{time.strftime('%Y%m%d-%H%M%S')}")
    for suffix in SQLITE_FILE_SUFFIXES:
        if Path(f"{path}{suffix}").exists():
            os.replace(f"{path}{suffix}", f"{aside}{suffix}")
    print(f"[mesh] the MLflow store {path} {why}; moved to {aside.name}, created anew", file=sys.stderr)
    forget_engine(uri)


def damaged_store_line(path: Path, reason: str) -> str:
    """What a damaged store is, and the two ways on, in one line."""
    recovered = path.with_name(f"{path.stem}-recovered{path.suffix}")
    return (
        f"the MLflow store {path} is damaged ({reason}); recover its runs with "
        f'sqlite3 {path} ".recover" | sqlite3 {recovered} and use tracking_uri=sqlite:///{recovered}, '
        "or set tracking.rebuild_store=true to move it aside and start an empty store"
    )


def sqlite_damage(path: Path) -> str | None:
    """Why the sqlite file ``path`` is damaged (shorter than its header says, malformed pages, not
    a database), or None when it reads. Cheap: the header, then one count over the runs table."""
    try:
        with open(path, "rb") as f:
            header = f.read(100)
        size = path.stat().st_size
    except OSError as error:
        return error.strerror or type(error).__name__
    if not header.startswith(b"SQLite format 3\x00"):
        return "not a SQLite database"
    page_size = int.from_bytes(header[16:18], "big")
    page_size = 65536 if page_size == 1 else page_size
    pages = int.from_bytes(header[28:32], "big")
    if header[24:28] == header[92:96] and pages and size < pages * page_size:
        return f"truncated: {size} bytes of the {pages * page_size} its header records"
    try:
        connection = sqlite3.connect(f"file:{path}?mode=ro", uri=True, timeout=10)
        try:
            connection.execute("SELECT count(*) FROM runs").fetchone()
        finally:
            connection.close()
    except sqlite3.OperationalError as error:
        if "no such table" in str(error) or "locked" in str(error):
            return None  # a schema never made (incomplete, not damaged), or a writer holding it now
        return _first_line(error)
    except sqlite3.Error as error:
        return _first_line(error)
    return None


def check_store_intact(uri: str) -> None:
    """Raise :class:`TrackingError` (one line) when ``uri`` is a local sqlite store that is damaged."""
    path = sqlite_path(uri)
    damage = sqlite_damage(path) if path is not None and path.is_file() and path.stat().st_size > 0 else None
    if damage is not None:
        raise TrackingError(damaged_store_line(path, damage))  # type: ignore[arg-type]


def _open_copied_empty_store(uri: str, path: Path) -> bool:
    """A new store from the empty one made once (:mod:`experiments.store_template`); a copy that does
    not open is removed with its template, and the store is made the slow way."""
    if not copy_empty_store(path):
        return False
    try:
        _open_store(uri)
        return True
    except Exception:
        forget_engine(uri)
        forget_template()
        for suffix in SQLITE_FILE_SUFFIXES:
            Path(f"{path}{suffix}").unlink(missing_ok=True)
        return False


def _open_store(uri: str) -> None:
    import mlflow

    mlflow.MlflowClient(uri).search_experiments(max_results=1)


def _first_line(error: BaseException) -> str:
    return (str(error).strip().splitlines() or [type(error).__name__])[0][:200]


def _count_runs(path: Path) -> int:
    try:
        connection = sqlite3.connect(f"file:{path}?mode=ro", uri=True, timeout=10)
    except sqlite3.Error:
        return 0
    try:
        return int(connection.execute("SELECT count(*) FROM runs").fetchone()[0])
    except sqlite3.Error:
        return 0
    finally:
        connection.close()


def peek_run(uri: str, run_id: str, tag: str) -> tuple[str, str | None] | None:
    """(status, value of ``tag`` or None) of run ``run_id`` of a local sqlite store, read from the
    file without MLflow (whose import and store check take about 6 s of CPU): what
    ``mesh-sweep --status`` needs of a grid's parent. None where ``uri`` is not a sqlite file, the
    run is not in it, or it does not read; then ask MLflow."""
    path = sqlite_path(uri)
    if path is None or not path.is_file():
        return None
    try:
        connection = sqlite3.connect(f"file:{path}?mode=ro", uri=True, timeout=10)
    except sqlite3.Error:
        return None
    try:
        row = connection.execute("SELECT status FROM runs WHERE run_uuid = ?", (run_id,)).fetchone()
        value = connection.execute("SELECT value FROM tags WHERE run_uuid = ? AND key = ?", (run_id, tag)).fetchone()
    except sqlite3.Error:
        return None
    finally:
        connection.close()
    return None if row is None else (str(row[0]), None if value is None else str(value[0]))


def sqlite_path(uri: str) -> Path | None:
    """The database file of a local sqlite store (relative to the working directory if the URI
    is); None for any other store."""
    if not uri.startswith("sqlite:///"):
        return None
    path = Path(uri.removeprefix("sqlite:///").split("?", 1)[0])
    return path if path.is_absolute() else Path.cwd() / path


def artifact_location(uri: str, experiments_dir: Path) -> str | None:
    """Where a new experiment keeps its artifacts: ``<runs_dir>/<experiment>/mlartifacts`` next to
    the runs for a local store; the server's own default for any other store."""
    return (experiments_dir / "mlartifacts").as_uri() if sqlite_path(uri) is not None else None


@contextmanager
def isolated_tracking_uri() -> Iterator[None]:
    """Undo what ``mlflow.set_tracking_uri`` (called inside Lightning's MLFlowLogger) leaves in the
    process and its environment, so one in-process run cannot redirect the next one."""
    import mlflow
    from mlflow.tracking._tracking_service import utils

    saved_env = os.environ.get("MLFLOW_TRACKING_URI")
    saved_uri = utils._tracking_uri
    try:
        yield
    finally:
        if utils._tracking_uri != saved_uri:
            mlflow.set_tracking_uri(saved_uri)  # type: ignore[arg-type]  # None unsets it
        if saved_env is None:
            os.environ.pop("MLFLOW_TRACKING_URI", None)
        else:
            os.environ["MLFLOW_TRACKING_URI"] = saved_env


def flatten(tree: Mapping[str, Any], prefix: str = "") -> dict[str, str]:
    """Dotted keys -> string values, for MLflow params."""
    flat: dict[str, str] = {}
    for key, value in tree.items():
        name = f"{prefix}{key}"
        if isinstance(value, Mapping) and value:
            flat.update(flatten(value, f"{name}."))
        else:
            flat[name] = str(value)
    return flat


def git_commit(path: Path) -> str:
    try:
        out = subprocess.run(
            ["git", "-C", str(path), "rev-parse", "HEAD"], capture_output=True, text=True, timeout=5, check=True
        )
        dirty = subprocess.run(
            ["git", "-C", str(path), "status", "--porcelain", "--untracked-files=no"],
            capture_output=True,
            text=True,
            timeout=5,
        ).stdout.strip()
        return out.stdout.strip() + ("-dirty" if dirty else "")
    except (OSError, subprocess.SubprocessError):
        return "unknown"


# The MLflow UI's address when ``mlflow ui`` serves a local store (its default host and port).
LOCAL_UI = "http://127.0.0.1:5000"
WORKFLOW = "workflowType=machine_learning"  # the UI's runs pages, not its GenAI (traces) pages
# MLflow's run note: the run page's "Description", rendered as Markdown.
NOTE_TAG = "mlflow.note.content"
TAG_VALUE_LIMIT = 8000  # MLflow's limit on a tag's value (mlflow.utils.validation.MAX_TAG_VAL_LENGTH)


# The experiment views (see :func:`key_metrics_view`, :func:`grouped_view`): MLflow's UI loads a
# view kept in the experiment tag ``mlflow.sharedViewState.<key>`` when the page's URL carries
# ``viewStateShareKey=<key>``.
KEY_METRICS_VIEW = "mesh-key-metrics"
GROUPED_VIEW = "mesh-grouped"
SHARED_VIEW_TAG = "mlflow.sharedViewState."
MODEL_METRICS_SECTION = "Model metrics"  # the UI's chart section of the metrics without a "/"
SPEED_SECTION = "Speed"
SPEED_METRICS = ("train/tokens_per_s", "time/steps_per_s")
# Metrics that say how a run or a grid was set up, not how runs compare: no chart in the views.
# cells_<status>: a sweep's parent run, one per status of sweeps/cells.py STATUSES.
BOOKKEEPING_METRICS = (
    "epoch",
    "global_batch",
    "tokens_per_step",
    "tokens_planned",
    "data_train_tokens",
    "flops_per_token",
    *(f"cells_{s}" for s in ("finished", "skipped", "failed", "pruned", "interrupted", "not_started")),
)
# Only training runs (every one is tagged with its seed; a sweep's parent run is not): the parent,
# a row of dashes, stays out of the list and the charts.
TRAINING_RUNS_FILTER = "tags.seed IS NOT NULL"
ROW_TAG = "row"  # a run's row in the report: its config without the seed (results.publish writes it)
RUN_COLOR_TAG = "mlflow.runColor"  # the run's colour in the UI's charts


def run_color(scheme: str) -> str:
    """A run's colour in the UI: its scheme's in the report's figures, so a scheme's seeds share it."""
    from mesh_model.probe_plots import scheme_color  # mesh_model imports torch: only when asked

    return scheme_color(scheme)


def key_metrics_view(val_sets: Sequence[str]) -> dict[str, Any]:
    """The runs page as a grid is read: every training run in one flat list (a sort other than by
    date stops MLflow nesting cells under the sweep's collapsed parent; the parent itself is left
    out, :data:`TRAINING_RUNS_FILTER`), best validation loss first, the validation perplexities,
    losses and the run's coordinates as columns, all runs in the charts (each in its scheme's
    colour, :data:`RUN_COLOR_TAG`), the chart sections of validation, training and speed first,
    and no charts of :data:`BOOKKEEPING_METRICS`.

    MLflow 3.17 orders chart sections alphabetically (``RunsChartsCardConfig`` in
    ``runs-charts.types.ts``), which puts the ``probe/...`` sections before ``val/...`` and
    ``train``; a view marked as reordered keeps its sections in the given order and appends
    any others after them. A chart the view lists for a metric is kept as listed (its section, or
    ``deleted``) instead of being generated. The state is the UI's own (``ExperimentPageUIState``
    and the search facets); the UI fills in every field left out with its default."""
    sets = list(dict.fromkeys(val_sets))
    names = [*(f"val/{s}" for s in sets), "train", SPEED_SECTION, MODEL_METRICS_SECTION]
    sections = {name: f"mesh-section-{i}" for i, name in enumerate(names)}
    columns = [f"metrics.`val/{s}/ppl`" for s in sets] + ["metrics.`val_loss`", "metrics.`train/loss`"]
    columns += [f"tags.`{tag}`" for tag in ("scheme", "layout", "buffer_slots", "seed")]
    charts = [_line_chart(m, sections[SPEED_SECTION]) for m in SPEED_METRICS]
    charts += [_line_chart(m, sections[MODEL_METRICS_SECTION], deleted=True) for m in BOOKKEEPING_METRICS]
    return {
        "searchFilter": TRAINING_RUNS_FILTER,
        "orderByKey": "metrics.`val_loss`",
        "orderByAsc": True,
        "selectedColumns": columns,
        "runsHiddenMode": "SHOW_ALL",
        "compareRunSections": [
            {"uuid": uuid, "name": name, "display": True, "isReordered": False} for name, uuid in sections.items()
        ],
        "compareRunCharts": charts,
        "isAccordionReordered": True,
    }


def grouped_view(val_sets: Sequence[str], group_by: str) -> dict[str, Any]:
    """:func:`key_metrics_view` with the seeds of a row folded into one group: the finished training
    runs grouped by the tag ``group_by`` (``scheme`` where the grid varies only the scheme, else
    :data:`ROW_TAG`, the config without its seed), each group showing the average of its runs, the
    groups ranked by the main set's validation PPL. The charts draw every seed in its scheme's
    colour (``useGroupedValuesInCharts`` off: MLflow colours a group by a hash of its name and keeps
    a chosen colour only in the browser); the spread between seeds is what they show."""
    view = key_metrics_view(val_sets)
    sets = list(dict.fromkeys(val_sets))
    view.update(
        {
            "searchFilter": f"{TRAINING_RUNS_FILTER} AND attributes.status = 'FINISHED'",
            "orderByKey": f"metrics.`val/{sets[0]}/ppl`" if sets else "metrics.`val_loss`",
            "groupBy": {"aggregateFunction": "average", "groupByKeys": [{"mode": "tag", "groupByData": group_by}]},
            "useGroupedValuesInCharts": False,
        }
    )
    if group_by != "scheme":
        view["selectedColumns"].append(f"tags.`{group_by}`")
    return view


def _line_chart(metric: str, section: str, deleted: bool = False) -> dict[str, Any]:
    """A line chart card of ``metric`` in the section ``section``, in the UI's own shape (the fields
    ``RunsChartsLineCardConfig`` sets; those it leaves undefined are left out)."""
    return {
        "uuid": f"{section}-{metric}",
        "type": "LINE",
        "runsCountToCompare": 10,
        "metricSectionId": section,
        "deleted": deleted,
        "isGenerated": True,
        "displayName": metric.rsplit("/", 1)[-1],
        "metricKey": metric,
        "lineSmoothness": 0,
        "xAxisScaleType": "linear",
        "scaleType": "linear",
        "range": {},
        "xAxisKey": "step",
        "selectedXAxisMetricKey": "",
        "yAxisKey": "metric",
        "yAxisExpressions": [],
        "ignoreOutliers": False,
        "useGlobalXaxisKey": True,
        "useGlobalLineSmoothing": True,
    }


def write_key_metrics_view(client: Any, experiment_id: str, val_sets: Sequence[str]) -> str:
    """Keep :func:`key_metrics_view` in the experiment (replacing an earlier one); its key."""
    client.set_experiment_tag(experiment_id, SHARED_VIEW_TAG + KEY_METRICS_VIEW, json.dumps(key_metrics_view(val_sets)))
    return KEY_METRICS_VIEW


def write_grouped_view(client: Any, experiment_id: str, val_sets: Sequence[str], group_by: str) -> str:
    """Keep :func:`grouped_view` in the experiment (replacing an earlier one); its key."""
    view = grouped_view(val_sets, group_by)
    client.set_experiment_tag(experiment_id, SHARED_VIEW_TAG + GROUPED_VIEW, json.dumps(view))
    return GROUPED_VIEW


def _ui_page(tracking_uri: str, page: str) -> str:
    """``page`` (after the UI's ``#/``) on the tracking server, or at :data:`LOCAL_UI` once
    ``mlflow ui`` serves a local store."""
    if tracking_uri.startswith(("http://", "https://")):
        return f"{tracking_uri.rstrip('/')}/{page}"
    return f"{LOCAL_UI}/{page}"


def ui_command(tracking_uri: str) -> str:
    """The ``mlflow ui`` command that serves ``tracking_uri``, quoted for a shell (a path with spaces)."""
    return f"{shlex.quote(script_command('mlflow'))} ui --backend-store-uri {shlex.quote(tracking_uri)}"


def runs_list_url(tracking_uri: str, experiment_id: str, view: str | None = None) -> str:
    """Where the MLflow UI lists the runs of experiment ``experiment_id`` (in the experiment's
    shared ``view`` when given, e.g. :data:`KEY_METRICS_VIEW`): the page on an http(s) tracking
    server; for any other store (a local sqlite file), the ``mlflow ui`` command that serves it,
    then the page at :data:`LOCAL_UI`.

    ``workflowType=machine_learning`` opens the runs table: MLflow 3's UI otherwise opens an
    experiment on its GenAI view (traces), whatever the experiment holds."""
    page = f"#/experiments/{experiment_id}/runs?{WORKFLOW}"
    if view:
        page += f"&viewStateShareKey={view}"
    if tracking_uri.startswith(("http://", "https://")):
        return _ui_page(tracking_uri, page)
    return f"{ui_command(tracking_uri)}, then open {_ui_page(tracking_uri, page)}"


def run_url(tracking_uri: str, experiment_id: str, run_id: str) -> str:
    """The page of one run in the MLflow UI (on a local store, once :func:`ui_command` serves it),
    in the UI's machine-learning mode (see :func:`runs_list_url`)."""
    return _ui_page(tracking_uri, f"#/experiments/{experiment_id}/runs/{run_id}?{WORKFLOW}")


def fit_tag_value(text: str, cut_line: str) -> str:
    """``text`` when it fits MLflow's tag limit; else cut at the last line end that leaves room for
    ``cut_line`` (a last line saying where the rest is), which is appended after a blank line."""
    if len(text) <= TAG_VALUE_LIMIT:
        return text
    tail = f"\n\n{cut_line}"
    kept = text[: TAG_VALUE_LIMIT - len(tail)]
    return kept[: kept.rfind("\n") if "\n" in kept else len(kept)] + tail


def set_run_description(client: Any, run_id: str, markdown: str) -> None:
    """Set the run's description (its note, rendered as Markdown on the run page), replacing any.
    Text beyond MLflow's tag limit is cut at a line end, with a last line saying so."""
    cut_line = f"*(cut at MLflow's {TAG_VALUE_LIMIT}-character limit of a run description)*"
    client.set_tag(run_id, NOTE_TAG, fit_tag_value(markdown, cut_line))


def open_run(
    client: Any,
    experiment: str,
    run_name: str,
    tags: dict[str, str],
    artifact_location: str | None,
    parent_run_id: str | None = None,
) -> str:
    """Create the experiment if needed and a run in it; return the run id."""
    found = client.get_experiment_by_name(experiment)
    if found is None:
        try:
            experiment_id = client.create_experiment(experiment, artifact_location=artifact_location)
        except Exception:  # created meanwhile by a parallel job
            found = client.get_experiment_by_name(experiment)
            if found is None:
                raise
            experiment_id = found.experiment_id
    else:
        experiment_id = found.experiment_id
    all_tags = {"mlflow.runName": run_name, **tags}
    if parent_run_id:
        all_tags["mlflow.parentRunId"] = parent_run_id
    return client.create_run(experiment_id, tags=all_tags, run_name=run_name).info.run_id


def log_metrics(
    client: Any, run_id: str, metrics: Mapping[str, float], step: int, timestamp_ms: int | None = None
) -> int:
    """Log ``metrics`` at ``step`` in as few requests as MLflow allows; returns how many."""
    from mlflow.entities import Metric

    now = int(time.time() * 1000) if timestamp_ms is None else timestamp_ms
    items = [Metric(key, float(value), now, step) for key, value in sorted(metrics.items())]
    for start in range(0, len(items), METRICS_PER_BATCH):
        client.log_batch(run_id, metrics=items[start : start + METRICS_PER_BATCH])
    return len(items)


def log_params(client: Any, run_id: str, params: Mapping[str, str]) -> None:
    """Log ``params`` (values cut to MLflow's length limit) in as few requests as MLflow allows."""
    from mlflow.entities import Param

    items = [Param(key, str(value)[:PARAM_VALUE_LIMIT]) for key, value in sorted(params.items())]
    for start in range(0, len(items), PARAMS_PER_BATCH):
        client.log_batch(run_id, params=items[start : start + PARAMS_PER_BATCH])


# urllib3's pool, which MLflow's REST client retries through: a warning for each retry after a
# broken connection, a debug line for each retried status and for each response.
URLLIB3_POOL = "urllib3.connectionpool"
RETRIED_STATUSES = (429, 500, 502, 503, 504)  # what MLflow's client retries (mlflow.utils.request_utils)


class ServerWatch(logging.Filter):
    """Says in one line when MLflow's client starts retrying the tracking server ``uri`` (refused or
    broken connections, retried statuses) and in one line when it answers again; training waits on
    logging meanwhile, without these lines silently (MLflow retries for minutes).

    A filter on urllib3's pool logger, which is set to DEBUG so that every response is seen; the
    records below the level the logger had are dropped here, so nothing more is printed than before."""

    def __init__(self, uri: str, say: Any = None) -> None:
        super().__init__()
        self.uri = uri
        self.say = say or (lambda line: print(line, file=sys.stderr, flush=True))
        self.down_since: float | None = None
        self.lock = threading.Lock()
        self.shown = logging.NOTSET  # the logger's own level before the watch lowered it

    def filter(self, record: logging.LogRecord) -> bool:
        args = record.args if isinstance(record.args, tuple) else ()
        if record.levelno >= logging.WARNING and str(record.msg).startswith("Retrying"):
            self._down(str(args[1]).rsplit(": ", 1)[-1] if len(args) > 1 else "no answer")
        elif str(record.msg).startswith("Retry:"):
            self._down("a status it retries")
        elif len(args) == 8 and isinstance(args[6], int) and args[6] not in RETRIED_STATUSES:
            self._up()  # a response: '%s://%s:%s "%s %s %s" %s %s'
        level = self.shown or logging.getLogger(URLLIB3_POOL).parent.getEffectiveLevel()  # type: ignore[union-attr]
        return record.levelno >= level

    def _down(self, reason: str) -> None:
        with self.lock:
            if self.down_since is not None:
                return
            self.down_since = time.monotonic()
        self.say(f"[mesh] the MLflow server {self.uri} does not answer ({reason}); retrying, logging waits")

    def _up(self) -> None:
        with self.lock:
            if self.down_since is None:
                return
            waited, self.down_since = time.monotonic() - self.down_since, None
        self.say(f"[mesh] the MLflow server {self.uri} answers again after {waited:.0f}s; logging goes on")


def watch_tracking_server(uri: str, say: Any = None) -> ServerWatch | None:
    """Install (once per process; a later call names the new ``uri``) the :class:`ServerWatch` of
    an http(s) tracking server; None for any other store. :func:`unwatch_tracking_server` removes it."""
    if not uri.startswith(("http://", "https://")):
        return None
    logger = logging.getLogger(URLLIB3_POOL)
    watch = next((f for f in logger.filters if isinstance(f, ServerWatch)), None)
    if watch is None:
        watch = ServerWatch(uri, say)
        watch.shown = logger.level
        logger.addFilter(watch)
        logger.setLevel(logging.DEBUG)
    watch.uri = uri
    if say is not None:
        watch.say = say
    return watch


def unwatch_tracking_server() -> None:
    """Remove the :class:`ServerWatch` and give urllib3's pool logger its level back."""
    logger = logging.getLogger(URLLIB3_POOL)
    for watch in [f for f in logger.filters if isinstance(f, ServerWatch)]:
        logger.removeFilter(watch)
        logger.setLevel(watch.shown)


# Tags that say how a run stopped; a run opened again (a resume, a re-run grid) drops them.
STOP_TAGS = ("error", "interrupted", "terminated", "pruned")


def reopen_run(client: Any, run_id: str, tags: Mapping[str, str]) -> None:
    """Set the run RUNNING again and drop the stop tags among its ``tags``, so its final status
    and tags are those of the latest attempt."""
    for tag in STOP_TAGS:
        if tag in tags:
            client.delete_tag(run_id, tag)
    client.update_run(run_id, status="RUNNING")


def terminate_run(client: Any, run_id: str, status: str, tag: str, text: str) -> None:
    """End the run with ``status`` (FAILED, KILLED), saying why in the tag ``tag``."""
    client.set_tag(run_id, tag, text[:5000])
    client.set_terminated(run_id, status)


class RunRecord:
    """The MLflow run of one training run. Only global rank 0 holds one (see ``train``).

    The run id is kept in ``<run_dir>/mlflow_run_id``, so a re-run of the same command resumes
    into the same MLflow run: it is set RUNNING again, the tags a previous stop left (``error``,
    ``interrupted``, ``terminated``) are cleared, and :attr:`last_logged_steps` tells the logger
    which steps of each metric are already in the store, so a step redone after a crash is not
    logged twice. Per metric: a validation logs at the optimizer step count (10 after 10 steps)
    and training at Lightning's 0-based step (9), so a run stopped just after a validation has
    logged ``val/...`` at a step whose ``train/loss`` is still to come.
    """

    ID_FILE = "mlflow_run_id"

    def __init__(
        self, client: Any, run_id: str, is_new: bool, last_logged_steps: Mapping[str, int] | None = None
    ) -> None:
        self.client = client
        self.run_id = run_id
        self.is_new = is_new
        self.last_logged_steps = dict(last_logged_steps or {})

    @classmethod
    def open(
        cls,
        tracking_uri: str,
        run_dir: Path,
        experiment: str,
        run_name: str,
        tags: Mapping[str, str],
        parent_run_id: str | None = None,
        resume: bool = True,
        rebuild_store: bool = False,
    ) -> RunRecord:
        """Resume the run named in ``run_dir`` (when ``resume``), else open a new one there (a run
        tagged with its ``scheme`` in that scheme's colour, :func:`run_color`)."""
        import mlflow

        prepare_sqlite_store(tracking_uri, rebuild_store)
        watch_tracking_server(tracking_uri)  # a server that stops answering is said, not waited on silently
        client = mlflow.MlflowClient(tracking_uri)
        id_file = run_dir / cls.ID_FILE
        if resume and id_file.exists():
            return cls._reopen(client, id_file.read_text().strip(), run_dir, tracking_uri)
        artifacts = artifact_location(tracking_uri, run_dir.parent)
        tags = dict(tags)
        if tags.get("scheme"):  # coloured as in the report's figures from its first chart on
            tags.setdefault(RUN_COLOR_TAG, run_color(tags["scheme"]))
        run_id = open_run(client, experiment, run_name, tags, artifacts, parent_run_id)
        run_dir.mkdir(parents=True, exist_ok=True)
        id_file.write_text(run_id)
        return cls(client, run_id, is_new=True)

    @classmethod
    def _reopen(cls, client: Any, run_id: str, run_dir: Path, tracking_uri: str) -> RunRecord:
        from mlflow.exceptions import MlflowException

        try:
            run = client.get_run(run_id)
        except MlflowException:
            run = None
        if run is None or run.info.lifecycle_stage == "deleted":
            raise TrackingError(
                f"the MLflow run {run_id} of {run_dir} is not in {tracking_uri} (deleted?): "
                "pass resume=false to train this run again from step 0 into a new MLflow run"
            )
        reopen_run(client, run_id, run.data.tags)
        last = {key: max(m.step for m in client.get_metric_history(run_id, key)) for key in run.data.metrics}
        return cls(client, run_id, is_new=False, last_logged_steps=last)

    def log_facts(
        self, params: Mapping[str, str], metrics: Mapping[str, float], artifacts: tuple[Path, ...] = ()
    ) -> None:
        """What the run is (params) and what it was built as (metrics at step 0), once, when new."""
        log_params(self.client, self.run_id, params)
        log_metrics(self.client, self.run_id, metrics, step=0, timestamp_ms=0)
        for path in artifacts:
            self.client.log_artifact(self.run_id, str(path))

    def mark_failed(self, error: BaseException, text: str | None = None) -> None:
        """FAILED, with ``text`` (else the error's type and message) as the ``error`` tag."""
        self._terminate("FAILED", "error", text or f"{type(error).__name__}: {error}")

    def mark_killed(self, reason: str, detail: str) -> None:
        """KILLED, for a run stopped on purpose: ``reason`` is the tag (interrupted, terminated, pruned)."""
        self._terminate("KILLED", reason, detail)

    def _terminate(self, status: str, tag: str, text: str) -> None:
        with contextlib.suppress(Exception):  # the store itself may be what failed; the original error matters more
            terminate_run(self.client, self.run_id, status, tag, text)

    def finish(self, metrics: Mapping[str, float], step: int) -> None:
        log_metrics(self.client, self.run_id, metrics, step)
        self.client.set_terminated(self.run_id, "FINISHED")
