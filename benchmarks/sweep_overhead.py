"""Sweep overhead: a grid's wall time against the time its runs spend training.

    .venv/bin/python benchmarks/sweep_overhead.py                 # schemes grid, 6 tiny runs, 100 steps each
    .venv/bin/python benchmarks/sweep_overhead.py --steps 300 --launcher parallel

Runs ``mesh-sweep`` as a user would (a fresh process, a fresh runs directory), then reads every
run's ``result.json`` timing (experiments/callbacks/timing.py): steps (forward/backward/optimizer), the
gaps between them (data fetch, logging, checkpoints), validation, set-up before the first step
and the end of the run (probes, final checkpoint, MLflow). The driver's own cost is the grid's
wall time minus the runs' totals. Overhead = everything but steps, gaps and validation.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

PARTS = ("setup_s", "steps_s", "between_steps_s", "validation_s", "end_s", "total_s")
TWO_MINUTES = 120.0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sweep", default="schemes")
    parser.add_argument("--steps", type=int, default=100)
    parser.add_argument("--launcher", default="local")
    parser.add_argument("--probes", default="true", choices=["true", "false"])
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as runs:
        command = [
            str(Path(sys.executable).with_name("mesh-sweep")),
            args.sweep,
            "model=tiny",
            f"max_steps={args.steps}",
            f"val_every={args.steps}",
            f"checkpoint_every={args.steps}",
            f"probes.enabled={args.probes}",
            f"launcher={args.launcher}",
            f"runs_dir={runs}",
        ]
        start = time.perf_counter()
        subprocess.run(command, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        wall = time.perf_counter() - start
        timings = [json.loads(p.read_text())["timing"] for p in Path(runs).glob("*/*/result.json")]
    n = len(timings)
    sums = {part: sum(t[part] for t in timings) for part in PARTS}
    training = sums["steps_s"] + sums["between_steps_s"] + sums["validation_s"]
    driver = wall - sums["total_s"] if args.launcher == "local" else float("nan")
    per_run_overhead = (wall - training) / n if args.launcher == "local" else (sums["total_s"] - training) / n
    print(f"# command: {' '.join(command[:1])} {' '.join(command[1:-1])} runs_dir=<tmp>")
    print(f"\n{n} runs, grid wall time {wall:.1f} s\n")
    print("| part | total s | per run s | share of wall |")
    print("|---|---|---|---|")
    for part in PARTS[:-1]:
        print(
            f"| {part.removesuffix('_s')} | {sums[part]:.1f} | {sums[part] / n:.2f} | {100 * sums[part] / wall:.1f}% |"
        )
    if args.launcher == "local":
        print(
            f"| driver (imports, composition, parent run) | {driver:.1f} | {driver / n:.2f} | {100 * driver / wall:.1f}% |"
        )
    print(
        f"\nper-run overhead (wall minus steps, gaps and validation, per run): {per_run_overhead:.2f} s "
        f"= {100 * per_run_overhead / TWO_MINUTES:.1f}% of a 2-minute run "
        f"({100 * per_run_overhead / (training / n):.1f}% of these {training / n:.1f} s runs)"
    )


if __name__ == "__main__":
    main()
