"""Is one row's metric different from another's? Two-sided t-tests over seeds.

:func:`compare` takes the per-run values of two rows (``{seed: value}``, or plain values) and
returns a :class:`Comparison`: the difference of means (a - b), its 95% confidence interval and
the two-sided p-value of

* a **paired t-test** on the per-seed differences when both rows ran exactly the same seeds
  (each seed once, at least two): ``paired t (n=3)``, df = n - 1;
* a **paired t-test on the common seeds** when their seed sets differ but at least
  ``MIN_COMMON`` (3) seeds are common: ``paired t (n=6 common of 9+6)``; the seeds only one row
  ran are left out (a sequential design stops arms at different sizes: the pairs are kept);
* otherwise **Welch's t-test** (unequal variances): ``Welch t``, with the Welch-Satterthwaite df.

With fewer than two values on a side (fewer than two pairs), or no spread (a standard error of 0,
or below the round-off of the values: nothing to scale the difference by), there is no test: only
the difference.
:func:`holm` adjusts a family of p-values (Holm's step-down method, family-wise error rate),
:func:`benjamini_hochberg` another (false discovery rate). :func:`equivalent` is the TOST decision
(two one-sided tests at α: the 1 - 2α CI inside ±margin). :func:`power`, :func:`min_detectable`
and :func:`seeds_needed` are the two-sided t-test's power from the noncentral t: paired on the SD
of the per-seed differences (df = n - 1), or, for Welch, the equal-n two-sample approximation with
the pooled SD (n seeds per row, df = 2n - 2).
"""

from __future__ import annotations

import functools
import math
import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from scipy.optimize import brentq
from scipy.stats import nct
from scipy.stats import t as student_t

Sample = Mapping[str, float] | Sequence[float]
CONFIDENCE = 0.95
ALPHA = 0.05
METHOD_SHORT = (
    "paired t-test over seeds when both rows ran the same seeds (or on their common seeds, when at least 3), "
    "else Welch's t-test"
)
METHOD = (
    "two-sided t-test over seeds: a paired t-test on the per-seed differences when both rows ran the "
    "same seeds (paired t (n=...)), or on the seeds both ran when their sets differ and at least 3 are common "
    "(paired t (n=... common of a+b); the other seeds are left out), else Welch's t-test (Welch t, "
    "Welch-Satterthwaite degrees of freedom); "
    "95% confidence interval of the difference of means; no test when a row has fewer than two seeds, "
    "or when there is no spread at all"
)


@dataclass(frozen=True)
class Comparison:
    """a - b over seeds; ``p`` is None (and ``test`` empty, ``reason`` says why) when untested."""

    diff: float
    ci_low: float | None
    ci_high: float | None
    p: float | None
    test: str  # "paired t (n=3)" | "Welch t" | ""
    n_a: int
    n_b: int
    reason: str = ""  # why there is no test: "n < 2" | "no spread"
    df: float | None = None
    se: float | None = None  # standard error of diff
    sd: float | None = None  # paired: SD of the differences; Welch: pooled SD of the two rows

    @property
    def paired(self) -> bool:
        return self.test.startswith("paired")

    @property
    def tested(self) -> bool:
        return self.p is not None

    def scaled(self, factor: float) -> Comparison:
        """The same comparison in other units (e.g. fractions -> % points); p and test unchanged."""

        def scale(value: float | None) -> float | None:
            return None if value is None else value * factor

        return Comparison(
            self.diff * factor,
            scale(self.ci_low),
            scale(self.ci_high),
            self.p,
            self.test,
            self.n_a,
            self.n_b,
            self.reason,
            self.df,
            scale(self.se),
            scale(self.sd),
        )

    def interval(self, confidence: float) -> tuple[float, float] | None:
        """The ``confidence`` CI of diff (None when untested)."""
        if self.se is None or self.df is None:
            return None
        half = float(student_t.ppf(0.5 + confidence / 2.0, self.df)) * self.se
        return self.diff - half, self.diff + half


MIN_COMMON = 3  # seed sets that differ are paired on their common seeds from this many on


def _paired(a: Sample, b: Sample) -> list[tuple[float, float]] | None:
    """(a, b) per seed when both are ``{seed: value}`` over the same seeds, or over at least
    ``MIN_COMMON`` common seeds when the sets differ; else None."""
    if not isinstance(a, Mapping) or not isinstance(b, Mapping):
        return None
    common = set(a) & set(b)
    if set(a) != set(b) and len(common) < MIN_COMMON:
        return None
    return [(float(a[seed]), float(b[seed])) for seed in sorted(common)]


def _untested(diff: float, n_a: int, n_b: int, reason: str) -> Comparison:
    return Comparison(diff, None, None, None, "", n_a, n_b, reason)


ROUND_OFF = 1e-12  # a standard error below this fraction of the values' magnitude is no spread


def _t_result(
    diff: float, se: float, sd: float, scale: float, df: float, test: str, n_a: int, n_b: int, confidence: float
) -> Comparison:
    if not se > ROUND_OFF * scale or not math.isfinite(se):
        return _untested(diff, n_a, n_b, "no spread")
    statistic = diff / se
    p = float(2.0 * student_t.sf(abs(statistic), df))
    half = float(student_t.ppf(0.5 + confidence / 2.0, df)) * se
    return Comparison(diff, diff - half, diff + half, min(p, 1.0), test, n_a, n_b, "", df, se, sd)


def compare(a: Sample, b: Sample, confidence: float = CONFIDENCE) -> Comparison:
    """a - b: paired t-test when ``a`` and ``b`` map the same seeds to values, else Welch's t-test."""
    pairs = _paired(a, b)
    if pairs is not None and len(pairs) >= 2:
        diffs = [x - y for x, y in pairs]
        n = len(diffs)
        diff = statistics.fmean(diffs)
        sd = statistics.stdev(diffs)
        se = sd / math.sqrt(n)
        scale = max(abs(v) for pair in pairs for v in pair)
        test = f"paired t (n={n})" if len(a) == len(b) == n else f"paired t (n={n} common of {len(a)}+{len(b)})"
        return _t_result(diff, se, sd, scale, n - 1, test, n, n, confidence)
    xs = [float(v) for v in (a.values() if isinstance(a, Mapping) else a)]
    ys = [float(v) for v in (b.values() if isinstance(b, Mapping) else b)]
    if not xs or not ys:
        raise ValueError("compare() needs at least one value on each side")
    diff = statistics.fmean(xs) - statistics.fmean(ys)
    if len(xs) < 2 or len(ys) < 2:
        return _untested(diff, len(xs), len(ys), "n < 2")
    va, vb = statistics.variance(xs) / len(xs), statistics.variance(ys) / len(ys)
    se = math.sqrt(va + vb)
    df = (va + vb) ** 2 / (va**2 / (len(xs) - 1) + vb**2 / (len(ys) - 1)) if se > 0 else math.nan
    scale = max(abs(v) for v in xs + ys)
    pooled = math.sqrt(
        ((len(xs) - 1) * statistics.variance(xs) + (len(ys) - 1) * statistics.variance(ys)) / (len(xs) + len(ys) - 2)
    )
    return _t_result(diff, se, pooled, scale, df, "Welch t", len(xs), len(ys), confidence)


def holm(p_values: Sequence[float]) -> list[float]:
    """Holm-adjusted p-values, in the order given: the k-th smallest of m is multiplied by m - k + 1,
    then made monotone (never below an adjusted smaller one) and capped at 1."""
    order = sorted(range(len(p_values)), key=lambda i: p_values[i])
    adjusted = [0.0] * len(p_values)
    running = 0.0
    for rank, index in enumerate(order):
        running = max(running, min(1.0, (len(p_values) - rank) * p_values[index]))
        adjusted[index] = running
    return adjusted


def benjamini_hochberg(p_values: Sequence[float]) -> list[float]:
    """Benjamini-Hochberg adjusted p-values (q-values), in the order given: the k-th smallest of m
    times m / k, made monotone from the largest down, capped at 1."""
    m = len(p_values)
    order = sorted(range(m), key=lambda i: p_values[i], reverse=True)
    adjusted = [0.0] * m
    running = 1.0
    for position, index in enumerate(order):
        rank = m - position
        running = min(running, p_values[index] * m / rank)
        adjusted[index] = min(1.0, running)
    return adjusted


def equivalent(comparison: Comparison, margin: float, alpha: float = ALPHA) -> bool:
    """TOST at ``alpha``: both one-sided tests reject, i.e. the 1 - 2·alpha CI lies inside ±margin."""
    interval = comparison.interval(1.0 - 2.0 * alpha)
    return interval is not None and -margin < interval[0] and interval[1] < margin


POWER = 0.8


def _shape(n: int, paired: bool) -> tuple[float, float]:
    """(df, sqrt of the effective n): paired n - 1 and sqrt(n); two rows of n each 2n - 2 and sqrt(n/2)."""
    return (n - 1, math.sqrt(n)) if paired else (2 * n - 2, math.sqrt(n / 2.0))


def power(effect: float, sd: float, n: int, alpha: float = ALPHA, paired: bool = True) -> float:
    """Power of the two-sided t-test at ``alpha`` to detect a true difference ``effect`` with
    ``n`` seeds (per row) and standard deviation ``sd`` (noncentral t)."""
    if n < 2 or not sd > 0:
        raise ValueError(f"power() needs n >= 2 and sd > 0, got n={n}, sd={sd}")
    df, root = _shape(n, paired)
    ncp = abs(effect) / sd * root  # symmetric: the power of -effect is the same
    critical = float(student_t.ppf(1.0 - alpha / 2.0, df))
    wrong_tail = float(nct.cdf(-critical, df, ncp))  # far below 1e-9 where scipy returns nan (df 1, ncp > 15)
    return float(nct.sf(critical, df, ncp)) + (wrong_tail if math.isfinite(wrong_tail) else 0.0)


def min_detectable(sd: float, n: int, alpha: float = ALPHA, target: float = POWER, paired: bool = True) -> float:
    """The smallest |effect| the two-sided t-test detects with probability ``target`` at this n.
    Power depends on the effect only through effect / sd, so this is sd times the answer for sd 1,
    solved once per (n, alpha, target, paired): a report asks for it hundreds of times."""
    if n < 2 or not sd > 0:
        raise ValueError(f"min_detectable() needs n >= 2 and sd > 0, got n={n}, sd={sd}")
    return sd * _min_detectable_in_sds(n, alpha, target, paired)


@functools.lru_cache(maxsize=4096)
def _min_detectable_in_sds(n: int, alpha: float, target: float, paired: bool) -> float:
    high = 1.0
    while power(high, 1.0, n, alpha, paired) < target:
        high *= 2.0
    return float(brentq(lambda e: power(e, 1.0, n, alpha, paired) - target, 0.0, high, xtol=1e-12))


def seeds_needed(
    effect: float, sd: float, alpha: float = ALPHA, target: float = POWER, paired: bool = True, limit: int = 100_000
) -> int | None:
    """The smallest n (per row) with power >= ``target`` for ``effect``; None past ``limit``."""
    if effect == 0 or not sd > 0:
        return None
    low, high = 2, 2
    while power(effect, sd, high, alpha, paired) < target:
        if high >= limit:
            return None
        low, high = high, min(high * 2, limit)
    while low < high:  # power grows with n: the first n that reaches the target
        middle = (low + high) // 2
        if power(effect, sd, middle, alpha, paired) >= target:
            high = middle
        else:
            low = middle + 1
    return high


def diff_text(comparison: Comparison, decimals: int) -> str:
    """``-0.040 [-0.081, +0.001]`` (the difference and its 95% CI), or ``-0.040`` when untested."""
    text = f"{comparison.diff:+.{decimals}f}"
    if comparison.ci_low is not None and comparison.ci_high is not None:
        text += f" [{comparison.ci_low:+.{decimals}f}, {comparison.ci_high:+.{decimals}f}]"
    return text


def is_ppl(metric: str) -> bool:
    """A perplexity (``val_ppl``, ``val/<set>/ppl``, ``eval/ppl/<task>``): compared on the log scale."""
    return metric == "val_ppl" or metric.endswith("/ppl")


def log_ratio_text(comparison: Comparison) -> str:
    """A difference of mean log values as a ratio: ``-4.0% [-6.0%, -2.0%]`` (exp(Δ) - 1 and the
    interval's ends transformed alike), or ``-4.0%`` when untested."""
    text = f"{100 * math.expm1(comparison.diff):+.1f}%"
    if comparison.ci_low is not None and comparison.ci_high is not None:
        text += f" [{100 * math.expm1(comparison.ci_low):+.1f}%, {100 * math.expm1(comparison.ci_high):+.1f}%]"
    return text


def delta_text(comparison: Comparison, metric: str, decimals: int) -> str:
    """Δ and its 95% CI as every view prints it: a PPL's log difference as a ratio
    (:func:`log_ratio_text`), any other metric in its units (:func:`diff_text`)."""
    if is_ppl(metric):
        return log_ratio_text(comparison)
    return diff_text(comparison, decimals)


def format_p(p: float | None) -> str:
    """``0.012``, or ``3.1e-05`` below 0.001; empty when there is no test."""
    if p is None:
        return ""
    return f"{p:.3f}" if p >= 0.001 else f"{p:.1e}"


__all__ = [
    "ALPHA",
    "CONFIDENCE",
    "MIN_COMMON",
    "METHOD",
    "METHOD_SHORT",
    "POWER",
    "Comparison",
    "Sample",
    "benjamini_hochberg",
    "compare",
    "equivalent",
    "min_detectable",
    "power",
    "seeds_needed",
    "diff_text",
    "format_p",
    "holm",
]
