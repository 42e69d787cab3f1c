"""The sign-flip permutation test (results/permutation.py): equal to scipy's exact and sampled
permutation tests, exact on constructed inputs, at its nominal level under the null by simulation,
and its crosscheck against the paired t verdict."""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy import stats

from results.stats.comparison import compare
from results.stats.permutation import (
    Crosscheck,
    crosscheck,
    crosscheck_diffs,
    null_sums,
    sign_flip_pvalues,
    sign_flip_test,
)

ALTERNATIVES = {"two-sided": "p_two_sided", "greater": "p_greater", "less": "p_less"}


def _scipy_exact(diffs: np.ndarray, alternative: str) -> float:
    return stats.permutation_test(
        (diffs,), np.mean, permutation_type="samples", n_resamples=np.inf, alternative=alternative, vectorized=True
    ).pvalue


@pytest.mark.parametrize("n", [2, 3, 6, 9, 12])
def test_exact_p_values_equal_scipy_permutation_test(n: int) -> None:
    rng = np.random.default_rng(n)
    for shift in (0.0, 0.4, -0.9):
        diffs = rng.normal(shift, 1.0, n)
        result = sign_flip_test(diffs)
        assert result.exact and result.resamples == 2**n and result.seed is None
        for alternative, field in ALTERNATIVES.items():
            assert getattr(result, field) == pytest.approx(_scipy_exact(diffs, alternative), abs=1e-12)


def test_paired_samples_equal_scipy_on_the_two_rows() -> None:
    """scipy's paired form (swap a and b within a seed) is the same null as flipping a - b."""
    rng = np.random.default_rng(7)
    a, b = rng.normal(2.3, 0.05, 8), rng.normal(2.28, 0.05, 8)
    expected = stats.permutation_test(
        (a, b),
        lambda x, y, axis: np.mean(x - y, axis=axis),
        permutation_type="samples",
        n_resamples=np.inf,
        vectorized=True,
    ).pvalue
    assert sign_flip_test(a - b).p_two_sided == pytest.approx(expected, abs=1e-12)


def test_ties_count_as_ties_as_in_scipy() -> None:
    """Equal magnitudes make many assignments tie with the observed sum; summed in another order
    they differ by round-off, which must not break the ties (0.1 + 0.2 != 0.3 in floats)."""
    diffs = np.array([0.1, 0.2, 0.3, -0.3, 0.1, 0.2, 0.3])
    for alternative, field in ALTERNATIVES.items():
        assert getattr(sign_flip_test(diffs), field) == pytest.approx(_scipy_exact(diffs, alternative), abs=1e-12)


def test_hand_computed_case() -> None:
    """d = (1, 2, 3): the 8 sums are ±1±2±3 = 6, 4, 2, 0, 0, -2, -4, -6; observed 6."""
    assert sorted(null_sums(np.array([1.0, 2.0, 3.0]))) == [-6, -4, -2, 0, 0, 2, 4, 6]
    result = sign_flip_test([1.0, 2.0, 3.0])
    assert (result.p_greater, result.p_less, result.p_two_sided) == (1 / 8, 1.0, 2 / 8)
    assert result.p_min == 0.25 and result.mean == 2.0
    mixed = sign_flip_test([1.0, -2.0, 3.0])  # observed 2: sums >= 2 are 6, 4, 2; |sums| >= 2: 6 of 8
    assert (mixed.p_greater, mixed.p_less, mixed.p_two_sided) == (3 / 8, 6 / 8, 6 / 8)


def test_one_difference_cannot_reject() -> None:
    result = sign_flip_test([0.4])
    assert (result.p_greater, result.p_less, result.p_two_sided, result.p_min) == (0.5, 1.0, 1.0, 1.0)


def test_all_zero_differences_give_p_one() -> None:
    result = sign_flip_test([0.0, 0.0, 0.0, 0.0])
    assert result.p_two_sided == result.p_greater == result.p_less == 1.0


def test_monte_carlo_beyond_exact_max_is_seeded_and_close_to_exact() -> None:
    """Past ``exact_max`` the p-value is sampled, (hits + 1) / (resamples + 1), reproducibly from the
    stated seed; at n = 16 it is within 4 binomial SEs of the exact one and of scipy's sampled one."""
    diffs = np.random.default_rng(3).normal(0.5, 1.0, 16)
    exact = sign_flip_test(diffs)
    sampled = sign_flip_test(diffs, exact_max=10, resamples=50_000, seed=11)
    assert not sampled.exact and sampled.resamples == 50_000 and sampled.seed == 11
    assert sampled == sign_flip_test(diffs, exact_max=10, resamples=50_000, seed=11)
    assert sampled.p_min == pytest.approx(1 / 50_001)
    for field in ALTERNATIVES.values():
        p = getattr(exact, field)
        se = math.sqrt(max(p * (1 - p), 1e-6) / 50_000)
        assert abs(getattr(sampled, field) - p) < 4 * se
    scipy_sampled = stats.permutation_test(
        (diffs,), np.mean, permutation_type="samples", n_resamples=50_000, vectorized=True, random_state=5
    ).pvalue
    assert abs(sampled.p_two_sided - scipy_sampled) < 6 * math.sqrt(exact.p_two_sided / 50_000)


def test_exact_at_twenty_seeds_is_fast_enough() -> None:
    result = sign_flip_test(np.random.default_rng(0).normal(0.0, 1.0, 20))
    assert result.exact and result.resamples == 2**20


def test_rejects_bad_input() -> None:
    for bad in ([], [1.0, math.nan], [[1.0, 2.0]]):
        with pytest.raises(ValueError):
            sign_flip_test(bad)
    with pytest.raises(ValueError):
        sign_flip_test([1.0, 2.0]).p("both")


def test_vectorised_p_values_equal_one_at_a_time() -> None:
    diffs = np.random.default_rng(5).normal(0.2, 1.0, (40, 7))
    np.testing.assert_allclose(sign_flip_pvalues(diffs), [sign_flip_test(d).p_two_sided for d in diffs])


# Under the null of symmetric differences the 2^n assignments are equally likely, so the rank of
# |S| among them is uniform over 2^(n-1) pairs (±S) and P(p <= alpha) = floor(alpha 2^(n-1)) / 2^(n-1):
# at n = 10, alpha = 0.05 that is 25/512 = 0.04883 whatever the symmetric distribution, normal or not.
NULL_PATHS, NULL_N, NULL_ALPHA = 40_000, 10, 0.05
EXACT_LEVEL = math.floor(NULL_ALPHA * 2 ** (NULL_N - 1)) / 2 ** (NULL_N - 1)


def _symmetric_bimodal(rng: np.random.Generator, shape: tuple[int, int]) -> np.ndarray:
    """Half the seeds at +1, half at -1, SD 0.1 each: symmetric, far from normal."""
    return rng.choice((-1.0, 1.0), size=shape) + 0.1 * rng.standard_normal(shape)


@pytest.mark.parametrize("draw", ["normal", "symmetric_bimodal", "cauchy"])
def test_type_one_error_is_its_nominal_level_under_symmetric_nulls(draw: str) -> None:
    """The simulated rejection rate is the exact level within 4 binomial SEs (SE 0.0011 at 40k
    paths), for normal, two-mode and Cauchy differences alike: no normality needed."""
    rng = np.random.default_rng(2026)
    shape = (NULL_PATHS, NULL_N)
    diffs = {
        "normal": lambda: rng.standard_normal(shape),
        "symmetric_bimodal": lambda: _symmetric_bimodal(rng, shape),
        "cauchy": lambda: rng.standard_cauchy(shape),
    }[draw]()
    rejected = np.concatenate([sign_flip_pvalues(chunk) <= NULL_ALPHA for chunk in np.split(diffs, 8)])
    se = math.sqrt(EXACT_LEVEL * (1 - EXACT_LEVEL) / NULL_PATHS)
    assert abs(rejected.mean() - EXACT_LEVEL) < 4 * se


def test_crosscheck_reports_agreement_and_disagreement() -> None:
    # t rejects at n = 6 (p 0.027), the sign-flip test cannot go below 2/64 = 0.031 with one negative seed
    disagree = crosscheck_diffs([0.1, 0.2, -0.05, 0.3, 0.15, 0.2], alpha=0.05)
    assert isinstance(disagree, Crosscheck)
    assert disagree.t_rejects and not disagree.permutation_rejects and disagree.disagree
    assert disagree.permutation.p_two_sided == pytest.approx(4 / 64)  # sums >= 0.85: all +, and -0.05 -> +0.05
    assert disagree.attainable
    agree = crosscheck_diffs([0.1, 0.2, 0.05, 0.3, 0.15, 0.2, 0.12, 0.18], alpha=0.05)
    assert agree.t_rejects and agree.permutation_rejects and not agree.disagree
    # at n = 3 the smallest two-sided p is 0.25: the sign-flip test cannot reject at 0.05 at all
    small = crosscheck_diffs([0.10, 0.11, 0.12], alpha=0.05)
    assert small.disagree and not small.attainable


def test_crosscheck_uses_compare_pairs_and_its_t_verdict() -> None:
    a = {"0": 2.31, "1": 2.35, "2": 2.29, "3": 2.40, "4": 2.33}
    b = {"0": 2.30, "1": 2.30, "2": 2.31, "3": 2.36, "9": 2.2}  # 4 common seeds
    result = crosscheck(a, b, alpha=0.05)
    assert result is not None and result.t == compare(a, b)
    assert result.permutation.n == 4
    assert result.permutation.mean == pytest.approx(np.mean([0.01, 0.05, -0.02, 0.04]))
    assert crosscheck([2.3, 2.4], [2.2, 2.1]) is None  # Welch: nothing paired
    assert crosscheck({"0": 1.0, "1": 2.0}, {"0": 1.0, "5": 2.0}) is None  # 1 common seed


def test_crosscheck_without_spread_is_untested_by_t_but_not_by_permutation() -> None:
    result = crosscheck_diffs([0.1] * 8, alpha=0.05)
    assert result.t.p is None and not result.t_rejects
    assert result.permutation.p_two_sided == pytest.approx(2 / 256) and result.disagree
