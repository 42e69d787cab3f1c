"""Checking a store never takes away the locks of the connection this process holds on it.

A grid's parent and its pool workers keep MLflow's pooled connection to the sqlite store open
while they plan and check the next cell. A check that read the file with ``open()`` dropped the
process's POSIX locks on it, among them the shared lock of its WAL connection; the next process to
close its last connection then took the store for itself and deleted the WAL and shared memory
the others were writing to, and a 39-run grid's store came apart ("database disk image is
malformed"). The checks now ask SQLite, whose opens keep the process's locks.
"""

from __future__ import annotations

import sqlite3
import subprocess
import sys
from pathlib import Path

import mlflow
import pytest

from experiments.store.check import check_tracking_uri
from experiments.store.sqlite import check_store_intact, prepare_sqlite_store, sqlite_damage

# Another cell's process: it opens the store, writes, and closes its last connection as it ends.
ANOTHER_PROCESS_WRITES_AND_ENDS = """
import sqlite3, sys
connection = sqlite3.connect(sys.argv[1], timeout=30)
connection.execute("CREATE TABLE IF NOT EXISTS other_process (i INTEGER)")
connection.execute("INSERT INTO other_process VALUES (1)")
connection.commit()
connection.close()
"""

CHECKS = {
    "check_tracking_uri": lambda uri, db: check_tracking_uri(uri),  # plan_run, before every cell
    "check_store_intact": lambda uri, db: check_store_intact(uri),  # mesh-results, the verdict tables
    "sqlite_damage": lambda uri, db: sqlite_damage(db),
    "prepare_sqlite_store": lambda uri, db: prepare_sqlite_store(uri),  # every run's start
}


@pytest.mark.parametrize("check", sorted(CHECKS))
def test_a_check_in_a_process_holding_the_store_keeps_its_wal_alive(tmp_path, check):
    db = tmp_path / "mlflow.db"
    uri = f"sqlite:///{db}"
    prepare_sqlite_store(uri)
    client = mlflow.MlflowClient(uri)
    run_id = client.create_run(client.create_experiment("grid")).info.run_id
    client.log_metric(run_id, "val/ppl", 100.0, step=0)  # this process now holds a WAL connection

    CHECKS[check](uri, db)
    ended = subprocess.run([sys.executable, "-c", ANOTHER_PROCESS_WRITES_AND_ENDS, str(db)], timeout=60)
    assert ended.returncode == 0

    # The other process knew it was not the last: the WAL this process writes to is still the store's.
    assert Path(f"{db}-wal").exists() and Path(f"{db}-shm").exists()
    for step in range(1, 40):
        client.log_metric(run_id, "val/ppl", 100.0 - step, step=step)
    client.set_terminated(run_id)

    reader = sqlite3.connect(db)
    try:
        assert reader.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
        assert reader.execute("SELECT count(*) FROM other_process").fetchone()[0] == 1
    finally:
        reader.close()
    fresh = mlflow.MlflowClient(uri)
    history = fresh.get_metric_history(run_id, "val/ppl")
    assert [m.step for m in sorted(history, key=lambda m: m.step)] == list(range(40))
    assert fresh.get_run(run_id).info.status == "FINISHED"
