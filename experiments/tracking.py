"""MLflow: where runs go, the check that the store answers, and what every run records."""

from __future__ import annotations

import os
import sqlite3
import subprocess
import urllib.error
import urllib.request
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import Any

DEFAULT_DB = "mlflow.db"


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
    if not is_local_store(uri):
        return
    path = Path(uri.removeprefix("sqlite:///").split("?", 1)[0])
    with sqlite3.connect(path, timeout=60) as connection:
        if connection.execute("PRAGMA journal_mode").fetchone()[0].lower() != "wal":
            connection.execute("PRAGMA journal_mode=WAL")


def is_local_store(uri: str) -> bool:
    return uri.startswith("sqlite:")


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
    elif uri.startswith("sqlite:///"):
        path = Path(uri.removeprefix("sqlite:///"))
        if not path.is_absolute():
            path = Path.cwd() / path
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
