"""A new sqlite store is a copy of an empty one MLflow made once: the same schema, its own Default
experiment, no migration run again; a broken template or cache only means the slow way."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import mlflow
import mlflow.store.db.utils as mlflow_db
import pytest

from experiments.store.sqlite import prepare_sqlite_store, template_path


@pytest.fixture
def cache(tmp_path, monkeypatch) -> Path:
    monkeypatch.setenv("MESH_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.chdir(tmp_path)  # MLflow's Default experiment keeps its artifacts under the working directory
    return tmp_path / "cache"


def schema(db: Path) -> dict[str, list[str]]:
    """Each table's and index's definition as its sorted lines: MLflow's own migrations write a
    table's constraints in a different order from one creation to the next (a set's order)."""
    with sqlite3.connect(db) as connection:
        found = connection.execute("SELECT name, sql FROM sqlite_master WHERE name NOT LIKE 'sqlite_%'")
        return {name: sorted(line.strip().rstrip(",") for line in (sql or "").splitlines()) for name, sql in found}


def rows(db: Path, query: str) -> list[tuple]:
    with sqlite3.connect(db) as connection:
        return list(connection.execute(query))


def new_store(folder: Path) -> Path:
    prepare_sqlite_store(f"sqlite:///{folder / 'mlflow.db'}")
    return folder / "mlflow.db"


def test_a_store_copied_from_the_template_is_the_store_mlflow_makes(cache, tmp_path):
    by_mlflow = tmp_path / "by_mlflow.db"
    mlflow.MlflowClient(f"sqlite:///{by_mlflow}").search_experiments()  # MLflow's own creation
    first, second = new_store(tmp_path / "a"), new_store(tmp_path / "b")

    template = template_path()
    assert template.is_file() and rows(template, "SELECT * FROM experiments") == []
    for db in (first, second):
        assert schema(db) == schema(by_mlflow)
        assert rows(db, "SELECT version_num FROM alembic_version") == rows(
            by_mlflow, "SELECT version_num FROM alembic_version"
        )
        (default,) = rows(db, "SELECT experiment_id, name, artifact_location FROM experiments")
        assert default == rows(by_mlflow, "SELECT experiment_id, name, artifact_location FROM experiments")[0]
        assert rows(db, "PRAGMA journal_mode") == [("wal",)]
    client = mlflow.MlflowClient(f"sqlite:///{second}")
    run = client.create_run(client.create_experiment("grid"))
    client.log_metric(run.info.run_id, "val/loss", 2.5, step=3)
    assert [(m.step, m.value) for m in client.get_metric_history(run.info.run_id, "val/loss")] == [(3, 2.5)]


def test_once_the_template_exists_a_new_store_runs_no_migration(cache, tmp_path, monkeypatch):
    new_store(tmp_path / "a")
    made = template_path().stat().st_mtime_ns

    def migrate(engine):
        raise AssertionError("MLflow's migrations ran for a store the template could have given")

    monkeypatch.setattr(mlflow_db, "_initialize_tables", migrate)
    db = new_store(tmp_path / "b")
    assert template_path().stat().st_mtime_ns == made
    assert [name for (_, name) in rows(db, "SELECT experiment_id, name FROM experiments")] == ["Default"]


def test_a_template_that_does_not_open_is_dropped_and_the_store_made_by_mlflow(cache, tmp_path):
    template = template_path()
    template.parent.mkdir(parents=True)
    template.write_bytes(b"not a database" * 100)
    db = new_store(tmp_path / "a")
    assert [name for (_, name) in rows(db, "SELECT experiment_id, name FROM experiments")] == ["Default"]
    assert not template.exists()  # dropped: the next new store makes it again
    new_store(tmp_path / "b")
    assert rows(template, "SELECT count(*) FROM experiments") == [(0,)]


def test_a_cache_that_cannot_be_written_only_means_the_slow_way(tmp_path, monkeypatch):
    blocker = tmp_path / "a-file"
    blocker.write_text("the cache root is a file")
    monkeypatch.setenv("MESH_CACHE_DIR", str(blocker))
    monkeypatch.chdir(tmp_path)
    db = new_store(tmp_path / "a")
    assert [name for (_, name) in rows(db, "SELECT experiment_id, name FROM experiments")] == ["Default"]
    assert list(tmp_path.glob("a/.mlflow.db.*.tmp")) == []  # no partial copy left beside the store
