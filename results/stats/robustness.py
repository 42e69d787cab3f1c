"""What the sequential design's error is when per-seed differences are not normal: a simulation.

The bounds of :mod:`results.sequential` are calibrated on normal paired differences (the t
statistic of normal data does not depend on the SD, so one calibration serves every claim). That
is an assumption about the seeds, and a loop that now and then trains a "bad" seed breaks it: a
third of seeds far off the others makes the differences bimodal, and a look whose seeds all
came out "good" has a tiny SD and a large t although the mean difference is 0.

:func:`bimodal_null` draws such differences with mean exactly 0 (a mixture of two normals:
``bad_fraction`` of seeds in a component 1 above the other, each of SD ``within_sd``), and
:func:`design_error` runs the design's decisions on them (``decide_paths``, futility included when
an effect is given): the share of paths that reject, with its binomial standard error, overall
and at each look. :data:`ASSUMPTION` is the sentence a report can state.

:func:`fixed_n_error` puts the plain paired t-test and the sign-flip test of
:mod:`results.stats.permutation` side by side at one n. The sign-flip test needs no normality but does
need *symmetric* differences: a skewed mixture with mean 0 has a median below 0, which it detects,
so it is inflated there too (less than t; at n = 12, alpha 0.0125: t 0.024, sign-flip 0.018).
It is a check against heavy tails and symmetric non-normality, not against skew.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
from scipy.stats import t as student_t

from results.stats.permutation import sign_flip_pvalues
from results.stats.sequential import Design, decide_paths, running_t, spent

ASSUMPTION = (
    "the sequential bounds assume normally distributed per-seed differences; "
    "results.stats.robustness.design_error measures the per-claim error when they are not"
)
PATHS = 200_000
SEED = 49
# A third of seeds "bad", components 1 / 0.169 apart in within-SD units: skewness 0.59, the
# mixture issue 49 measured on MeSH's seeds.
BAD_FRACTION = 1.0 / 3.0
WITHIN_SD = 0.169  # each component's SD, with the components 1 apart

Sampler = Callable[[np.random.Generator, int, int], np.ndarray]  # (rng, paths, n) -> paths x n


def normal_null(rng: np.random.Generator, paths: int, n: int) -> np.ndarray:
    """Standard normal differences, the design's assumption (mean 0)."""
    return rng.standard_normal((paths, n))


def bimodal_null(
    rng: np.random.Generator, paths: int, n: int, bad_fraction: float = BAD_FRACTION, within_sd: float = WITHIN_SD
) -> np.ndarray:
    """Differences from a mixture with mean exactly 0: a seed is "bad" with probability
    ``bad_fraction`` and then centred at 1 - bad_fraction, else at -bad_fraction (components 1
    apart), each with SD ``within_sd``. Scale does not matter to the t statistic."""
    bad = rng.random((paths, n)) < bad_fraction
    centre = np.where(bad, 1.0 - bad_fraction, -bad_fraction)
    return centre + within_sd * rng.standard_normal((paths, n))


def mixture_skewness(bad_fraction: float = BAD_FRACTION, within_sd: float = WITHIN_SD) -> float:
    """The skewness of :func:`bimodal_null`'s mixture: p(1-p)(1-2p) / (p(1-p) + s^2)^1.5."""
    spread = bad_fraction * (1.0 - bad_fraction)
    return spread * (1.0 - 2.0 * bad_fraction) / (spread + within_sd**2) ** 1.5


@dataclass(frozen=True)
class ErrorRate:
    """The share of simulated null paths the design rejected (either sign), and where."""

    rate: float
    se: float  # binomial standard error of rate
    by_look: tuple[float, ...]  # the share first rejected at each look (sums to rate)
    nominal: float  # the design's per-claim alpha (its share)
    nominal_by_look: tuple[float, ...]  # what the spending function allots each look
    paths: int
    seed: int


def _first_look(design: Design, diffs: np.ndarray, outcome: np.ndarray) -> np.ndarray:
    """The look at which each rejected path crossed (-1 where it did not)."""
    statistics = np.abs(running_t(diffs, design.looks)[0])
    crossed = statistics > np.asarray(design.boundaries)
    first = np.argmax(crossed, axis=1)
    return np.where(outcome != 0, first, -1)


def _nominal_by_look(design: Design) -> tuple[float, ...]:
    fractions = [n / design.n_max for n in design.looks]
    spent_at = [spent(f, design.share, design.spending) for f in fractions]
    return tuple(b - a for a, b in zip([0.0, *spent_at[:-1]], spent_at, strict=True))


def design_error(
    design: Design,
    sampler: Sampler = bimodal_null,
    paths: int = PATHS,
    seed: int = SEED,
    effect: float | None = None,
) -> ErrorRate:
    """The per-claim type-I error of ``design`` when its paired differences come from ``sampler``
    (which must have mean 0), on ``paths`` simulated claims from ``seed``. ``effect``: the paper's
    effect for the futility rule (None: no futility stops, the design's bounds alone; futility
    is non-binding and can only lower the rate)."""
    diffs = sampler(np.random.default_rng(seed), paths, design.n_max)
    outcome = decide_paths(design, diffs, effect)
    first = _first_look(design, diffs, outcome)
    rate = float(np.mean(outcome != 0))
    by_look = tuple(float(np.mean(first == k)) for k in range(len(design.looks)))
    se = math.sqrt(rate * (1.0 - rate) / paths)
    return ErrorRate(rate, se, by_look, design.share, _nominal_by_look(design), paths, seed)


@dataclass(frozen=True)
class FixedNError:
    """Rejection rates at one fixed n and alpha (two-sided), on the same simulated paths."""

    t: float
    sign_flip: float
    n: int
    alpha: float
    paths: int
    seed: int


def fixed_n_error(
    sampler: Sampler, n: int, alpha: float, paths: int = 40_000, seed: int = SEED, chunk: int = 2_000
) -> FixedNError:
    """The paired t-test's and the exact sign-flip test's type-I error at ``n`` seeds under
    ``sampler`` (mean 0). Sign-flip p-values take paths x 2^n floats: ``chunk`` paths at a time."""
    diffs = sampler(np.random.default_rng(seed), paths, n)
    statistic = running_t(diffs, [n])[0][:, 0]
    t_p = 2.0 * student_t.sf(np.abs(statistic), n - 1)
    flip_p = np.concatenate([sign_flip_pvalues(diffs[i : i + chunk]) for i in range(0, paths, chunk)])
    return FixedNError(float(np.mean(t_p <= alpha)), float(np.mean(flip_p <= alpha)), n, alpha, paths, seed)


__all__ = [
    "ASSUMPTION",
    "BAD_FRACTION",
    "WITHIN_SD",
    "ErrorRate",
    "FixedNError",
    "Sampler",
    "bimodal_null",
    "design_error",
    "fixed_n_error",
    "mixture_skewness",
    "normal_null",
]
