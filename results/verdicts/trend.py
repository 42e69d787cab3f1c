"""MeSH's gap to another arm at a size or token point against the same gap at the reference point:
the rule declared in sweeps/conf/sweep/size_tokens.yaml (issue 49, part 4).

At each point, a comparison's gap is the mean over seeds of the per-seed
Δ = log PPL(MeSH arm) - log PPL(other arm) (final validation loss; both arms on the same seeds),
with its paired t 95% interval: "MeSH lower", "MeSH higher" when the interval excludes 0, else
"inconclusive". The trend from the reference point: the Welch 95% interval of (the point's mean Δ)
minus (the reference's mean Δ), the two taken on different seeds: "the gap closes" when the whole
interval is below 0 (MeSH gains on the other arm), "the gap widens" when above, else "no change
shown". At 3 seeds these words describe what the runs show; an interval that covers 0 is a finding.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import pandas as pd

from results.rows.arms import ArmSpec, arm_runs
from results.rows.frame import ResultsError
from results.stats.shape import MeanInterval, WelchInterval, t_interval, welch_interval

MESH_LOWER, MESH_HIGHER, INCONCLUSIVE = "MeSH lower", "MeSH higher", "inconclusive"
CLOSES, WIDENS, NO_CHANGE = "the gap closes", "the gap widens", "no change shown"
NO_REFERENCE, NO_RUNS = "no reference", "no runs at this point"


@dataclass(frozen=True)
class Point:
    """One point of the study: its name (``tiny, 11.7M tokens``) and the runs.csv lines of the
    report folders it is read from, in order (a comparison takes the first folder with both arms)."""

    name: str
    folders: tuple[tuple[str, pd.DataFrame], ...]  # (folder as given, its runs.csv)


@dataclass(frozen=True)
class Gap:
    """``first`` minus ``second`` at one point, paired by seed."""

    point: str
    first: str
    second: str
    folder: str  # where its runs are ("" when no folder has both arms)
    seeds: tuple[int, ...]
    deltas: tuple[float, ...]  # per seed, log PPL(first) - log PPL(second)
    interval: MeanInterval

    @property
    def word(self) -> str:
        low, high = self.interval.low, self.interval.high
        if self.interval.n < 2 or not math.isfinite(low):
            return INCONCLUSIVE
        return MESH_LOWER if high < 0 else MESH_HIGHER if low > 0 else INCONCLUSIVE


@dataclass(frozen=True)
class Trend:
    """A gap at a point against the same comparison's gap at the reference point."""

    gap: Gap
    reference: Gap
    change: WelchInterval  # gap's mean minus reference's mean

    @property
    def word(self) -> str:
        if self.gap.interval.n == 0:
            return NO_RUNS
        if self.reference.interval.n == 0:
            return NO_REFERENCE
        if not math.isfinite(self.change.low):  # one seed on a side, or no spread at all
            return INCONCLUSIVE
        return CLOSES if self.change.high < 0 else WIDENS if self.change.low > 0 else NO_CHANGE


def final_losses(frame: pd.DataFrame, arm: ArmSpec, folder: str) -> pd.Series:
    """Each seed's final validation loss of ``arm``'s run; an error where a seed has two runs of the
    arm (the folder's runs differ in something the arm does not name: the loop rule, an LR)."""
    runs = arm_runs(frame, arm)
    if runs.empty:
        return pd.Series(dtype=float)
    seeds = runs["seed"].astype(int)
    twice = seeds[seeds.duplicated()]
    if not twice.empty:
        rows = sorted(set(runs.loc[seeds == twice.iloc[0], "row"].astype(str))) if "row" in runs else []
        raise ResultsError(
            f"{folder}: arm {arm.name} has {int((seeds == twice.iloc[0]).sum())} runs of seed {twice.iloc[0]}"
            + (f" (rows {'; '.join(rows)})" if rows else "")
            + "; give a folder with one run per arm and seed (mesh-results --filter)"
        )
    return pd.Series(runs["val_loss"].astype(float).to_numpy(), index=seeds.to_numpy())


def gap(point: Point, first: ArmSpec, second: ArmSpec) -> Gap:
    """``first`` minus ``second`` on the seeds both ran, in the first of the point's folders where
    they share at least one seed."""
    for folder, frame in point.folders:
        a, b = final_losses(frame, first, folder), final_losses(frame, second, folder)
        seeds = sorted(set(a.index) & set(b.index))
        if seeds:
            deltas = tuple(float(a[s] - b[s]) for s in seeds)
            return Gap(point.name, first.name, second.name, folder, tuple(seeds), deltas, t_interval(deltas))
    return Gap(point.name, first.name, second.name, "", (), (), t_interval([]))


def trend(at: Gap, reference: Gap) -> Trend:
    return Trend(at, reference, welch_interval(at.deltas, reference.deltas))


@dataclass(frozen=True)
class TrendStudy:
    """Every comparison at the reference and at each point, and each point's trend."""

    reference: Point
    points: tuple[Point, ...]
    comparisons: tuple[tuple[ArmSpec, ArmSpec], ...]
    gaps: dict[tuple[str, str, str], Gap]  # (point, first, second) -> gap, the reference's included
    trends: tuple[Trend, ...]


def study(reference: Point, points: Sequence[Point], comparisons: Sequence[tuple[ArmSpec, ArmSpec]]) -> TrendStudy:
    gaps: dict[tuple[str, str, str], Gap] = {}
    trends = []
    for first, second in comparisons:
        ref = gap(reference, first, second)
        gaps[(reference.name, first.name, second.name)] = ref
        for point in points:
            at = gap(point, first, second)
            gaps[(point.name, first.name, second.name)] = at
            trends.append(trend(at, ref))
    return TrendStudy(reference, tuple(points), tuple(comparisons), gaps, tuple(trends))


__all__ = [
    "CLOSES",
    "INCONCLUSIVE",
    "MESH_HIGHER",
    "MESH_LOWER",
    "NO_CHANGE",
    "NO_REFERENCE",
    "NO_RUNS",
    "WIDENS",
    "Gap",
    "Point",
    "Trend",
    "TrendStudy",
    "final_losses",
    "gap",
    "study",
    "trend",
]
