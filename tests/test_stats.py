"""results.stats.comparison: the tests over seeds give scipy's p-values and confidence intervals."""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy import stats as scipy_stats

from results.rows.aggregate import Stat
from results.stats.comparison import compare, holm

RNG = np.random.default_rng(0)


def _seeded(values) -> dict[str, float]:
    return {str(seed): float(v) for seed, v in enumerate(values)}


@pytest.mark.parametrize("n", [2, 3, 5, 8])
def test_paired_test_is_scipys_ttest_rel(n):
    a = RNG.normal(10.0, 1.0, n)
    b = a + RNG.normal(0.5, 0.3, n)  # correlated with a, as two schemes trained on the same seeds
    result = compare(_seeded(a), _seeded(b))
    expected = scipy_stats.ttest_rel(a, b)
    interval = expected.confidence_interval(0.95)
    assert result.test == f"paired t (n={n})" and result.n_a == result.n_b == n
    assert result.diff == pytest.approx(float(np.mean(a - b)))
    assert result.p == pytest.approx(expected.pvalue, rel=1e-9)
    assert (result.ci_low, result.ci_high) == pytest.approx((interval.low, interval.high), rel=1e-9)
    # the same interval by hand: mean difference ± t_{0.975, n-1} x se
    half = scipy_stats.t.ppf(0.975, n - 1) * np.std(a - b, ddof=1) / math.sqrt(n)
    assert result.ci_high - result.diff == pytest.approx(half, rel=1e-9)


@pytest.mark.parametrize(("n_a", "n_b"), [(2, 2), (3, 2), (5, 3), (4, 7)])
def test_welch_test_is_scipys_unequal_variance_ttest(n_a, n_b):
    a = RNG.normal(10.0, 0.5, n_a)
    b = RNG.normal(10.4, 2.0, n_b)
    result = compare(list(a), list(b))
    expected = scipy_stats.ttest_ind(a, b, equal_var=False)
    interval = expected.confidence_interval(0.95)
    assert result.test == "Welch t" and (result.n_a, result.n_b) == (n_a, n_b)
    assert result.diff == pytest.approx(float(np.mean(a) - np.mean(b)))
    assert result.p == pytest.approx(expected.pvalue, rel=1e-9)
    assert (result.ci_low, result.ci_high) == pytest.approx((interval.low, interval.high), rel=1e-9)
    # Welch-Satterthwaite degrees of freedom
    va, vb = np.var(a, ddof=1) / n_a, np.var(b, ddof=1) / n_b
    df = (va + vb) ** 2 / (va**2 / (n_a - 1) + vb**2 / (n_b - 1))
    assert expected.df == pytest.approx(df)
    assert result.ci_high - result.diff == pytest.approx(scipy_stats.t.ppf(0.975, df) * math.sqrt(va + vb))


def test_rows_whose_seeds_differ_are_paired_on_their_common_seeds():
    """A sequential design stops arms at different sizes: 9 seeds against 6 keep the 6 pairs."""
    a = {str(s): 4.0 + 0.05 * s + 0.01 * (s % 3) for s in range(9)}
    b = {str(s): 3.9 + 0.05 * s - 0.02 * (s % 2) for s in range(6)}
    result = compare(a, b)
    common = [str(s) for s in range(6)]
    expected = scipy_stats.ttest_rel([a[s] for s in common], [b[s] for s in common])
    assert result.test == "paired t (n=6 common of 9+6)" and result.paired and result.n_a == result.n_b == 6
    assert result.p == pytest.approx(expected.pvalue, rel=1e-9)
    interval = expected.confidence_interval(0.95)
    assert (result.ci_low, result.ci_high) == pytest.approx((interval.low, interval.high), rel=1e-9)
    assert compare(a, {"0": 3.9, "1": 4.0, "9": 4.1}).test == "Welch t"  # 2 common: Welch


def test_pairing_only_when_the_seeds_match():
    a, b = {"0": 1.0, "1": 2.0, "2": 3.5}, {"0": 0.5, "1": 1.9, "2": 2.0}
    assert compare(a, b).test == "paired t (n=3)"
    assert compare(a, {"0": 0.5, "1": 1.9, "7": 2.0}).test == "Welch t"  # a seed differs: 2 common
    assert compare(a, {"0": 0.5, "1": 1.9}).test == "Welch t"  # a seed is missing: 2 common
    assert compare(list(a.values()), list(b.values())).test == "Welch t"  # no seeds
    # a row whose runs share a seed (no config hash to tell re-runs apart) cannot be paired
    repeated = Stat((1.0, 1.2, 3.0), ("0", "0", "1"))
    assert repeated.sample == (1.0, 1.2, 3.0)
    assert Stat((1.0, 2.0), ("0", "1")).sample == {"0": 1.0, "1": 2.0}
    paired = compare(Stat((1.0, 2.0, 3.5), ("0", "1", "2")).sample, Stat((0.5, 1.9, 2.0), ("0", "1", "2")).sample)
    assert paired.p == pytest.approx(scipy_stats.ttest_rel([1.0, 2.0, 3.5], [0.5, 1.9, 2.0]).pvalue)


def test_fewer_than_two_seeds_gives_no_test():
    for a, b in (({"0": 1.0}, {"0": 2.0}), ([1.0], [2.0, 2.5]), ([1.0, 1.5, 2.0], [2.0])):
        result = compare(a, b)
        assert result.p is None and result.ci_low is None and result.test == "" and not result.tested
        assert result.reason == "n < 2"
        assert result.diff == pytest.approx(
            np.mean(list(a.values() if isinstance(a, dict) else a))
            - np.mean(list(b.values() if isinstance(b, dict) else b))
        )


def test_no_spread_gives_no_test():
    constant = compare({"0": 2.0, "1": 3.0}, {"0": 1.0, "1": 2.0})  # every paired difference is 1
    assert constant.diff == pytest.approx(1.0) and constant.p is None and constant.reason == "no spread"
    assert compare([1.0, 1.0], [1.0, 1.0]).reason == "no spread"
    # differences equal up to float round-off are no spread either (scipy would report p = 0)
    assert compare({"0": 9.02, "1": 9.04}, {"0": 9.10, "1": 9.12}).reason == "no spread"


def test_scaled_keeps_the_test():
    result = compare([0.40, 0.41, 0.43], [0.38, 0.385, 0.39]).scaled(100.0)
    base = compare([0.40, 0.41, 0.43], [0.38, 0.385, 0.39])
    assert result.diff == pytest.approx(100 * base.diff) and result.ci_low == pytest.approx(100 * base.ci_low)
    assert result.p == base.p and result.test == base.test


def test_holm_adjustment():
    # m = 3: the smallest p times 3, the next times 2, the largest times 1, kept monotone, capped at 1
    assert holm([0.01, 0.04, 0.03]) == pytest.approx([0.03, 0.06, 0.06])
    assert holm([0.5, 0.001]) == pytest.approx([0.5, 0.002])
    assert holm([0.6, 0.7]) == pytest.approx([1.0, 1.0])
    assert holm([]) == []


# ---------------------------------------------------------------- power, TOST, BH


def test_benjamini_hochberg_matches_scipy():
    import numpy as np
    from scipy.stats import false_discovery_control

    from results.stats.comparison import benjamini_hochberg

    rng = np.random.default_rng(3)
    for m in (1, 2, 5, 17):
        p = list(rng.uniform(0, 0.2, m))
        assert benjamini_hochberg(p) == pytest.approx(list(false_discovery_control(p)), rel=1e-12)


def test_power_of_the_paired_t_matches_a_simulation():
    import numpy as np
    from scipy.stats import ttest_rel

    from results.stats.comparison import power

    rng = np.random.default_rng(0)
    n, effect, sd, trials = 5, 0.8, 1.0, 4000
    diffs = rng.normal(effect, sd, (trials, n))
    rejected = np.mean(ttest_rel(diffs, np.zeros_like(diffs), axis=1).pvalue < 0.05)
    expected = power(effect, sd, n, paired=True)
    assert abs(rejected - expected) < 4 * math.sqrt(expected * (1 - expected) / trials)


def test_power_of_two_rows_matches_a_simulation():
    import numpy as np
    from scipy.stats import ttest_ind

    from results.stats.comparison import power

    rng = np.random.default_rng(1)
    n, effect, sd, trials = 6, 1.5, 1.0, 4000
    a, b = rng.normal(effect, sd, (trials, n)), rng.normal(0.0, sd, (trials, n))
    rejected = np.mean(ttest_ind(a, b, axis=1).pvalue < 0.05)
    expected = power(effect, sd, n, paired=False)
    assert abs(rejected - expected) < 4 * math.sqrt(expected * (1 - expected) / trials)


def test_sample_size_and_mde_textbook_values():
    from scipy.stats import nct
    from scipy.stats import t as student_t

    from results.stats.comparison import min_detectable, power, seeds_needed

    # paired d = 1 at alpha .05 two-sided, 80% power: n = 10 (power 0.803; n = 9 gives 0.759)
    assert seeds_needed(1.0, 1.0) == 10
    assert power(1.0, 1.0, 9) < 0.8 <= power(1.0, 1.0, 10)
    assert power(1.0, 1.0, 10) == pytest.approx(0.8031, abs=1e-3)
    # two rows, d = 1: 17 per row (textbook two-sample t, 80%, alpha .05)
    assert seeds_needed(1.0, 1.0, paired=False) == 17
    # the MDE is the effect whose nct power is exactly 0.8
    mde = min_detectable(2.0, 3)
    critical = student_t.ppf(0.975, 2)
    ncp = mde / 2.0 * math.sqrt(3)
    assert nct.sf(critical, 2, ncp) + nct.cdf(-critical, 2, ncp) == pytest.approx(0.8, abs=1e-7)
    # solved once in units of sd and scaled: the same power at any sd, and at two rows of n
    for sd, n, paired in ((0.013, 6, True), (7.5, 4, False), (0.5, 12, True)):
        assert power(min_detectable(sd, n, paired=paired), sd, n, paired=paired) == pytest.approx(0.8, abs=1e-9)
    with pytest.raises(ValueError, match="sd > 0"):
        min_detectable(0.0, 3)
    assert seeds_needed(0.0, 1.0) is None


def test_tost_equivalence_is_the_90_ci_inside_the_margin():
    from results.stats.comparison import compare, equivalent

    a = {"0": 1.000, "1": 1.010, "2": 0.990, "3": 1.005}
    b = {"0": 1.001, "1": 1.008, "2": 0.992, "3": 1.004}
    comparison = compare(a, b)
    low, high = comparison.interval(0.90)
    assert equivalent(comparison, max(abs(low), abs(high)) * 1.01)
    assert not equivalent(comparison, max(abs(low), abs(high)) * 0.99)
    assert comparison.interval(0.95) == pytest.approx((comparison.ci_low, comparison.ci_high))
