"""MLflow, for one run: the record every training run keeps, and the tracking server watched.

Where runs are stored and the local store's creation and checks are :mod:`experiments.store`.
:class:`RunRecord` is a training run's MLflow run (open or resume, log its facts, mark it failed,
finish it); :func:`log_metrics` and :func:`log_params` are the one place that batches writes to
MLflow's per-request limits.
"""

from __future__ import annotations

# MLflow is imported inside the functions that use it: importing this module stays cheap for the
# command lines that only name its types.
import contextlib
import logging
import sys
import threading
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from experiments.store.sqlite import TrackingError, artifact_location, prepare_sqlite_store
from experiments.store.views import RUN_COLOR_TAG, run_color

# MLflow's per-request limits of log_batch.
METRICS_PER_BATCH = 1000
PARAMS_PER_BATCH = 100
PARAM_VALUE_LIMIT = 6000


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
