"""A new sqlite MLflow store, copied from an empty one that MLflow made once per MLflow version;
and :func:`forget_engine`, for a store file that was made or moved aside under a cached engine.

MLflow creates a sqlite store by running all its schema migrations (about 1.2 s more than opening
a copy, benchmarks/store_creation.py; several seconds on a loaded machine), which every
fresh ``runs_dir`` (a new grid, a test) paid. The empty store is made once by MLflow itself, under
the cache root (``$MESH_CACHE_DIR``, else ``~/.cache/mesh-recursive``), and copied. It holds the
tables at MLflow's head revision and no experiment: the ``Default`` experiment, whose artifact
location depends on the store that holds it, is left for MLflow to create when the copy is first
opened, as it does for any store without one.

Anything that goes wrong here (an unwritable cache, a full disk, a template that does not open)
only means the caller creates the store the slow way; the copy is never a partial file.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import sqlite3
from pathlib import Path

from experiments.data.cache import atomic_path, cache_root


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
