"""Is the MLflow store usable? Checked before any compute, each answer one line.

:func:`check_tracking_uri` asks the store itself, as cheaply as it can:

* ``http(s)://``: the server must answer MLflow's REST API (``GET
  /api/2.0/mlflow/experiments/search?max_results=1`` returns a JSON object with an
  ``experiments`` list, or an empty object); a server that answers ``/health`` but is not MLflow
  is refused. ``MLFLOW_TRACKING_USERNAME``/``PASSWORD`` or ``MLFLOW_TRACKING_TOKEN`` are sent,
  and ``MLFLOW_TRACKING_INSECURE_TLS``/``MLFLOW_TRACKING_SERVER_CERT_PATH`` honoured, as MLflow does.
* a database (``postgresql://``, ``mysql://``, ``mssql://``, with or without ``+driver``): its
  SQLAlchemy driver must be installed and a connection must open within ``timeout`` seconds.
* ``sqlite:///path``: the folder must exist or be creatable and be writable, and an existing file
  must be a SQLite database; nothing is created by the check.
* ``file:`` stores and bare paths are refused (MLflow 3.13+ does not accept them).

:func:`check_runs_dir` says whether ``runs_dir`` can hold runs (a folder, or creatable, and
writable); it answers with a :class:`ConfigError`, the store checks with a :class:`TrackingError`.
"""

from __future__ import annotations

import base64
import json
import os
import sqlite3
import ssl
import tempfile
import threading
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from pathlib import Path

from experiments.store.sqlite import (
    TrackingError,
    check_store_intact,
    is_being_created,
    is_not_a_database,
    read_one,
    read_only_line,
    read_only_reason,
    sqlite_path,
)
from mesh_model.errors import ConfigError

# The SQL databases MLflow's store accepts (SQLAlchemy URLs, ``+driver`` optional) besides sqlite.
DATABASES = ("postgresql", "mysql", "mssql")
# The pip package of each database driver module SQLAlchemy may import.
DRIVER_PACKAGES = {
    "psycopg2": "psycopg2-binary",
    "psycopg": "'psycopg[binary]'",
    "pg8000": "pg8000",
    "MySQLdb": "mysqlclient",
    "pymysql": "pymysql",
    "mysql": "mysql-connector-python",
    "pyodbc": "pyodbc",
    "pymssql": "pymssql",
}
API_PROBE = "/api/2.0/mlflow/experiments/search?max_results=1"
USE_LOCAL = "or unset MLFLOW_TRACKING_URI to use the local sqlite store"


def check_tracking_uri(uri: str, timeout: float = 5.0, allow_damaged: bool = False) -> None:
    """Raise :class:`TrackingError` (one line) when ``uri`` is not an MLflow store this run can use;
    a damaged sqlite store is refused too, unless ``allow_damaged`` (it is about to be set aside)."""
    scheme = uri.split("://", 1)[0].split("+", 1)[0].lower() if "://" in uri else ""
    if scheme in ("http", "https"):
        _check_server(uri, timeout)
    elif (path := sqlite_path(uri)) is not None:
        _check_sqlite(uri, path)
        if not allow_damaged and not is_being_created(path):
            check_store_intact(uri)
    elif scheme in DATABASES:
        _check_database(uri, timeout)
    elif uri.startswith("file:") or ("://" not in uri and not uri.startswith("databricks")):
        raise TrackingError(
            f"tracking_uri={uri!r} is a file store, which MLflow 3.13+ refuses; use sqlite:///path/to/mlflow.db"
        )


_READING: ContextVar[bool] = ContextVar("reading_only", default=False)


@contextmanager
def reading_only() -> Iterator[None]:
    """Checks made inside are for a command that only reads runs (``mesh-sweep --status``): a
    ``runs_dir`` that cannot be written is no refusal, and ``plan_run`` opens a store that cannot
    be written read-only (:func:`~experiments.store.sqlite.reading_uri`)."""
    token = _READING.set(True)
    try:
        yield
    finally:
        _READING.reset(token)


def is_reading_only() -> bool:
    return _READING.get()


def check_runs_dir(runs_dir: str | os.PathLike[str]) -> None:
    """Raise :class:`ConfigError` (one line) when ``runs_dir`` is a file, or cannot be created or
    written; creates nothing."""
    path = Path(runs_dir).expanduser()
    if path.exists() and not path.is_dir():
        raise ConfigError("runs_dir", str(runs_dir), "it is a file, not a folder; give a folder for the runs")
    existing = _nearest_existing(path)
    if not existing.is_dir():
        raise ConfigError("runs_dir", str(runs_dir), f"{str(existing)!r} is a file, so the folder cannot be created")
    reason = None if is_reading_only() else _unwritable(existing)
    if reason:
        where = "the folder" if existing == path.absolute() else f"{str(existing)!r}, where it would be created,"
        raise ConfigError("runs_dir", str(runs_dir), f"{where} is not writable ({reason}); give a writable folder")


def shown(uri: str) -> str:
    """The URI with any password replaced by ``***``, for messages."""
    parts = urllib.parse.urlsplit(uri)
    if parts.password is None:
        return uri
    netloc = f"{parts.username}:***@{parts.hostname}" + (f":{parts.port}" if parts.port else "")
    return urllib.parse.urlunsplit(parts._replace(netloc=netloc))


def _unwritable(folder: Path) -> str | None:
    """Why no file can be created in ``folder`` (tried for real: permissions, a read-only mount,
    root on a special filesystem), or None; the probe file is gone when this returns."""
    try:
        with tempfile.TemporaryFile(dir=folder):
            return None
    except OSError as error:
        return error.strerror or type(error).__name__


def _nearest_existing(path: Path) -> Path:
    path = path.absolute()
    while not path.exists() and path != path.parent:
        path = path.parent
    return path


def _check_server(uri: str, timeout: float) -> None:
    request = urllib.request.Request(f"{uri.rstrip('/')}{API_PROBE}", headers=_auth_headers())
    not_mlflow = f"tracking_uri={shown(uri)!r} answers but is not an MLflow tracking server"
    try:
        with urllib.request.urlopen(request, timeout=timeout, context=_tls_context(uri)) as response:
            body = response.read(1 << 20)
    except urllib.error.HTTPError as error:
        if error.code in (401, 403):
            raise TrackingError(
                f"tracking_uri={shown(uri)!r} refuses access (HTTP {error.code}); set MLFLOW_TRACKING_USERNAME "
                "and MLFLOW_TRACKING_PASSWORD, or MLFLOW_TRACKING_TOKEN"
            ) from None
        raise TrackingError(f"{not_mlflow} (GET {API_PROBE} returned HTTP {error.code})") from None
    except (urllib.error.URLError, OSError) as error:
        reason = getattr(error, "reason", error)
        raise TrackingError(
            f"tracking_uri={shown(uri)!r} does not answer ({reason}); start the server "
            f"(mlflow server --port ...) {USE_LOCAL}"
        ) from None
    try:
        answer = json.loads(body)
    except ValueError:
        raise TrackingError(f"{not_mlflow} (GET {API_PROBE} did not return JSON)") from None
    if not isinstance(answer, dict) or not isinstance(answer.get("experiments", []), list):
        raise TrackingError(f"{not_mlflow} (GET {API_PROBE} returned JSON without an experiments list)")


def _tls_context(uri: str) -> ssl.SSLContext | None:
    """MLflow's own TLS settings: ``MLFLOW_TRACKING_INSECURE_TLS``, ``MLFLOW_TRACKING_SERVER_CERT_PATH``."""
    if not uri.lower().startswith("https"):
        return None
    if os.environ.get("MLFLOW_TRACKING_INSECURE_TLS", "").lower() == "true":
        return ssl._create_unverified_context()
    return ssl.create_default_context(cafile=os.environ.get("MLFLOW_TRACKING_SERVER_CERT_PATH") or None)


def _auth_headers() -> dict[str, str]:
    """The credentials MLflow's client would send (its environment variables)."""
    token = os.environ.get("MLFLOW_TRACKING_TOKEN")
    if token:
        return {"Authorization": f"Bearer {token}"}
    user, password = os.environ.get("MLFLOW_TRACKING_USERNAME"), os.environ.get("MLFLOW_TRACKING_PASSWORD")
    if user and password:
        return {"Authorization": "Basic " + base64.b64encode(f"{user}:{password}".encode()).decode()}
    return {}


def _check_sqlite(uri: str, path: Path) -> None:
    if path.is_dir():
        raise TrackingError(
            f"tracking_uri={uri!r} names a folder; give the database file, e.g. sqlite:///runs/mlflow.db"
        )
    if (read_only := read_only_reason(path)) is not None:  # an existing store: not "damaged", not "not writable"
        raise TrackingError(read_only_line(path, read_only))
    folder = _nearest_existing(path.parent)
    if not folder.is_dir():
        raise TrackingError(f"tracking_uri={uri!r} cannot be created: {str(folder)!r} is a file, not a folder")
    reason = _unwritable(folder)
    if reason:
        raise TrackingError(f"tracking_uri={uri!r} is not writable: {str(folder)!r} ({reason})")
    if not path.exists():
        return
    if not os.access(path, os.R_OK | os.W_OK):
        raise TrackingError(f"tracking_uri={uri!r} is not writable")
    if path.stat().st_size > 0 and not _reads_as_sqlite(path):  # sqlite makes an empty file a new database
        raise TrackingError(
            f"tracking_uri={uri!r}: {str(path)!r} exists and is not a SQLite database; give another path"
        )


def _reads_as_sqlite(path: Path) -> bool:
    """Whether SQLite takes ``path`` for a database (its header); asked of SQLite, never read with
    ``open()``, which would drop this process's locks on a store it has open (experiments/store/sqlite.py)."""
    try:
        read_one(path, "PRAGMA schema_version")
    except sqlite3.Error as error:
        return not is_not_a_database(error)  # locked, or damaged further in: a database all the same
    return True


def _check_database(uri: str, timeout: float) -> None:
    """The driver must import and a connection must open within ``timeout`` seconds."""
    import sqlalchemy
    from sqlalchemy.exc import ArgumentError, NoSuchModuleError
    from sqlalchemy.pool import NullPool

    try:
        url = sqlalchemy.make_url(uri)
        engine = sqlalchemy.create_engine(
            url, connect_args=_connect_timeout(url.get_backend_name(), timeout), poolclass=NullPool
        )
    except ModuleNotFoundError as error:
        package = DRIVER_PACKAGES.get((error.name or "").split(".")[0], error.name)
        raise TrackingError(
            f"tracking_uri={shown(uri)!r} cannot be used: its database driver {error.name!r} is not installed; "
            f"pip install {package}, {USE_LOCAL}"
        ) from None
    except (ImportError, NoSuchModuleError, ArgumentError) as error:
        raise TrackingError(f"tracking_uri={shown(uri)!r} cannot be used: {_first_line(error)}") from None
    outcome: list[BaseException | None] = []

    def connect() -> None:
        try:
            with engine.connect():
                outcome.append(None)
        except Exception as error:  # reported by the caller, in its thread
            outcome.append(error)

    worker = threading.Thread(target=connect, daemon=True)
    worker.start()
    worker.join(timeout + 1.0)
    if not outcome:
        raise TrackingError(
            f"tracking_uri={shown(uri)!r} does not answer within {timeout:g} s; start the database {USE_LOCAL}"
        )
    if outcome[0] is not None:
        reason = _first_line(getattr(outcome[0], "orig", None) or outcome[0])
        raise TrackingError(f"tracking_uri={shown(uri)!r} does not answer ({reason}); start the database {USE_LOCAL}")
    engine.dispose()


def _first_line(error: BaseException) -> str:
    text = str(error).strip()
    return text.splitlines()[0] if text else type(error).__name__


def _connect_timeout(backend: str, timeout: float) -> dict[str, int]:
    """Each default driver's own connect timeout (whole seconds)."""
    seconds = max(1, round(timeout))
    return {"timeout": seconds} if backend == "mssql" else {"connect_timeout": seconds}
