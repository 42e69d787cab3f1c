"""A damaged MLflow store is never replaced on its own: mesh-train and mesh-results stop with one line
naming the file, the damage and the way on; only a store this tool was creating and never finished is
rebuilt without being asked, and ``tracking.rebuild_store=true`` sets a damaged one aside.

One real run (in this process) fills a real sqlite store; each case damages a copy and runs the
real commands: in processes of their own where all they print must be one line (a fresh process's
stderr, warnings included, which pytest would record instead), in this one where the store is the
point (the recover case reads the command the line names from that line, whatever else is said).
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
from helpers import Ran, run_tool, server_environment

from experiments.store.sqlite import forget_engine

BIN = Path(sys.executable).parent
RUN = ("model=tiny", "max_steps=2", "val_every=2", "checkpoint_every=2", "data.seq_len=32", "data.batch_size=4")
RUN += ("data.val_batches=1", "probes.enabled=false")

pytestmark = pytest.mark.slow


def mesh_train(runs_dir: Path, *extra: str) -> subprocess.CompletedProcess:
    """In a process of its own: what it says on stderr is the whole of what a user sees."""
    command = [str(BIN / "mesh-train"), *RUN, f"runs_dir={runs_dir}", *extra]
    return subprocess.run(command, capture_output=True, text=True, timeout=300)


def mesh_train_here(runs_dir: Path, *extra: str) -> Ran:
    """In this process, where the test reads the store and not every line a process would print."""
    return run_tool("mesh-train", *RUN, f"runs_dir={runs_dir}", *extra)


def mesh_results(runs_dir: Path, tmp_path: Path) -> subprocess.CompletedProcess:
    command = [str(BIN / "mesh-results"), "mesh", "--runs-dir", str(runs_dir), "--out", str(tmp_path / "out")]
    return subprocess.run(command, capture_output=True, text=True, timeout=300)


@pytest.fixture(scope="module")
def store_with_a_run(tmp_path_factory) -> Path:
    """A store with one finished run, whole in mlflow.db (no -wal) to be copied: trained in this
    process, its store is closed as a process's exit closes it (MLflow keeps an engine per URI for
    the life of the process) and its WAL written back into the file."""
    runs_dir = tmp_path_factory.mktemp("store")
    done = mesh_train_here(runs_dir)
    assert done.returncode == 0, done.stderr
    db = (runs_dir / "mlflow.db").resolve()
    forget_engine(f"sqlite:///{db}")
    with closing(sqlite3.connect(db)) as connection:
        connection.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    assert not Path(f"{db}-wal").exists() or Path(f"{db}-wal").stat().st_size == 0
    return runs_dir / "mlflow.db"


def root_page(store: Path, name: str) -> int:
    with closing(sqlite3.connect(f"file:{store}?mode=ro", uri=True)) as connection:
        return connection.execute("SELECT rootpage FROM sqlite_master WHERE name = ?", (name,)).fetchone()[0]


def damaged_copy(store: Path, tmp_path: Path, damage: str) -> Path:
    runs_dir = tmp_path / "runs"
    runs_dir.mkdir()
    db = runs_dir / "mlflow.db"
    data = bytearray(store.read_bytes())
    if damage == "truncated":
        data = data[: len(data) // 2]
    elif damage == "overwritten":  # pages overwritten in place: the size is right, the tables are not
        data[4096:] = b"\x5a" * (len(data) - 4096)
    else:  # one page of random bytes: the runs table's, or an index's (a count over runs never reads it)
        page = root_page(store, {"runs page": "runs", "index page": "index_metrics_run_uuid_key_step"}[damage])
        data[(page - 1) * 4096 : page * 4096] = random.Random(damage).randbytes(4096)
    db.write_bytes(bytes(data))
    return db


@pytest.mark.parametrize("damage", ["truncated", "overwritten", "runs page", "index page"])
def test_a_damaged_store_stops_every_command_with_one_line_and_is_kept(store_with_a_run, tmp_path, damage):
    db = damaged_copy(store_with_a_run, tmp_path, damage)
    before = db.read_bytes()
    for done in (mesh_results(db.parent, tmp_path), mesh_train(db.parent, "seed=1")):
        lines = done.stderr.strip().splitlines()
        assert done.returncode == 2 and len(lines) == 1, done.stderr
        assert lines[0].startswith(f"error: the MLflow store {db} is damaged (")
        assert f"python -m experiments.store.recover {db} " in lines[0] and "tracking.rebuild_store=true" in lines[0]
    assert db.read_bytes() == before  # nothing written into it (sqlite's own -wal/-shm may appear beside it)
    assert {p.name for p in db.parent.iterdir()} <= {"mlflow.db", "mlflow.db-wal", "mlflow.db-shm", ".mlflow.db.lock"}


def test_the_recover_command_it_names_gets_the_runs_back(store_with_a_run, tmp_path):
    db = damaged_copy(store_with_a_run, tmp_path, "index page")
    line = mesh_train_here(db.parent, "seed=1").stderr.strip()
    recover = line.split("copy what it still holds with ")[1].split(" and use ")[0]
    done = subprocess.run(recover.replace("python", sys.executable, 1), shell=True, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr  # an index is rebuilt, never read: nothing is lost
    recovered = db.with_name("mlflow-recovered.db")
    assert f"use tracking.tracking_uri=sqlite:///{recovered}" in done.stdout
    before, after = (mlflow.MlflowClient(f"sqlite:///{path}") for path in (store_with_a_run, recovered))
    (original,) = before.search_runs([before.get_experiment_by_name("mesh").experiment_id])
    (run,) = after.search_runs([after.get_experiment_by_name("mesh").experiment_id])
    assert (run.info.run_id, run.info.status, run.data.params, run.data.tags, run.data.metrics) == (
        original.info.run_id,
        original.info.status,
        original.data.params,
        original.data.tags,
        original.data.metrics,
    )
    for key in original.data.metrics:
        assert after.get_metric_history(run.info.run_id, key) == before.get_metric_history(run.info.run_id, key)
    trained = mesh_train_here(db.parent, "seed=1", f"tracking.tracking_uri=sqlite:///{recovered}")  # it takes new runs
    assert trained.returncode == 0, trained.stderr


def test_rebuild_store_sets_a_damaged_store_aside_and_trains_into_a_new_one(store_with_a_run, tmp_path):
    db = damaged_copy(store_with_a_run, tmp_path, "truncated")
    before = db.read_bytes()
    done = mesh_train_here(db.parent, "seed=1", "tracking.rebuild_store=true")
    assert done.returncode == 0, done.stderr
    (aside,) = [p for p in db.parent.glob("mlflow.db.damaged-*") if not p.name.endswith(("-wal", "-shm"))]
    assert aside.read_bytes() == before
    assert sum(f"moved to {aside.name}, created anew" in line for line in done.stderr.splitlines()) == 1
    client = mlflow.MlflowClient(f"sqlite:///{db}")
    (run,) = client.search_runs([client.get_experiment_by_name("mesh").experiment_id])
    assert run.info.status == "FINISHED"


def test_a_store_this_tool_never_finished_creating_is_rebuilt_without_asking(store_with_a_run, tmp_path):
    runs_dir = tmp_path / "runs"
    runs_dir.mkdir()
    db = runs_dir / "mlflow.db"
    db.write_bytes(store_with_a_run.read_bytes()[:8192])  # a copy cut short, as a full disk leaves it
    (runs_dir / ".mlflow.db.creating").touch()  # what creating it leaves until the store opens
    done = mesh_train_here(runs_dir, "seed=1")
    assert done.returncode == 0, done.stderr
    assert sum("was incomplete" in line and "created anew" in line for line in done.stderr.splitlines()) == 1
    assert (
        not (runs_dir / ".mlflow.db.creating").exists() and len(list(runs_dir.glob("mlflow.db.incomplete-*[0-9]"))) == 1
    )


def test_a_tracking_server_that_stops_answering_is_said_once_and_its_return_once(tmp_path, monkeypatch):
    """MLflow's client retries a server that refuses connections for minutes, and training waits on
    it: one line when the retries start, none for each retry, one when a real ``mlflow server``
    (started only once that line was said) answers the same request again."""
    from conftest import free_port

    from experiments.tracking import unwatch_tracking_server, watch_tracking_server

    for name, value in (("MAX_RETRIES", "10"), ("BACKOFF_FACTOR", "1"), ("BACKOFF_JITTER", "0")):
        monkeypatch.setenv(f"MLFLOW_HTTP_REQUEST_{name}", value)
    uri = f"http://127.0.0.1:{free_port()}"
    lines: list[str] = []
    servers: list[subprocess.Popen] = []

    def say(line: str) -> None:
        lines.append(line)
        if not servers:
            port = uri.rsplit(":", 1)[1]
            command = [str(BIN / "mlflow"), "server", "--host", "127.0.0.1", "--port", port, "--workers", "1"]
            command += ["--backend-store-uri", f"sqlite:///{tmp_path / 'server.db'}"]
            servers.append(
                subprocess.Popen(
                    command,
                    cwd=tmp_path,
                    stdout=subprocess.DEVNULL,
                    stderr=subprocess.DEVNULL,
                    env=server_environment(),
                )
            )

    watch_tracking_server(uri, say)
    try:
        experiments = mlflow.MlflowClient(uri).search_experiments()
    finally:
        unwatch_tracking_server()
        for server in servers:
            server.terminate()
            server.wait(timeout=60)
    assert [e.name for e in experiments] == ["Default"]
    assert len(lines) == 2, lines
    assert lines[0].startswith(f"[mesh] the MLflow server {uri} does not answer (") and "Connection refused" in lines[0]
    assert lines[0].endswith("; retrying, logging waits")
    assert lines[1].startswith(f"[mesh] the MLflow server {uri} answers again after ")
    assert lines[1].endswith("s; logging goes on")
