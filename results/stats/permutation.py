"""A distribution-free check beside the paired t-test: the sign-flip permutation test on per-seed
paired differences.

Under the null that each difference is as likely positive as negative (its distribution is
symmetric about 0; no normality), every one of the 2^n assignments of signs to the observed
|d_i| is equally likely, so the p-value of the sum (equivalently the mean) is the share of those
assignments whose sum is at least as extreme as the observed one (Fisher 1935; Good 2005,
"Permutation, Parametric and Bootstrap Tests of Hypotheses", ch. 3):

* **exact** for n <= ``EXACT_MAX`` (20): all 2^n sums, built by doubling (2^n floats, 8 MB at
  n = 20), the observed assignment among them, so the smallest two-sided p is 2 / 2^n
  (0.25 at n = 3, 0.031 at n = 6, 0.00049 at n = 12);
* **Monte Carlo** beyond: ``resamples`` random sign vectors from ``numpy.random.default_rng(seed)``
  (``SEED`` unless told), p = (hits + 1) / (resamples + 1), which is a valid p-value
  (Phipson & Smyth 2010) and what ``scipy.stats.permutation_test`` returns when it samples.

Two-sided: P(|S| >= |s|), which for this symmetric null equals 2 min(P(S >= s), P(S <= s))
capped at 1, scipy's definition. Comparisons allow ``RTOL`` of sum |d_i| for the round-off of
summing in another order, so tied assignments count as ties.

:func:`crosscheck` puts the test beside the paired t verdict of :func:`results.stats.compare` at
one alpha and says whether they disagree (a :class:`Crosscheck`; no text).
"""

from __future__ import annotations

import itertools
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from functools import lru_cache

import numpy as np

from results.stats.comparison import ALPHA, MIN_COMMON, Comparison, Sample, compare

EXACT_MAX = 20  # 2^20 sums (8 MB): exact up to here, Monte Carlo beyond
RESAMPLES = 100_000
SEED = 20_261_205
RTOL = 1e-12  # of sum |d|: sums closer than this to the observed one are ties
ALTERNATIVES = ("two-sided", "greater", "less")
_CHUNK = 10_000  # Monte Carlo sign vectors per batch


@dataclass(frozen=True)
class SignFlip:
    """The sign-flip test of one set of paired differences (claimed - other)."""

    n: int
    mean: float
    p_two_sided: float
    p_greater: float  # alternative: the true mean difference is > 0
    p_less: float  # alternative: < 0
    exact: bool
    resamples: int  # 2^n when exact
    seed: int | None  # the Monte Carlo generator's seed; None when exact

    @property
    def p_min(self) -> float:
        """The smallest two-sided p this n (or this many resamples) can give: below it nothing rejects."""
        return min(1.0, 2.0 / self.resamples) if self.exact else 1.0 / (self.resamples + 1)

    def p(self, alternative: str = "two-sided") -> float:
        if alternative not in ALTERNATIVES:
            raise ValueError(f"alternative {alternative!r}: use one of {', '.join(ALTERNATIVES)}")
        return {"two-sided": self.p_two_sided, "greater": self.p_greater, "less": self.p_less}[alternative]


def null_sums(diffs: np.ndarray) -> np.ndarray:
    """The sums of all 2^n sign assignments of the last axis, (..., n) -> (..., 2^n); index 0 is
    the observed assignment (every sign +), summed in the same order as the others."""
    diffs = np.asarray(diffs, dtype=float)
    sums = np.zeros((*diffs.shape[:-1], 1))
    for i in range(diffs.shape[-1]):
        d = diffs[..., i : i + 1]
        sums = np.concatenate((sums + d, sums - d), axis=-1)
    return sums


def _tails(sums: np.ndarray, observed: np.ndarray, tolerance: np.ndarray) -> tuple[np.ndarray, ...]:
    """(hits >= observed, hits <= observed, hits |.| >= |observed|) counted along the last axis."""
    observed, tolerance = observed[..., None], tolerance[..., None]
    greater = (sums >= observed - tolerance).sum(-1)
    less = (sums <= observed + tolerance).sum(-1)
    extreme = (np.abs(sums) >= np.abs(observed) - tolerance).sum(-1)
    return greater, less, extreme


@lru_cache(maxsize=8)
def _half_signs(n: int) -> np.ndarray:
    """The 2^(n-1) sign vectors whose first sign is +, (2^(n-1), n), all + first."""
    rest = np.array(list(itertools.product((1.0, -1.0), repeat=n - 1))).reshape(-1, n - 1)
    return np.concatenate((np.ones((rest.shape[0], 1)), rest), axis=1)


def sign_flip_pvalues(diffs: np.ndarray) -> np.ndarray:
    """Exact two-sided p-values of many sets at once, (paths, n) -> (paths,), for simulations.

    |S| takes the same values under a vector of signs and its negation, so half the assignments
    (first sign +) give the two-sided p: one (paths, n) x (n, 2^(n-1)) product; keep paths x
    2^(n-1) within memory (e.g. 2,000 x 2,048 at n = 12, 33 MB)."""
    diffs = np.asarray(diffs, dtype=float)
    sums = np.abs(diffs @ _half_signs(diffs.shape[-1]).T)
    tolerance = RTOL * np.abs(diffs).sum(-1, keepdims=True)
    return (sums >= sums[:, :1] - tolerance).mean(-1)


def sign_flip_test(
    diffs: Sequence[float], exact_max: int = EXACT_MAX, resamples: int = RESAMPLES, seed: int = SEED
) -> SignFlip:
    """The sign-flip test of ``diffs``: exact for n <= ``exact_max``, else ``resamples`` random sign
    vectors from ``seed``."""
    values = np.asarray(diffs, dtype=float)
    n = values.size
    if n < 1 or values.ndim != 1 or not np.isfinite(values).all():
        raise ValueError(f"sign_flip_test needs one or more finite differences, got {diffs!r}")
    tolerance = np.asarray(RTOL * np.abs(values).sum())
    if n <= exact_max:
        sums = null_sums(values)
        greater, less, extreme = (int(c) for c in _tails(sums, np.asarray(sums[0]), tolerance))
        total, adjust, used_seed = sums.size, 0, None
    else:
        greater = less = extreme = 0
        rng = np.random.default_rng(seed)
        observed = np.asarray(values.sum())
        for start in range(0, resamples, _CHUNK):
            signs = rng.choice((-1.0, 1.0), size=(min(_CHUNK, resamples - start), n))
            counts = _tails(signs @ values, observed, tolerance)
            greater, less, extreme = greater + int(counts[0]), less + int(counts[1]), extreme + int(counts[2])
        total, adjust, used_seed = resamples, 1, seed

    def p(hits: int) -> float:
        return min(1.0, (hits + adjust) / (total + adjust))

    return SignFlip(n, float(values.mean()), p(extreme), p(greater), p(less), n <= exact_max, total, used_seed)


@dataclass(frozen=True)
class Crosscheck:
    """The paired t verdict and the sign-flip test's on the same pairs, at ``alpha`` (two-sided)."""

    alpha: float
    t: Comparison
    permutation: SignFlip

    @property
    def t_rejects(self) -> bool:
        return self.t.p is not None and self.t.p <= self.alpha

    @property
    def permutation_rejects(self) -> bool:
        return self.permutation.p_two_sided <= self.alpha

    @property
    def attainable(self) -> bool:
        """Whether the sign-flip test can reject at ``alpha`` with this many pairs at all (n >= 6 at
        0.05, n >= 8 at 0.0125): where it cannot, a disagreement says only that n is small."""
        return self.permutation.p_min <= self.alpha

    @property
    def disagree(self) -> bool:
        return self.t_rejects != self.permutation_rejects


def paired_differences(a: Sample, b: Sample) -> list[float] | None:
    """The per-seed differences a - b where compare() pairs (both ``{seed: value}``, the same seeds
    or at least ``MIN_COMMON`` common, two or more pairs), in its order (sorted seeds); else None."""
    if not isinstance(a, Mapping) or not isinstance(b, Mapping):
        return None
    common = set(a) & set(b)
    if len(common) < 2 or (set(a) != set(b) and len(common) < MIN_COMMON):
        return None
    return [float(a[seed]) - float(b[seed]) for seed in sorted(common)]


def crosscheck(a: Sample, b: Sample, alpha: float = ALPHA, **test: int) -> Crosscheck | None:
    """a - b by the paired t-test of :func:`results.stats.compare` and by the sign-flip test on the
    same pairs; None when compare() does not pair them (Welch: no pairs to flip). A t-test that
    has no spread to scale by is untested (``t.p`` None) and does not reject. ``test`` goes to
    :func:`sign_flip_test` (``exact_max``, ``resamples``, ``seed``)."""
    diffs = paired_differences(a, b)
    if diffs is None:
        return None
    return Crosscheck(alpha, compare(a, b), sign_flip_test(diffs, **test))


def crosscheck_diffs(diffs: Sequence[float], alpha: float = ALPHA, **test: int) -> Crosscheck:
    """:func:`crosscheck` on per-seed differences already taken (claimed - other)."""
    seeds = [str(i) for i in range(len(diffs))]
    result = crosscheck(dict(zip(seeds, diffs, strict=True)), dict.fromkeys(seeds, 0.0), alpha, **test)
    if result is None:
        raise ValueError(f"crosscheck_diffs needs at least two differences, got {len(diffs)}")
    return result


__all__ = [
    "ALTERNATIVES",
    "EXACT_MAX",
    "RESAMPLES",
    "SEED",
    "Crosscheck",
    "SignFlip",
    "crosscheck",
    "crosscheck_diffs",
    "null_sums",
    "paired_differences",
    "sign_flip_pvalues",
    "sign_flip_test",
]
