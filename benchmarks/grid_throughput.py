"""The main job's grid run sequentially and packed, interleaved, in one invocation.

    .venv/bin/python benchmarks/grid_throughput.py                 # 12 cells x 60 steps, 2 pairs (~12 min on 2 cores)
    .venv/bin/python benchmarks/grid_throughput.py --steps 30 --pairs 1

Each pair runs the ``schemes`` grid of ``mesh-demo`` (6 schemes x 2 seeds, tiny preset) twice in
fresh ``mesh-sweep`` processes and fresh stores: ``launcher=local`` (one cell after another in one
process with every thread: the main job before packing) and the default ``launcher=auto`` (packed,
sweeps/packing.py). The order alternates from pair to pair, so a machine that slows down or speeds
up during the benchmark weighs on both sides. It prints each pair's wall times, the paired ratios
packed / sequential (median, bootstrap 95% interval and spread, benchmarks/paired.py) and the largest relative gap between the two ways' final
training losses, cell by cell (same seeds; the thread count differs, see sweeps/packing.py).

Target (issue: throughput): packed <= 0.67x sequential on 2 cores.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path

import mlflow
from paired import paired_ratio, verdict  # benchmarks/paired.py: the statistics of every A-vs-B benchmark

from results.commands.mesh_demo import SWEEP, main_job_arguments

SEQUENTIAL = ["launcher=local"]
PACKED: list[str] = []  # the default: launcher=auto


def store_of(runs_dir: Path) -> str:
    """The fresh store of one grid: named to ``mesh-sweep`` (``tracking.tracking_uri``) and read back from
    it, so a ``$MLFLOW_TRACKING_URI`` in the environment neither receives the runs nor hides them."""
    return f"sqlite:///{runs_dir.resolve() / 'mlflow.db'}"


def run_grid(launch: list[str], steps: int, seeds: int, runs_dir: Path, extra: Sequence[str] = ()) -> float:
    """Wall seconds of one ``mesh-sweep`` of the main job's grid into ``runs_dir`` (its store: :func:`store_of`)."""
    arguments = main_job_arguments(steps, seeds, runs_dir, [f"tracking.tracking_uri={store_of(runs_dir)}", *extra])
    command = [str(Path(sys.executable).parent / "mesh-sweep"), SWEEP, *arguments]
    started = time.perf_counter()
    result = subprocess.run([*command, *launch], capture_output=True, text=True)
    seconds = time.perf_counter() - started
    if result.returncode != 0:
        sys.exit(
            f"grid_throughput: {' '.join(command + launch)} failed:\n{result.stdout[-3000:]}{result.stderr[-3000:]}"
        )
    packing = [line for line in result.stdout.splitlines() if "packing:" in line]
    print(f"    {'packed' if not launch else 'sequential'}: {seconds:7.1f} s  {packing[0].strip() if packing else ''}")
    return seconds


def final_losses(runs_dir: Path) -> dict[tuple[str, str], float]:
    client = mlflow.MlflowClient(store_of(runs_dir))
    experiment = client.get_experiment_by_name(SWEEP)
    runs = [r for r in client.search_runs([experiment.experiment_id]) if r.data.tags.get("kind") != "sweep"]
    return {(r.data.params["scheme"], r.data.params["seed"]): r.data.metrics["train/loss"] for r in runs}


def largest_gap(a: dict[tuple[str, str], float], b: dict[tuple[str, str], float]) -> float:
    if a.keys() != b.keys():
        sys.exit(f"grid_throughput: the two grids ran different cells: {sorted(a)} vs {sorted(b)}")
    return max(abs(a[k] - b[k]) / abs(b[k]) for k in a)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=60, help="training steps per cell (the main job runs 400)")
    parser.add_argument("--seeds", type=int, default=2)
    parser.add_argument("--pairs", type=int, default=2, help="sequential/packed pairs, order alternating")
    parser.add_argument("overrides", nargs="*", help="more overrides for every run (tests: a smaller cell)")
    args = parser.parse_args(argv)

    packed, sequential, gaps = [], [], []
    with tempfile.TemporaryDirectory(prefix="grid-throughput-") as scratch:
        for pair in range(args.pairs):
            print(f"pair {pair + 1}/{args.pairs}")
            order = [("sequential", SEQUENTIAL), ("packed", PACKED)]
            if pair % 2:
                order.reverse()
            seconds, losses = {}, {}
            for name, launch in order:
                runs_dir = Path(scratch) / f"{pair}-{name}"
                seconds[name] = run_grid(launch, args.steps, args.seeds, runs_dir, args.overrides)
                losses[name] = final_losses(runs_dir)
            packed.append(seconds["packed"])
            sequential.append(seconds["sequential"])
            gaps.append(largest_gap(losses["packed"], losses["sequential"]))
            print(f"    packed / sequential = {packed[-1] / sequential[-1]:.3f}; largest final-loss gap {gaps[-1]:.1e}")

    cells = len(losses["packed"])
    print(f"\n{SWEEP} grid, {cells} cells x {args.steps} steps, {args.pairs} interleaved pair(s)")
    ratio = paired_ratio(packed, sequential)
    print(f"packed / sequential wall time: {ratio.format()} (median [95% interval]), spread {ratio.spread()}")
    print(f"final train loss, largest relative gap: {max(gaps):.1e}")
    print(f"target packed <= 0.67x sequential: {verdict(ratio, at_most=0.67)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
