"""The group-sequential design over seeds (results/stats/sequential.py), simulated: power against the
true effect under the one-sided futility rule and under the old two-sided one, and the family-wise
error under the null with and without futility, for claims that share an arm and for the
covariance of the committed one-pass schemes grid.

    .venv/bin/python benchmarks/sequential_design.py              # 100k paths per cell (~2 min)
    .venv/bin/python benchmarks/sequential_design.py --paths 20000

The old rule (before issue 37) stopped a claim as futile when its two-sided 1 - share interval
excluded the paper's effect on either side, so a much better MeSH was called futile: its power
fell as the effect grew. The new rule stops only when the one-sided bound on the paper's side
excludes the paper's effect.
"""

from __future__ import annotations

import argparse
import math
from pathlib import Path

import numpy as np

from results.stats.sequential import Design, decide_paths, family_paths, null_grids, shared_arm_cov

PAPER_EFFECT = -0.036
EFFECTS = (-0.036, -0.07, -0.09, -0.15)
SDS = (0.03, 0.05)
RUNS_CSV = Path(__file__).resolve().parents[1] / "results/cpu-reproduction/one-pass/schemes/runs.csv"
CLAIMS = (("mesh", "base"), ("mesh", "anchor"), ("mesh", "anchor_emb"), ("base", "vanilla"))


def power_table(paths: int, seed: int = 1) -> list[tuple[float, float, float, float]]:
    """(sd, effect, new power, old power) for one claim of a family of 4 at the default design."""
    design = Design(claims=4)
    rows = []
    for sd in SDS:
        for effect in EFFECTS:
            diffs = np.random.default_rng(seed).normal(effect, sd, size=(paths, design.n_max))
            new = float(np.mean(decide_paths(design, diffs, PAPER_EFFECT) == -1))
            old = float(np.mean(decide_paths(design, diffs, PAPER_EFFECT, two_sided_futility=True) == -1))
            rows.append((sd, effect, new, old))
    return rows


def runs_csv_cov(path: Path = RUNS_CSV) -> np.ndarray:
    """The covariance of the four primary claims' per-seed log-PPL differences in a committed runs.csv
    (the seeds every arm ran)."""
    import pandas as pd

    runs = pd.read_csv(path)
    runs = runs[runs["status"] == "FINISHED"]
    logs = runs.pivot_table(index="seed", columns="scheme", values="val/docs/loss")
    logs = logs.dropna()
    diffs = np.stack([logs[a] - logs[b] for a, b in CLAIMS], axis=1)
    return np.cov(diffs, rowvar=False)


def fwer(cov: np.ndarray, paths: int, futility: bool, seed: int = 2) -> float:
    design = Design(claims=len(cov), futility=futility)
    outcomes = family_paths(design, null_grids(cov, paths, design.n_max, seed), PAPER_EFFECT)
    return float((outcomes != 0).any(axis=1).mean())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--paths", type=int, default=100_000)
    args = parser.parse_args()
    print(f"# power of one claim of 4 (stage 3, cap 12, O'Brien-Fleming), {args.paths} paths, paper effect -0.036")
    print("| SD | true effect | power, one-sided futility (new) | power, two-sided futility (old) |")
    print("|---|---|---|---|")
    for sd, effect, new, old in power_table(args.paths):
        print(f"| {sd} | {effect} | {new:.4f} | {old:.4f} |")
    se = math.sqrt(0.05 * 0.95 / args.paths)
    print(f"\n# family-wise error under the null (alpha 0.05, MC SE {se:.4f}), {args.paths} paths")
    print("| covariance | with futility | without futility |")
    print("|---|---|---|")
    for name, cov in (
        ("shared arm, SD 0.05", shared_arm_cov(4, 0.05)),
        (f"{RUNS_CSV.parent.name} runs.csv", runs_csv_cov()),
    ):
        print(f"| {name} | {fwer(cov, args.paths, True):.4f} | {fwer(cov, args.paths, False):.4f} |")


if __name__ == "__main__":
    main()
