"""The numbers of a depth study (issue 48, sweeps/conf/sweep/depth.yaml): the t interval of a mean
of per-seed differences (each seed's model against itself, or two arms paired by seed), and a curve
read at a point between its measured ones."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
from scipy import stats as scipy_stats

from results.stats.comparison import CONFIDENCE


@dataclass(frozen=True)
class MeanInterval:
    """The mean of n per-seed values, their sample sd, and the two-sided t interval of the mean
    (df n - 1; NaN ends for n < 2)."""

    n: int
    mean: float
    sd: float
    low: float
    high: float

    def text(self, digits: int = 4) -> str:
        if self.n < 2:
            return f"{self.mean:+.{digits}f} (n = {self.n})"
        return f"{self.mean:+.{digits}f} [{self.low:+.{digits}f}, {self.high:+.{digits}f}]"


def t_interval(values: Sequence[float], confidence: float = CONFIDENCE) -> MeanInterval:
    """The one-sample t interval of the mean of ``values`` (finite ones): the paired t interval when
    they are per-seed differences. Equals ``scipy.stats.ttest_1samp(values, 0).confidence_interval``."""
    kept = [float(v) for v in values if math.isfinite(float(v))]
    n = len(kept)
    if n == 0:
        return MeanInterval(0, math.nan, math.nan, math.nan, math.nan)
    mean = math.fsum(kept) / n
    if n < 2:
        return MeanInterval(1, mean, math.nan, math.nan, math.nan)
    sd = math.sqrt(math.fsum((v - mean) ** 2 for v in kept) / (n - 1))
    half = float(scipy_stats.t.ppf(0.5 + confidence / 2, n - 1)) * sd / math.sqrt(n)
    return MeanInterval(n, mean, sd, mean - half, mean + half)


def value_at(xs: Sequence[float], ys: Sequence[float], x: float) -> float:
    """The piecewise-linear curve through (xs, ys), sorted by x, at ``x``; NaN outside the measured
    range. Where several points share an x (thresholds that exited the same tokens), the first given
    is kept."""
    points: dict[float, float] = {}
    for a, b in zip(xs, ys, strict=True):
        if math.isfinite(a) and math.isfinite(b):
            points.setdefault(float(a), float(b))
    if not points:
        return math.nan
    order = sorted(points)
    if not order[0] <= x <= order[-1]:
        return math.nan
    return float(np.interp(x, order, [points[a] for a in order]))


__all__ = ["MeanInterval", "t_interval", "value_at"]
