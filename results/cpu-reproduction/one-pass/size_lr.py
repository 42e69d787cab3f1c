"""The declared rule of the size point's anchors at one LR (``sweeps/conf/sweep/size_lr.yaml``),
applied to two report folders' ``runs.csv``: ``decision.md`` in the second.

    python results/cpu-reproduction/one-pass/size_lr.py one-pass/size_tokens/size one-pass/size_tokens/size_one_lr

The first folder is the size point as declared (the anchors at 8e-3); the second the same point with
every arm at 4e-3 (``mesh-results size_tokens,size_lr --filter "params.model = 'mini' and
params.peak_lr = '0.004'"``: the size point's base and MeSH runs with size_lr's anchors). Per anchor
arm, the paired Δ log PPL (final validation loss) of the arm at 4e-3 minus at 8e-3 over the seeds
both have, with its 95% t interval: below 0 "the mini deficit comes with the LR", above 0 "not with
the LR", else "not separated at these seeds"; fewer than the declared 3 seeds: not read. Then every
MeSH arm against every other arm at one LR, paired t 95%, beside the same gap in the first folder.
"""

from __future__ import annotations

import argparse
import math
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from results.commands.trend import read_runs
from results.rows.arms import ArmSpec, arm_spec
from results.stats.shape import MeanInterval, t_interval
from results.verdicts.trend import Point, final_losses, gap

ANCHORS = ("anchor", "anchor_emb")
MESH_ARMS = ("mesh", "mesh_residual_read")
OTHERS = ("anchor", "anchor_emb", "base")
SEEDS = 3  # declared: 300, 301, 302

WITH_LR = "the mini deficit comes with the LR"
NOT_WITH_LR = "not with the LR"
NOT_SEPARATED = "not separated at these seeds"
NOT_READ = "not read"


@dataclass(frozen=True)
class LrChange:
    """One anchor arm at 4e-3 minus at 8e-3, paired by seed (log PPL = the final validation loss)."""

    arm: str
    seeds: tuple[int, ...]
    high_loss: tuple[float, ...]  # at 8e-3, per seed
    low_loss: tuple[float, ...]  # at 4e-3, per seed
    interval: MeanInterval

    @property
    def reading(self) -> str:
        if len(self.seeds) < SEEDS:
            return f"{NOT_READ} ({len(self.seeds)} of {SEEDS} seeds at both LRs)"
        if self.interval.high < 0:
            return WITH_LR
        if self.interval.low > 0:
            return NOT_WITH_LR
        return NOT_SEPARATED


def lr_change(high: Point, low: Point, arm: ArmSpec) -> LrChange:
    """``arm`` at 4e-3 (``low``'s folder) minus at 8e-3 (``high``'s), paired by seed."""
    (high_folder, high_runs), (low_folder, low_runs) = high.folders[0], low.folders[0]
    at_high, at_low = final_losses(high_runs, arm, high_folder), final_losses(low_runs, arm, low_folder)
    seeds = tuple(sorted(set(at_high.index) & set(at_low.index)))
    deltas = [float(at_low[s] - at_high[s]) for s in seeds]
    return LrChange(
        arm.name, seeds, tuple(at_high[s] for s in seeds), tuple(at_low[s] for s in seeds), t_interval(deltas)
    )


def _gap_text(seeds: Sequence[int], interval: MeanInterval) -> str:
    if not seeds:
        return "no runs"
    if interval.n < 2:  # its text says the n already
        return interval.text()
    return f"{interval.text()} (n = {interval.n}, {math.expm1(interval.mean) * 100:+.1f}% PPL)"


def render(changes: Sequence[LrChange], gaps: Sequence[tuple[str, str, str]], folders: tuple[Path, Path]) -> str:
    lines = [
        "# The size point's anchors at one LR: the declared reading",
        "",
        "Declared in `sweeps/conf/sweep/size_lr.yaml` before its runs (and after the size point's 8e-3 anchor "
        "runs had been seen): per anchor arm, the paired Δ log PPL "
        "(final validation loss on docs) of the arm at 4e-3 minus at 8e-3 on the size point's seeds, 95% t "
        f'interval: below 0 "{WITH_LR}", above 0 "{NOT_WITH_LR}", else "{NOT_SEPARATED}"; fewer than '
        f"{SEEDS} seeds at both LRs: {NOT_READ}. Descriptive at 3 seeds.",
        "",
        f"At 8e-3: `{folders[0]}`; every arm at 4e-3: `{folders[1]}`.",
        "",
        "| arm | seeds | log PPL at 8e-3 | log PPL at 4e-3 | 4e-3 - 8e-3 [95% CI] | reading |",
        "|---|---|---|---|---:|---|",
    ]
    for c in changes:
        lines.append(
            f"| {c.arm} | {' '.join(map(str, c.seeds)) or '-'} | {' '.join(f'{v:.4f}' for v in c.high_loss) or '-'} "
            f"| {' '.join(f'{v:.4f}' for v in c.low_loss) or '-'} | {_gap_text(c.seeds, c.interval)} | {c.reading} |"
        )
    lines += [
        "",
        "## The point read again with every arm at one LR",
        "",
        "Mean per-seed Δ log PPL [paired t 95%], seeds paired; beside it the same gap with the anchors at 8e-3.",
        "",
        "| comparison | every arm at 4e-3 | anchors at 8e-3 (as declared) |",
        "|---|---:|---:|",
        *(f"| {name} | {one} | {declared} |" for name, one, declared in gaps),
        "",
    ]
    return "\n".join(lines)


def decide(high_folder: Path, low_folder: Path) -> str:
    """decision.md's text for the two folders."""
    high, low = (
        Point(name, ((str(folder), read_runs(Path("."), str(folder), name)),))
        for name, folder in (("at_8e3", high_folder), ("at_4e3", low_folder))
    )
    arms = {name: arm_spec(name) for name in {*ANCHORS, *MESH_ARMS, *OTHERS}}
    changes = [lr_change(high, low, arms[name]) for name in ANCHORS]
    gaps = []
    for first in MESH_ARMS:
        for second in OTHERS:
            at_one, declared = (gap(point, arms[first], arms[second]) for point in (low, high))
            gaps.append(
                (
                    f"{first} - {second}",
                    _gap_text(at_one.seeds, at_one.interval),
                    _gap_text(declared.seeds, declared.interval),
                )
            )
    return render(changes, gaps, (high_folder, low_folder))


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("at_8e3", type=Path, help="the size point's report folder (the anchors at 8e-3)")
    parser.add_argument("at_4e3", type=Path, help="the same point with every arm at 4e-3; decision.md goes here")
    args = parser.parse_args(argv)
    try:
        text = decide(args.at_8e3, args.at_4e3)
    except (OSError, ValueError, KeyError) as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    (args.at_4e3 / "decision.md").write_text(text)
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
