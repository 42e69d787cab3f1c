"""CLI start-up: the wall time of each console script's ``--help`` (and ``mesh-sweep --list``).

    .venv/bin/python benchmarks/cli_startup.py                 # 5 rounds, every command
    .venv/bin/python benchmarks/cli_startup.py --rounds 9 --budget 1.5

Each command runs as a user runs it (a fresh process of the installed console script). The
commands are interleaved, one of each per round, so a burst of load on the machine falls on all
of them alike rather than on whichever ran then. Prints the median, min and max per command, and
whether the median is within ``--budget`` seconds.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

BIN = Path(sys.executable).parent
COMMANDS: tuple[tuple[str, ...], ...] = (
    ("mesh-train", "--help"),
    ("mesh-train", "--version"),
    ("mesh-sweep", "--help"),
    ("mesh-sweep", "--list"),
    ("mesh-results", "--help"),
    ("mesh-model", "--help"),
    ("mesh-model", "params", "--help"),
    ("mesh-probe", "--help"),
    ("mesh-eval", "--help"),
    ("mesh-demo", "--help"),
    ("python", "-m", "experiments.data", "--help"),
)


def argv_of(command: tuple[str, ...]) -> list[str]:
    head = sys.executable if command[0] == "python" else str(BIN / command[0])
    return [head, *command[1:]]


def time_once(command: tuple[str, ...]) -> tuple[float, int]:
    """(wall seconds, exit code) of one fresh run of ``command``."""
    start = time.perf_counter()
    done = subprocess.run(argv_of(command), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    return time.perf_counter() - start, done.returncode


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=5, help="runs of each command (default 5)")
    parser.add_argument("--budget", type=float, default=1.5, help="seconds a median may take (default 1.5)")
    args = parser.parse_args()
    times: dict[tuple[str, ...], list[float]] = {c: [] for c in COMMANDS}
    codes: dict[tuple[str, ...], set[int]] = {c: set() for c in COMMANDS}
    for command in COMMANDS:  # one unmeasured run each: compiled bytecode, the page cache
        time_once(command)
    load_before = os.getloadavg()[0]
    for _ in range(args.rounds):
        for command in COMMANDS:
            seconds, code = time_once(command)
            times[command].append(seconds)
            codes[command].add(code)
    print(
        f"# {args.rounds} rounds, interleaved, on {os.cpu_count()} CPUs; "
        f"load average {load_before:.2f} before, {os.getloadavg()[0]:.2f} after"
    )
    print("| command | median s | min s | max s | within budget |")
    print("|---|---|---|---|---|")
    for command, samples in times.items():
        median = statistics.median(samples)
        ok = "yes" if median <= args.budget else "**no**"
        if codes[command] != {0}:
            ok += f" (exit {', '.join(map(str, sorted(codes[command])))})"
        print(f"| `{' '.join(command)}` | {median:.2f} | {min(samples):.2f} | {max(samples):.2f} | {ok} |")


if __name__ == "__main__":
    main()
