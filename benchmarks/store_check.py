"""What the store check costs: :func:`experiments.store.sqlite.sqlite_damage`, run whenever a tool
opens a local store (SQLite's ``quick_check`` of every page up to ``FULL_CHECK_BYTES``, of every
table but ``metrics`` above), against a ``quick_check`` of every page and the ``count(*)`` over the
runs table it replaced, on stores of 12 runs (the main job), 89 runs (the one-pass reproduction's
store, 26 MB) and 10,000 runs.

Each store is made by MLflow's client for one run shaped like the reproduction's (87 params, 13
tags, 80 metric keys, 900 metric values: that store's averages), then cloned row by row in SQL to
the run count. Each check is timed in a fresh connection, page cache warm (the store was just
written, as on a machine that trains), median of ``--repeat`` runs:

    python benchmarks/store_check.py [--runs 12 89 10000] [--repeat 3]
"""

from __future__ import annotations

import argparse
import sqlite3
import statistics
import tempfile
import time
from contextlib import closing
from pathlib import Path

from experiments.store.sqlite import sqlite_damage

PARAMS, TAGS, KEYS, VALUES = 87, 13, 80, 900
RUN_TABLES = ("params", "tags", "metrics", "latest_metrics")


def make_store(folder: Path, runs: int) -> Path:
    import mlflow
    from mlflow.entities import Metric, Param, RunTag

    from experiments.store.sqlite import forget_engine, prepare_sqlite_store

    db = folder / f"runs-{runs}.db"
    uri = f"sqlite:///{db}"
    prepare_sqlite_store(uri)
    client = mlflow.MlflowClient(uri)
    run_id = client.create_run(client.create_experiment("bench")).info.run_id
    metrics = [Metric(f"val/key{i % KEYS}", 1.0 / (i + 1), 1000 + i, i // KEYS) for i in range(VALUES)]
    for start in range(0, VALUES, 1000):
        client.log_batch(run_id, metrics=metrics[start : start + 1000])
    client.log_batch(run_id, params=[Param(f"p{i}", str(i)) for i in range(PARAMS)])
    client.log_batch(run_id, tags=[RunTag(f"t{i}", str(i)) for i in range(TAGS)])
    client.set_terminated(run_id, "FINISHED")
    forget_engine(uri)
    with closing(sqlite3.connect(db)) as connection:
        clones = f"WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n WHERE i < {runs - 1})"
        for table in ("runs", *RUN_TABLES):
            columns = [row[1] for row in connection.execute(f"PRAGMA table_info({table})")]
            chosen = ", ".join("printf('%032d', n.i)" if c == "run_uuid" else f'"{c}"' for c in columns)
            names = ", ".join(f'"{c}"' for c in columns)
            connection.execute(
                f"{clones} INSERT INTO {table} ({names}) SELECT {chosen} FROM {table}, n WHERE run_uuid = ?", (run_id,)
            )
        connection.commit()
        connection.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    return db


def timed(db: Path, sql: str, repeat: int) -> float:
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        with closing(sqlite3.connect(f"file:{db}?mode=ro", uri=True)) as connection:
            connection.execute(sql).fetchone()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def _seconds(function, *args) -> float:
    start = time.perf_counter()
    assert function(*args) is None
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, nargs="+", default=[12, 89, 10_000])
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as folder:
        for runs in args.runs:
            db = make_store(Path(folder), runs)
            quick = timed(db, "PRAGMA quick_check(1)", args.repeat)
            count = timed(db, "SELECT count(*) FROM runs", args.repeat)
            check = statistics.median(_seconds(sqlite_damage, db) for _ in range(args.repeat))
            size = db.stat().st_size / 2**20
            print(
                f"{runs:>6} runs, {size:8.1f} MiB: the store check {check:7.3f} s; quick_check of every page "
                f"{quick:7.3f} s ({quick / max(size, 1e-9) * 1e3:.1f} ms/MiB); count(*) {count * 1e3:6.2f} ms"
            )
            db.unlink()


if __name__ == "__main__":
    main()
