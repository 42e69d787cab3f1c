"""MLflow: where runs go, the check that the store answers, and the record every run keeps.

:class:`RunRecord` is a training run's MLflow run (open or resume, log its facts, mark it failed,
finish it); :func:`log_metrics` and :func:`log_params` are the one place that batches writes to
MLflow's per-request limits.
"""

from __future__ import annotations

import os
import sqlite3
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import Any

DEFAULT_DB = "mlflow.db"
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


def prepare_sqlite_store(uri: str) -> None:
    """Put a local sqlite store in WAL mode, so the processes of a parallel sweep write to it
    side by side (readers never block, writers queue). WAL is a property of the file and persists;
    it needs a local disk (not NFS): on a cluster, use an MLflow server with a database."""
    path = sqlite_path(uri)
    if path is None:
        return
    path.parent.mkdir(parents=True, exist_ok=True)
    with sqlite3.connect(path, timeout=60) as connection:
        if connection.execute("PRAGMA journal_mode").fetchone()[0].lower() != "wal":
            connection.execute("PRAGMA journal_mode=WAL")


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


def check_tracking_uri(uri: str, timeout: float = 5.0) -> None:
    """Fail fast, before any compute, when the store cannot be reached or written."""
    if uri.startswith(("http://", "https://")):
        try:
            with urllib.request.urlopen(f"{uri.rstrip('/')}/health", timeout=timeout) as response:
                if response.status != 200:
                    raise TrackingError(f"tracking_uri={uri!r} does not answer: /health returned {response.status}")
        except (urllib.error.URLError, OSError) as error:
            reason = getattr(error, "reason", error)
            raise TrackingError(
                f"tracking_uri={uri!r} does not answer ({reason}); start the server (mlflow server --port ...) "
                "or unset MLFLOW_TRACKING_URI to use the local sqlite store"
            ) from None
    elif (path := sqlite_path(uri)) is not None:
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
        except OSError as error:
            raise TrackingError(f"tracking_uri={uri!r} cannot be created: {error.strerror}") from None
        if not os.access(path.parent, os.W_OK) or (path.exists() and not os.access(path, os.W_OK)):
            raise TrackingError(f"tracking_uri={uri!r} is not writable")
    elif uri.startswith("file:") or "://" not in uri:
        raise TrackingError(
            f"tracking_uri={uri!r} is a file store, which MLflow 3.13+ refuses; use sqlite:///path/to/mlflow.db"
        )


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


class RunRecord:
    """The MLflow run of one training run. Only global rank 0 holds one (see ``train``).

    The run id is kept in ``<run_dir>/mlflow_run_id``, so a re-run of the same command resumes
    into the same MLflow run.
    """

    ID_FILE = "mlflow_run_id"

    def __init__(self, client: Any, run_id: str, is_new: bool) -> None:
        self.client = client
        self.run_id = run_id
        self.is_new = is_new

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
    ) -> RunRecord:
        """Resume the run named in ``run_dir`` (when ``resume``), else open a new one there."""
        import mlflow

        prepare_sqlite_store(tracking_uri)
        client = mlflow.MlflowClient(tracking_uri)
        id_file = run_dir / cls.ID_FILE
        if resume and id_file.exists():
            return cls(client, id_file.read_text().strip(), is_new=False)
        artifacts = artifact_location(tracking_uri, run_dir.parent)
        run_id = open_run(client, experiment, run_name, dict(tags), artifacts, parent_run_id)
        run_dir.mkdir(parents=True, exist_ok=True)
        id_file.write_text(run_id)
        return cls(client, run_id, is_new=True)

    def log_facts(
        self, params: Mapping[str, str], metrics: Mapping[str, float], artifacts: tuple[Path, ...] = ()
    ) -> None:
        """What the run is (params) and what it was built as (metrics at step 0), once, when new."""
        log_params(self.client, self.run_id, params)
        log_metrics(self.client, self.run_id, metrics, step=0, timestamp_ms=0)
        for path in artifacts:
            self.client.log_artifact(self.run_id, str(path))

    def mark_failed(self, error: BaseException) -> None:
        """FAILED with the error as a tag; KILLED for an interrupt or a pruned search trial."""
        pruned = type(error).__name__ == "TrialPruned"
        try:
            self.client.set_tag(self.run_id, "pruned" if pruned else "error", f"{type(error).__name__}: {error}"[:5000])
            status = "KILLED" if pruned or isinstance(error, KeyboardInterrupt) else "FAILED"
            self.client.set_terminated(self.run_id, status)
        except Exception:  # the store itself may be what failed; the original error matters more
            pass

    def finish(self, metrics: Mapping[str, float], step: int) -> None:
        log_metrics(self.client, self.run_id, metrics, step)
        self.client.set_terminated(self.run_id, "FINISHED")
