"""The numbers of a depth study (issue 48, sweeps/conf/sweep/depth.yaml): the t interval of a mean
of per-seed differences (each seed's model against itself, or two arms paired by seed), and a curve
read at a point between its measured ones; and of a size-and-tokens trend (issue 49,
sweeps/conf/sweep/size_tokens.yaml): the Welch interval of the difference of two such means, taken
on different seeds."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

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


@dataclass(frozen=True)
class WelchInterval:
    """The difference of two means on independent samples (``first`` minus ``second``), its Welch
    standard error and degrees of freedom, and the two-sided Welch t interval (NaN ends when either
    sample has fewer than two values or both have no spread)."""

    n_first: int
    n_second: int
    diff: float
    se: float
    df: float
    low: float
    high: float

    def text(self, digits: int = 4) -> str:
        if not math.isfinite(self.diff):  # a side without a value: nothing to subtract
            return "-"
        if not math.isfinite(self.low):
            return f"{self.diff:+.{digits}f} (no interval)"
        return f"{self.diff:+.{digits}f} [{self.low:+.{digits}f}, {self.high:+.{digits}f}]"


def welch_interval(first: Sequence[float], second: Sequence[float], confidence: float = CONFIDENCE) -> WelchInterval:
    """Welch's t interval of mean(first) - mean(second) (finite values): the samples' variances are
    not pooled and the degrees of freedom are Welch-Satterthwaite's. Equals ``scipy.stats.ttest_ind(
    first, second, equal_var=False).confidence_interval(confidence)``."""
    a, b = t_interval(first, confidence), t_interval(second, confidence)
    diff = a.mean - b.mean
    if a.n < 2 or b.n < 2:
        return WelchInterval(a.n, b.n, diff, math.nan, math.nan, math.nan, math.nan)
    va, vb = a.sd**2 / a.n, b.sd**2 / b.n
    se = math.sqrt(va + vb)
    if se == 0:
        return WelchInterval(a.n, b.n, diff, 0.0, math.nan, math.nan, math.nan)
    df = (va + vb) ** 2 / (va**2 / (a.n - 1) + vb**2 / (b.n - 1))
    half = float(scipy_stats.t.ppf(0.5 + confidence / 2, df)) * se
    return WelchInterval(a.n, b.n, diff, se, df, diff - half, diff + half)


def value_at(xs: Sequence[float], ys: Sequence[float], x: float) -> float:
    """The curve through the points (xs, ys) in the order given (an exit curve: thresholds rising),
    read at ``x``: linear between the first two adjacent points whose xs bracket ``x``; NaN where no
    adjacent pair does (outside what the curve covers). Points with a non-finite value are skipped."""
    points = [(float(a), float(b)) for a, b in zip(xs, ys, strict=True) if math.isfinite(a) and math.isfinite(b)]
    if len(points) == 1 and points[0][0] == x:
        return points[0][1]
    for (x0, y0), (x1, y1) in zip(points, points[1:], strict=False):
        if min(x0, x1) <= x <= max(x0, x1):
            return y0 if x1 == x0 else y0 + (y1 - y0) * (x - x0) / (x1 - x0)
    return math.nan


__all__ = ["MeanInterval", "WelchInterval", "t_interval", "value_at", "welch_interval"]
