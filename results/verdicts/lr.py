"""Learning-rate sensitivity: each variant's validation PPL at every peak LR it was run at, its best LR.

A grid that varies the peak LR (``mesh-sweep lr``) gives rows that differ by LR alone. They are
regrouped here by variant (the row's label without the LR), so a report can say which LR each
variant got and show the curve, and the comparison that follows can run every variant at its own
best LR (``optim.lr_by_scheme``) rather than at one LR that may suit some schemes more than others.

The best LR is the one with the lowest mean over seeds. Its lead over the next LR is reported in %
of PPL, a description rather than a test (the LRs were chosen, not sampled); a best LR at the edge
of the values tried is flagged, since the optimum may lie beyond it. Whether the best and the
runner-up are **within noise** is said per variant: the runner-up minus the best in log PPL, paired
on their common seeds where they share at least 3 (else Welch; results/stats/comparison.py), is within noise
when it is at most ``NOISE_SES`` (2) standard errors of that difference over seeds. It is a
description of seed noise, not a test (with the 2 seeds of an LR sweep the SE itself is rough): a
variant whose two best LRs are within noise has no settled best LR, and the choice between them
may change a comparison made at either.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from typing import Any

import pandas as pd

from results.rows.aggregate import Results, Row
from results.stats.comparison import Comparison

NOISE_SES = 2.0  # the best LR and the runner-up are within noise when their gap is at most this many SEs


LR_PARAM = "peak_lr"  # the LR a run trained at, logged whatever set it (optim.lr, the preset, lr_by_scheme)


# What a row's label says of its LR: optim.lr=..., or an entry of optim.lr_by_scheme (logged flat).
_LR_OVERRIDE = re.compile(r"\s*\boptim\.lr(?:_by_scheme\.\w+)?=\S+")


@dataclass(frozen=True)
class LrPoint:
    lr: float
    row: Row

    def ppl(self, metric: str) -> tuple[float, float | None, int]:
        stat = self.row.stats[metric]
        return stat.mean, stat.std, stat.n


@dataclass(frozen=True)
class LrCurve:
    """One variant (scheme, layout, B, other overrides) at each LR, in increasing LR."""

    variant: str
    scheme: str
    block: str
    points: tuple[LrPoint, ...]
    metric: str

    @property
    def best(self) -> LrPoint:
        return min(self.points, key=lambda p: p.row.stats[self.metric].mean)

    @property
    def at_edge(self) -> bool:
        return len(self.points) > 2 and self.best.lr in (self.points[0].lr, self.points[-1].lr)

    @property
    def runner_up(self) -> LrPoint | None:
        """The LR with the second-lowest mean (None with one LR)."""
        ranked = sorted(self.points, key=lambda p: p.row.stats[self.metric].mean)
        return ranked[1] if len(ranked) > 1 else None

    @property
    def gap(self) -> Comparison | None:
        """Runner-up minus best in log PPL over seeds (paired on common seeds where possible)."""
        other = self.runner_up
        if other is None:
            return None
        return other.row.compare(self.best.row, self.metric)

    @property
    def within_noise(self) -> bool | None:
        """The gap is at most ``NOISE_SES`` SEs; None when there is no SE (a side with one seed)."""
        gap = self.gap
        if gap is None or gap.se is None:
            return None
        return abs(gap.diff) <= NOISE_SES * gap.se

    @property
    def noise_text(self) -> str:
        """``8e-3: +1.6% (2 SE 5.0%), within noise``."""
        gap, other = self.gap, self.runner_up
        if gap is None or other is None:
            return "—"
        head = f"{_lr_text(other.lr)}: +{100 * math.expm1(gap.diff):.1f}%"
        if gap.se is None:
            return head + " (no SE: fewer than 2 seeds)"
        verdict = "within noise" if self.within_noise else "beyond noise"
        return head + f" (2 SE {100 * math.expm1(NOISE_SES * gap.se):.1f}%, {gap.test}), {verdict}"

    @property
    def lead_pct(self) -> float | None:
        """How much lower (in % of PPL) the best LR's mean is than the next best's."""
        means = sorted(p.row.stats[self.metric].mean for p in self.points)
        return None if len(means) < 2 else 100.0 * (means[1] / means[0] - 1.0)


def _log(sample: Any) -> Any:
    if isinstance(sample, dict):
        return {k: math.log(v) for k, v in sample.items()}
    return [math.log(v) for v in sample]


def run_lr(results: Results, row: Row) -> float | None:
    """The peak LR of ``row``'s runs, when they logged one and agree on it."""
    runs = results.runs[results.runs["run_id"].isin(row.run_ids)]
    values = set()
    for params in runs.get("params", pd.Series(dtype=object)):
        if not isinstance(params, dict) or params.get(LR_PARAM) in (None, "None", ""):
            return None
        values.add(float(params[LR_PARAM]))
    return values.pop() if len(values) == 1 else None


def lr_curves(results: Results) -> list[LrCurve]:
    """The variants run at two or more LRs, in the report's block and row order; empty otherwise."""
    metric = results.ppl_metric
    curves = []
    for block in results.blocks:
        variants: dict[str, list[LrPoint]] = {}
        schemes: dict[str, str] = {}
        for row in block.rows:
            lr = run_lr(results, row)
            if lr is None or metric not in row.stats:
                continue
            variant = _LR_OVERRIDE.sub("", row.label).strip()
            variants.setdefault(variant, []).append(LrPoint(lr, row))
            schemes[variant] = row.scheme
        for variant, points in variants.items():
            if len({p.lr for p in points}) >= 2:
                ordered = tuple(sorted(points, key=lambda p: p.lr))
                curves.append(LrCurve(variant, schemes[variant], block.name, ordered, metric))
    return curves


def best_lrs(results: Results) -> dict[str, float]:
    """variant -> its best peak LR, for every variant run at two or more LRs."""
    return {curve.variant: curve.best.lr for curve in lr_curves(results)}


def lr_frame(curves: list[LrCurve]) -> pd.DataFrame:
    """One line per (variant, LR): mean, sd and n of the PPL, and whether it is the variant's best."""
    records = []
    for curve in curves:
        best = curve.best.lr
        noise = curve.within_noise
        runner = curve.runner_up
        for point in curve.points:
            mean, std, n = point.ppl(curve.metric)
            records.append(
                {
                    "block": curve.block,
                    "variant": curve.variant,
                    "scheme": curve.scheme,
                    "lr": point.lr,
                    f"{curve.metric}_mean": mean,
                    f"{curve.metric}_std": std,
                    "n": n,
                    "best": point.lr == best,
                    # on the best LR's line: the runner-up and whether the two are within noise
                    "runner_up_lr": runner.lr if point.lr == best and runner else None,
                    "within_noise": noise if point.lr == best else None,
                }
            )
    return pd.DataFrame.from_records(records)


def _lr_text(lr: float) -> str:
    """``4e-3``, ``1.6e-2``: one notation for every LR of a sweep."""
    mantissa, exponent = f"{lr:.3e}".split("e")
    return f"{float(mantissa):g}e{int(exponent)}"
