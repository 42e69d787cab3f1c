"""A damaged store is found whatever page the damage hits, and ``python -m experiments.store.recover``
copies back every row it can read, counting the rest.

A real MLflow store holds 40 real runs (params, tags, metric histories logged by MLflow's client);
each case overwrites one real page of a copy (located with SQLite's ``dbstat``): a page of the
runs table, of the metrics table, of an index, or the file's header. The recovered store is read
back with SQLite and with MLflow and compared with the original, row for row.
"""

from __future__ import annotations

import random
import sqlite3
import subprocess
import sys
from contextlib import closing
from pathlib import Path

import mlflow
import pytest

from experiments.store.sqlite import forget_engine, prepare_sqlite_store, sqlite_damage

RUNS, PARAMS, TAGS, STEPS = 40, 30, 8, 40
PAGE = 4096
TABLES = ("experiments", "runs", "params", "tags", "metrics", "latest_metrics")


@pytest.fixture(scope="module")
def store(tmp_path_factory) -> Path:
    db = tmp_path_factory.mktemp("store") / "mlflow.db"
    uri = f"sqlite:///{db}"
    prepare_sqlite_store(uri)
    client = mlflow.MlflowClient(uri)
    experiment = client.create_experiment("recoverable")
    from mlflow.entities import Metric, Param, RunTag

    for index in range(RUNS):
        run = client.create_run(experiment, run_name=f"run-{index}", tags={"seed": str(index)})
        run_id = run.info.run_id
        params = [Param(f"param.{k}", f"{index}-{k}") for k in range(PARAMS)]
        tags = [RunTag(f"tag.{k}", f"value {index} {k}") for k in range(TAGS)]
        metrics = [Metric("val_loss", 7.0 - 0.01 * s - index * 1e-3, 1000 + s, s) for s in range(STEPS)]
        metrics += [Metric("train/loss", 7.5 - 0.01 * s, 1000 + s, s) for s in range(STEPS)]
        client.log_batch(run_id, metrics=metrics, params=params, tags=tags)
        client.set_terminated(run_id, "FINISHED")
    forget_engine(uri)
    with closing(sqlite3.connect(db)) as connection:
        connection.execute("PRAGMA journal_mode=DELETE")  # every row in the file itself
    return db


def rows(db: Path, table: str) -> list[tuple]:
    with closing(sqlite3.connect(db)) as connection:
        return connection.execute(f'SELECT * FROM "{table}"').fetchall()


def page_of(db: Path, name: str) -> int:
    """A leaf page in the middle of table or index ``name``."""
    with closing(sqlite3.connect(db)) as connection:
        pages = connection.execute(
            "SELECT pageno FROM dbstat WHERE name = ? AND pagetype = 'leaf' ORDER BY pageno", (name,)
        ).fetchall()
    assert len(pages) >= 2, f"{name} has {len(pages)} leaf pages"
    return pages[(len(pages) - 1) // 2][0]  # never the last leaf: the table's end still reads


def damaged_copy(store: Path, tmp_path: Path, damage: str) -> Path:
    db = tmp_path / "mlflow.db"
    data = bytearray(store.read_bytes())
    noise = random.Random(damage).randbytes(PAGE)
    if damage == "header":
        data[:100] = noise[:100]
    else:
        page = page_of(store, {"runs": "runs", "metrics": "metrics", "index": "index_metrics_run_uuid"}[damage])
        data[(page - 1) * PAGE : page * PAGE] = noise
    db.write_bytes(bytes(data))
    return db


def recover(db: Path, out: Path) -> subprocess.CompletedProcess:
    command = [sys.executable, "-m", "experiments.store.recover", str(db), str(out)]
    return subprocess.run(command, capture_output=True, text=True, timeout=300)


def counted(stderr: str, table: str) -> int:
    """The rows of ``table`` the recovery says it could not copy (0 when it names none)."""
    for line in stderr.splitlines():
        if line.startswith(f"[recover] {table}: "):
            lost = line.split("not copied: ")[1]
            return sum(int(part.split()[0]) for part in lost.split(", "))
    return 0


@pytest.mark.parametrize("damage", ["runs", "metrics", "index", "header"])
def test_a_damaged_page_is_found_and_every_readable_row_is_recovered_the_rest_counted(store, tmp_path, damage):
    db = damaged_copy(store, tmp_path, damage)
    assert sqlite_damage(store) is None
    assert sqlite_damage(db) is not None  # found whatever page it hit (a count over runs misses an index)
    out = tmp_path / "recovered.db"
    done = recover(db, out)
    lossless = damage in ("index", "header")
    assert done.returncode == (0 if lossless else 1), done.stderr
    assert sqlite_damage(out) is None
    for table in TABLES:
        original, recovered = rows(store, table), rows(out, table)
        assert set(recovered) <= set(original) and len(set(recovered)) == len(recovered)
        assert len(original) - len(recovered) == counted(done.stderr, table), (table, done.stderr)
    lost = {table: len(rows(store, table)) - len(rows(out, table)) for table in TABLES}
    if damage == "runs":  # one page of run rows, and with them their params and tags, counted
        assert 0 < lost["runs"] < RUNS and lost["params"] == PARAMS * lost["runs"] and lost["metrics"] > 0
    elif damage == "metrics":  # one page of metric values, nothing else
        assert lost["metrics"] > 0 and not any(n for table, n in lost.items() if table != "metrics")
    else:
        assert not any(lost.values())
    # MLflow reads the recovered store: each surviving run's params, tags and metric histories are the original's
    before, after = mlflow.MlflowClient(f"sqlite:///{store}"), mlflow.MlflowClient(f"sqlite:///{out}")
    experiment = after.get_experiment_by_name("recoverable").experiment_id
    runs = after.search_runs([experiment], max_results=1000)
    assert len(runs) == RUNS - lost["runs"]
    for run in runs:
        original = before.get_run(run.info.run_id)
        assert run.data.params == original.data.params and run.data.tags == original.data.tags
        assert run.info.status == "FINISHED"
        history = {m.step for m in after.get_metric_history(run.info.run_id, "val_loss")}
        assert history <= set(range(STEPS))
    histories = sum(
        len(after.get_metric_history(r.info.run_id, key)) for r in runs for key in ("val_loss", "train/loss")
    )
    assert histories == len(rows(out, "metrics"))
    forget_engine(f"sqlite:///{store}")
    forget_engine(f"sqlite:///{out}")


def cells_damaged_copy(store: Path, tmp_path: Path, table: str) -> Path:
    """A copy with noise over the cells of one leaf page of ``table``, its header and cell pointers
    kept: SQLite still walks to the page, and a lookup of one of its rowids finds nothing."""
    db = tmp_path / "mlflow.db"
    data = bytearray(store.read_bytes())
    start = (page_of(store, table) - 1) * PAGE
    cells = int.from_bytes(data[start + 3 : start + 5], "big")
    kept = 8 + 2 * cells  # a leaf page's header, then its cell pointer array
    data[start + kept : start + PAGE] = random.Random(table).randbytes(PAGE - kept)
    db.write_bytes(bytes(data))
    return db


@pytest.mark.parametrize("table", ["metrics", "params", "tags", "runs"])
def test_damaged_cells_under_an_intact_page_header_are_counted_as_lost(store, tmp_path, table):
    """Before: exit 0 and no loss line, with 56 metric values (or 66 params) missing from the copy."""
    db = cells_damaged_copy(store, tmp_path, table)
    out = tmp_path / "recovered.db"
    done = recover(db, out)
    assert done.returncode == 1, done.stderr
    assert "(with the losses above)" in done.stdout
    lost = {name: len(rows(store, name)) - len(rows(out, name)) for name in TABLES}
    assert lost[table] > 0
    for name in TABLES:  # every row not copied is counted, table by table
        assert lost[name] == counted(done.stderr, name), (name, done.stderr)
        assert set(rows(out, name)) <= set(rows(store, name))
    forget_engine(f"sqlite:///{out}")


def test_a_store_with_no_readable_run_is_refused_and_nothing_is_written(store, tmp_path):
    db = tmp_path / "mlflow.db"
    data = store.read_bytes()
    db.write_bytes(data[:PAGE] + b"\x5a" * (len(data) - PAGE))  # every page after the first overwritten
    out = tmp_path / "recovered.db"
    done = recover(db, out)
    assert done.returncode == 2 and not out.exists()
    (line,) = done.stderr.strip().splitlines()
    assert line.startswith("error: ") and f" of {db} " in line and line.endswith("; no store was written")
    assert list(tmp_path.iterdir()) == [db]


def test_the_output_is_never_overwritten(store, tmp_path):
    out = tmp_path / "recovered.db"
    out.write_bytes(b"keep")
    done = recover(store, out)
    assert done.returncode == 2 and out.read_bytes() == b"keep"
    assert "exists; give a new path" in done.stderr


@pytest.mark.parametrize("damage", ["runs", "metrics", "index"])
def test_a_store_past_the_full_check_size_is_checked_in_every_table_but_metrics(store, tmp_path, damage, monkeypatch):
    """Above FULL_CHECK_BYTES the check skips the bulk of the pages (metrics and its indexes, found
    when read); a runs page is still found."""
    from experiments.store import sqlite as store_sqlite

    monkeypatch.setattr(store_sqlite, "FULL_CHECK_BYTES", 0)
    found = sqlite_damage(damaged_copy(store, tmp_path, damage))
    assert (found is not None) == (damage == "runs")


def test_what_mlflow_raises_on_a_damaged_page_becomes_the_store_s_one_line(store, tmp_path):
    """The error as MLflow raises it (SQLAlchemy's, wrapping sqlite3's) is recognised anywhere along
    its causes; another error is not taken for damage."""
    from experiments.store.sqlite import damaged_store_error

    db = damaged_copy(store, tmp_path, "runs")
    uri = f"sqlite:///{db}"
    client = mlflow.MlflowClient(uri)
    with pytest.raises(Exception) as raised:
        client.search_runs([client.get_experiment_by_name("recoverable").experiment_id], max_results=1000)
    line = str(damaged_store_error(raised.value, uri))
    assert line.startswith(f"the MLflow store {db} is damaged (database disk image is malformed); ")
    assert f"python -m experiments.store.recover {db} {db.with_name('mlflow-recovered.db')} " in line
    assert damaged_store_error(ValueError("--filter is invalid"), uri) is None
    forget_engine(uri)
