"""A new sqlite MLflow store: copied from the empty one (``experiments/store/sqlite.py``) against
MLflow's own creation, which runs every schema migration.

    .venv/bin/python benchmarks/store_creation.py              # 7 pairs (~1 min)
    .venv/bin/python benchmarks/store_creation.py --rounds 15

As in a run, each store is made by a fresh process (a new ``runs_dir`` is a new ``mesh-train`` or
``mesh-sweep``): the process imports MLflow and the project first, untimed, then times the creation
from nothing to a store that answers (``prepare_sqlite_store``, WAL included, for ours;
``MlflowClient(...).search_experiments()`` for MLflow's) and prints the seconds. Each round makes one
store each way, in a fresh random order, in fresh folders. The template is made once, before the
rounds, and its making is timed apart. Opening a store costs a fresh process about a second
either way (SQLAlchemy's mappers, MLflow's check of the schema revision); the migrations are what
the copy saves.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from paired import interleave, load_average, paired_ratio

CREATE = """
import logging, sys, time
import mlflow
from experiments.tracking import prepare_sqlite_store
logging.getLogger("mlflow").setLevel(logging.WARNING)
way, uri = sys.argv[1:]
start = time.perf_counter()
if way == "template":
    prepare_sqlite_store(uri)
else:
    mlflow.MlflowClient(uri).search_experiments(max_results=1)
print(time.perf_counter() - start)
"""


def create(way: str, folder: Path) -> float:
    """Seconds a fresh process took to make a store in ``folder`` the ``way`` given."""
    folder.mkdir(parents=True)
    done = subprocess.run(
        [sys.executable, "-c", CREATE, way, f"sqlite:///{folder / 'mlflow.db'}"],
        capture_output=True,
        text=True,
        check=True,
    )
    return float(done.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=7, help="pairs of stores (default 7)")
    args = parser.parse_args()
    import mlflow

    from experiments.store.sqlite import template_path

    work = Path(tempfile.mkdtemp(prefix="store-bench-"))
    os.environ["MESH_CACHE_DIR"] = str(work / "cache")  # a cold cache: the first store makes the template
    first = create("template", work / "first")
    counter = iter(range(10**6))
    times = interleave(
        {
            "template": lambda: create("template", work / f"ours-{next(counter)}"),
            "mlflow": lambda: create("mlflow", work / f"mlflow-{next(counter)}"),
        },
        rounds=args.rounds,
    )
    ratio = paired_ratio(times["template"], times["mlflow"])
    median, ours = statistics.median(times["mlflow"]), statistics.median(times["template"])
    print(f"MLflow {mlflow.__version__}, template {template_path().stat().st_size / 1e6:.2f} MB; load {load_average()}")
    print(f"first store (makes the template, then copies it): {first:.2f} s")
    print(
        f"median over {args.rounds} stores: MLflow's own creation {median:.2f} s, a copy of the template {ours:.3f} s"
    )
    print(f"copied / MLflow's: {ratio.format()} (spread {ratio.spread()}); saved per new store: {median - ours:.2f} s")


if __name__ == "__main__":
    main()
