"""Where runs are stored, and the local sqlite store: its address (:func:`resolve_tracking_uri`),
its creation (marked while half made), rebuild and damage checks, and a read of one run's status
straight from the file (:func:`peek_run`, no MLflow import).

A new store is copied from an empty one that MLflow made once per MLflow version (the template,
under the cache root: ``$MESH_CACHE_DIR``, else ``~/.cache/mesh-recursive``). MLflow creates a
sqlite store by running all its schema migrations (about 1.2 s more than opening a copy,
benchmarks/store_creation.py; several seconds on a loaded machine), which every fresh ``runs_dir``
(a new grid, a test) paid. The template holds the tables at MLflow's head revision and no
experiment: the ``Default`` experiment, whose artifact location depends on the store that holds
it, is left for MLflow to create when the copy is first opened, as it does for any store without
one. Anything that goes wrong with the template (an unwritable cache, a full disk, a template
that does not open) only means the store is created the slow way; the copy is never a partial
file. :func:`forget_engine` is for a store file that was made or moved aside under a cached engine.

Only SQLite opens a store's files, never ``open()``: POSIX record locks belong to a process and
a file, not to a descriptor, so closing any descriptor a process holds on the database drops
every lock the process holds on it. A connection in WAL mode keeps a shared lock on the database
for as long as it is open; that lock is how another process closing its last connection knows it
is not the last. Drop it (a header read in a grid's parent, or in a worker about to train its
second cell, both holding MLflow's pooled connection) and the next process to close takes the
file for itself, checkpoints, and deletes the WAL and shared memory this process still writes
to: the store comes apart ("database disk image is malformed"), as a 39-run grid's did. SQLite's
own opens know the locks of the process's other connections
(https://www.sqlite.org/howtocorrupt.html, section 2.2), so every check here asks SQLite.
"""

from __future__ import annotations

# MLflow (about a second to import) is imported inside the functions that need it: the store's
# address, its damage check and peek_run work on the file alone.
import contextlib
import functools
import os
import shutil
import sqlite3
import sys
import time
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path

from experiments.data.cache import atomic_path, cache_root
from experiments.locks import file_lock

DEFAULT_DB = "mlflow.db"
# A sqlite database's files: the database, and its rollback journal or WAL and shared memory.
SQLITE_FILE_SUFFIXES = ("", "-journal", "-wal", "-shm")


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
    if (reason := read_only_reason(path)) is not None:
        raise TrackingError(read_only_line(path, reason))
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


def read_only_reason(path: Path) -> str | None:
    """Why the existing store ``path`` cannot be written by this process (a read-only filesystem,
    the file's or its folder's permissions), or None when it can (or does not exist yet). SQLite
    writes beside the database (its WAL, shared memory and journal), so the folder counts too."""
    if not path.is_file():
        return None
    if _on_read_only_filesystem(path):
        return "its filesystem is mounted read-only"
    if not os.access(path, os.W_OK) or not os.access(path.parent, os.W_OK):
        return "no write permission on the file or its folder"
    return None


def _on_read_only_filesystem(path: Path) -> bool:
    try:
        return bool(os.statvfs(path).f_flag & os.ST_RDONLY)
    except OSError:
        return False


def read_only_line(path: Path, reason: str) -> str:
    """What a command that must write answers for a read-only store, in one line."""
    return (
        f"the MLflow store {path} is read-only ({reason}); this command writes to it: use a writable copy "
        "(tracking.tracking_uri=sqlite:///<copy>), while mesh-results and mesh-sweep --status read it as it is"
    )


def reading_uri(uri: str) -> str:
    """``uri`` for a command that only reads: a local sqlite store that cannot be written is opened
    read-only by SQLite (``mode=ro``; on a read-only filesystem also ``immutable=1``, as no one can
    write it there and SQLite could not make its shared-memory file), every other ``uri`` as it is.
    MLflow opens a store through SQLAlchemy, which passes ``file:`` URIs on to SQLite."""
    path = sqlite_path(uri)
    if path is None or is_opened_read_only(uri) or (reason := read_only_reason(path)) is None:
        return uri
    print(
        f"[mesh] the MLflow store {path} is read-only ({reason}): read as it is, nothing written to it", file=sys.stderr
    )
    return f"sqlite:///{_sqlite_file_uri(path)}&uri=true"


def is_opened_read_only(uri: str) -> bool:
    """Whether ``uri`` is a :func:`reading_uri` of a read-only store (whose readers write nothing)."""
    return uri.startswith("sqlite:///file:") and "mode=ro" in uri


def _sqlite_file_uri(path: Path) -> str:
    """SQLite's read-only URI of ``path``: ``immutable`` too where SQLite could not make the
    shared-memory file a WAL store needs (a read-only filesystem, or a folder this process cannot
    write and no WAL, so no writer, beside the store)."""
    immutable = _on_read_only_filesystem(path) or (
        not os.access(path.parent, os.W_OK) and not Path(f"{path}-wal").exists()
    )
    return f"file:{path}?mode=ro" + ("&immutable=1" if immutable else "")


RECOVER_COMMAND = "python -m experiments.store.recover"


def damaged_store_line(path: Path, reason: str) -> str:
    """What a damaged store is, and the two ways on, in one line."""
    recovered = path.with_name(f"{path.stem}-recovered{path.suffix}")
    return (
        f"the MLflow store {path} is damaged ({reason}); copy what it still holds with "
        f"{RECOVER_COMMAND} {path} {recovered} and use tracking.tracking_uri=sqlite:///{recovered}, "
        "or set tracking.rebuild_store=true to move it aside and start an empty store"
    )


# Stores up to this size get SQLite's quick_check of every page (about 6 ms per MiB: 0.12 s for the
# one-pass reproduction's 22 MiB); larger ones of every table but ``metrics``, which holds most of
# a store's pages (14 s for all of a 2.4 GiB store of 10,000 runs), and whose damage is found when
# it is read (benchmarks/store_check.py).
FULL_CHECK_BYTES = 256 << 20
BULK_TABLE = "metrics"


def sqlite_damage(path: Path) -> str | None:
    """Why the sqlite file ``path`` is damaged (malformed pages of a table or an index, a file cut
    short, not a database), or None when it reads: SQLite's ``quick_check`` (the structure of every
    page, not the match of indexes to tables; see :data:`FULL_CHECK_BYTES`), asked of SQLite (never
    ``open()``: see the module docstring)."""
    try:
        read_one(path, "SELECT count(*) FROM runs")
        verdict = _quick_check(path)
    except sqlite3.OperationalError as error:
        if "no such table" in str(error) or "locked" in str(error):
            return None  # a schema never made (incomplete, not damaged), or a writer holding it now
        return _first_line(error)
    except sqlite3.Error as error:
        return "not a SQLite database" if is_not_a_database(error) else _first_line(error)
    said = [line for line in verdict.splitlines() if line.strip() and not line.startswith("*** in database")]
    return None if verdict == "ok" else f"quick_check: {'; '.join(said)[:200] or verdict}"


def _quick_check(path: Path) -> str:
    """``ok``, or SQLite's first complaint."""
    if path.stat().st_size <= FULL_CHECK_BYTES:
        return str(read_one(path, "PRAGMA quick_check(1)")[0])
    connection = sqlite3.connect(_sqlite_file_uri(path), uri=True, timeout=10)
    try:
        tables = [row[0] for row in connection.execute("SELECT name FROM sqlite_master WHERE type = 'table'")]
        for table in tables:
            if table != BULK_TABLE:
                verdict = str(connection.execute(f'PRAGMA quick_check("{table}")').fetchone()[0])
                if verdict != "ok":
                    return verdict
        return "ok"
    finally:
        connection.close()


# SQLite's result codes and messages for a damaged file (SQLITE_CORRUPT, SQLITE_NOTADB); MLflow
# wraps SQLAlchemy's error, which wraps sqlite3's, sometimes only as text.
DAMAGE_CODES = (11, 26)
DAMAGE_TEXTS = ("database disk image is malformed", "file is not a database")


def store_damage(error: BaseException | None) -> str | None:
    """SQLite's one line when ``error`` (from MLflow, SQLAlchemy or sqlite3, anywhere along its
    causes) says a database file is damaged, else None."""
    seen: set[int] = set()
    while error is not None and id(error) not in seen:
        seen.add(id(error))
        said = next((text for text in DAMAGE_TEXTS if text in str(error)), None)
        if said is not None or getattr(error, "sqlite_errorcode", None) in DAMAGE_CODES:
            return said or _first_line(error)
        error = getattr(error, "orig", None) or error.__cause__ or error.__context__
    return None


def damaged_store_error(error: BaseException, uri: str) -> TrackingError | None:
    """The one-line :class:`TrackingError` for an ``error`` raised by a damaged sqlite store at
    ``uri``, else None (the error is something else)."""
    path, damage = sqlite_path(uri), store_damage(error)
    if damage is None:
        return None
    if path is None:
        return TrackingError(f"the MLflow store {uri} reports damage ({damage}); repair its database")
    return TrackingError(damaged_store_line(path, damage))


def read_one(path: Path, sql: str) -> tuple:
    """The first row of ``sql`` on the database ``path``, opened read-only by SQLite (the one way
    this package reads a store file; see the module docstring). Raises :class:`sqlite3.Error`."""
    connection = sqlite3.connect(_sqlite_file_uri(path), uri=True, timeout=10)
    try:
        return connection.execute(sql).fetchone()
    finally:
        connection.close()


def is_not_a_database(error: sqlite3.Error) -> bool:
    """Whether SQLite refused a file as not being a database (SQLITE_NOTADB)."""
    return getattr(error, "sqlite_errorcode", None) == 26 or "file is not a database" in str(error)


def check_store_intact(uri: str) -> None:
    """Raise :class:`TrackingError` (one line) when ``uri`` is a local sqlite store that is damaged.
    A grid plans each distinct config (a check each): a store whose files have not changed since
    this process checked it is not read again."""
    path = sqlite_path(uri)
    damage = (
        _damage_of(path, *_file_state(path))
        if path is not None and path.is_file() and path.stat().st_size > 0
        else None
    )
    if damage is not None:
        raise TrackingError(damaged_store_line(path, damage))  # type: ignore[arg-type]


def _file_state(path: Path) -> tuple[tuple[int, int], ...]:
    """(size, mtime) of the database and its WAL (where writes go until a checkpoint)."""
    states = []
    for suffix in ("", "-wal"):
        try:
            stat = Path(f"{path}{suffix}").stat()
            states.append((stat.st_size, stat.st_mtime_ns))
        except OSError:
            states.append((0, 0))
    return tuple(states)


@functools.lru_cache(maxsize=8)
def _damage_of(path: Path, *state: tuple[int, int]) -> str | None:
    return sqlite_damage(path)


def _open_copied_empty_store(uri: str, path: Path) -> bool:
    """A new store from the empty one made once (the template below); a copy that does
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
        return int(read_one(path, "SELECT count(*) FROM runs")[0])
    except sqlite3.Error:
        return 0


def peek_run(uri: str, run_id: str, tag: str) -> tuple[str, str | None] | None:
    """(status, value of ``tag`` or None) of run ``run_id`` of a local sqlite store, read from the
    file without MLflow (whose import and store check take about 6 s of CPU): what
    ``mesh-sweep --status`` needs of a grid's parent. None where ``uri`` is not a sqlite file, the
    run is not in it, or it does not read; then ask MLflow."""
    path = sqlite_path(uri)
    if path is None or not path.is_file():
        return None
    try:
        connection = sqlite3.connect(_sqlite_file_uri(path), uri=True, timeout=10)
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
    path = Path(uri.removeprefix("sqlite:///").split("?", 1)[0].removeprefix("file:"))  # reading_uri's too
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


def template_path(cache_dir: str | None = None) -> Path:
    """The empty store of the installed MLflow version."""
    import mlflow

    return cache_root(cache_dir) / "mlflow" / f"empty-store-{mlflow.__version__}.db"


def copy_empty_store(path: Path) -> bool:
    """Put an empty MLflow store at ``path`` (which must not hold a store); False when none could
    be copied, and then nothing was written at ``path``."""
    try:
        template = template_path()
        if not template.exists():
            _make_template(template)
        with atomic_path(path) as tmp:
            shutil.copyfile(template, tmp)
    except Exception:  # the disk, the cache, MLflow building the template: the slow way says what
        return False
    return True


def forget_template() -> None:
    """Remove the template, after a copy of it failed to open: the next store makes a new one."""
    with contextlib.suppress(OSError):
        template_path().unlink()


def forget_engine(uri: str) -> None:
    """MLflow keeps one store and one SQLAlchemy engine per URI for the life of the process; their
    pooled connections still point at a file made or moved aside under that URI."""
    from mlflow.store.tracking.sqlalchemy_store import SqlAlchemyStore
    from mlflow.tracking._tracking_service.utils import _tracking_store_registry

    cached = getattr(_tracking_store_registry._get_store_with_resolved_uri, "cache_clear", None)
    if cached is not None:
        cached()
    engines = getattr(SqlAlchemyStore, "_engine_map", {})
    engine = engines.pop(uri, None)
    if engine is not None:
        engine.dispose()


def _make_template(template: Path) -> None:
    import mlflow

    with atomic_path(template) as tmp:
        uri = f"sqlite:///{tmp}"
        try:
            mlflow.MlflowClient(uri).search_experiments(max_results=1)  # MLflow runs its migrations
        finally:
            forget_engine(uri)
        with contextlib.closing(sqlite3.connect(tmp)) as connection:
            with connection:
                connection.execute("DELETE FROM experiment_tags WHERE experiment_id = 0")
                connection.execute("DELETE FROM experiments WHERE experiment_id = 0")
            connection.execute("VACUUM")
            if connection.execute("PRAGMA journal_mode").fetchone()[0].lower() != "delete":
                raise sqlite3.Error("the template store is not in rollback-journal mode")
        os.chmod(tmp, 0o644)
