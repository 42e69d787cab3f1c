"""The sign-flip check beside each paired verdict (results/verdicts/sign_flip.py): its p is scipy's
exact permutation test of the same per-seed differences, adjusted by Holm's / Benjamini-Hochberg's
rule with that p in the t-test's place in the family, and claims.md says where the two part. The
check under the seeds=auto design is tested on the committed schemes grid in
tests/test_sequential_verdicts.py."""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy import stats
from test_claims import _summary, runs_frame

from results.render.claims_md import write_claims
from results.rows.aggregate import aggregate
from results.verdicts.decide import decide

BASE = [100.0, 104.0, 98.0, 101.0, 103.0, 99.0, 102.0, 100.5]
# MeSH below base on every seed, one seed by far more: the t-test's SD is the outlier's, the
# sign-flip test sees 8 of 8 signs alike (p = 2 / 256)
OUTLIER = [-0.010, -0.012, -0.011, -0.009, -0.013, -0.010, -0.011, -0.500]
STEADY = [-0.10, -0.12, -0.09, -0.11, -0.10, -0.13, -0.08, -0.11]  # both tests reject


def _shifted(diffs: list[float]) -> list[float]:
    return [b * math.exp(d) for b, d in zip(BASE, diffs, strict=True)]


CELLS = {
    ("tiny", "base", "1+2R2+1", ""): {"ppl": BASE},
    ("tiny", "mesh", "1+2R2+1", "5"): {"ppl": _shifted(OUTLIER)},
    ("mini", "base", "2+4R2+2", ""): {"ppl": BASE},
    ("mini", "mesh", "2+4R2+2", "5"): {"ppl": _shifted(STEADY)},
}


def _scipy_sign_flip(diffs: list[float]) -> float:
    return stats.permutation_test(
        (np.asarray(diffs),), np.mean, permutation_type="samples", n_resamples=np.inf, vectorized=True
    ).pvalue


@pytest.fixture(scope="module")
def decided(tmp_path_factory):
    results = aggregate(runs_frame(CELLS))
    out = decide(results)
    text = write_claims(out, results, tmp_path_factory.mktemp("sign-flip"), "sign-flip", ["claims"]).read_text()
    return out.evaluations, text


def _primary(evaluations, preset: str):
    (found,) = [e for e in evaluations if e.claim.id == "mesh_below_base" and e.block.startswith(preset)]
    return found


def test_the_sign_flip_p_is_scipys_and_takes_the_t_tests_place_in_holms_family(decided):
    evaluations, _ = decided
    tiny, mini = _primary(evaluations, "tiny"), _primary(evaluations, "mini")
    assert [e for e in evaluations if e.family == "primary" and e.p is not None] == [tiny, mini]  # a family of 2
    for e, diffs in ((tiny, OUTLIER), (mini, STEADY)):
        assert e.sign_flip.p == pytest.approx(_scipy_sign_flip(diffs)) and e.sign_flip.p == pytest.approx(2 / 256)
        assert e.sign_flip.n == 8
    # Holm over two: the smaller p times 2, the larger at least that; each sign-flip p beside the other's t p
    for e, other in ((tiny, mini), (mini, tiny)):
        low, high = sorted((e.sign_flip.p, other.p))
        expected = 2 * low if e.sign_flip.p == low else max(2 * low, high)
        assert e.sign_flip.adjusted == pytest.approx(min(1.0, expected))
    assert mini.p < 1e-5 and tiny.sign_flip.adjusted == pytest.approx(2 / 256)  # second in Holm's order: x 1
    assert mini.sign_flip.adjusted == pytest.approx(2 * 2 / 256)  # first: x 2
    # the outlier: the t-test does not reject (the paired t p from scipy), the sign-flip test does
    t = stats.ttest_rel(np.log(_shifted(OUTLIER)), np.log(BASE))
    assert tiny.p == pytest.approx(t.pvalue) and tiny.p_adjusted > 0.05
    assert not tiny.sign_flip.t_rejects and tiny.sign_flip.rejects and tiny.sign_flip.disagree
    assert mini.sign_flip.t_rejects and mini.sign_flip.rejects and not mini.sign_flip.disagree


def test_the_secondary_family_adjusts_the_sign_flip_p_by_benjamini_hochberg(decided):
    evaluations, _ = decided
    members = [e for e in evaluations if e.family == "secondary" and e.p is not None]
    checked = [e for e in members if e.sign_flip is not None]
    assert checked
    for e in checked:
        values = [e.sign_flip.p if m is e else m.p for m in members]
        expected = stats.false_discovery_control(values, method="bh")[members.index(e)]
        assert e.sign_flip.adjusted == pytest.approx(expected)
        assert e.sign_flip.rejects == (e.sign_flip.adjusted < 0.05)


def test_claims_md_says_where_the_two_part(decided):
    evaluations, text = decided
    parted = [e for e in evaluations if e.sign_flip is not None and e.sign_flip.disagree]
    checked = [e for e in evaluations if e.sign_flip is not None]
    assert f"it disagrees on {len(parted)} of {len(checked)}" in text
    tiny = _primary(evaluations, "tiny")
    line = next(x for x in text.splitlines() if "Sign-flip check disagrees" in x and "tiny" in x and "vs `base" in x)
    assert (
        "the sign-flip test rejects Δ = 0 (sign-flip p = 0.008, adjusted 0.008; needs adjusted (Holm) < 0.05)" in line
    )
    assert f"the t-test does not reject Δ = 0 (adjusted p = {tiny.p_adjusted:.3f})" in line
    assert not any("Sign-flip check disagrees" in x and "mini" in x and "vs `base" in x for x in text.splitlines())
    summary = {(r["claim"], r["block"].split(",")[0]): r for r in _summary(text)}  # the summary's own column
    assert summary[("`mesh_below_base`", "tiny")]["sign-flip check"] == "**disagrees**: rejects"
    assert summary[("`mesh_below_base`", "mini")]["sign-flip check"] == "agrees"


def test_with_three_seeds_a_t_rejection_rests_on_normality_and_the_report_says_so(tmp_path):
    results = aggregate(runs_frame())  # test_claims' cells: 3 seeds a row
    out = decide(results)
    text = write_claims(out, results, tmp_path, "three seeds", ["claims"]).read_text()
    rejected = [e for e in out.evaluations if e.sign_flip is not None and e.sign_flip.t_rejects]
    assert rejected
    for e in rejected:  # 2 / 2^3 is the smallest p, adjusted past 0.05 in a family of 2 or more
        assert not e.sign_flip.can_reject and not e.sign_flip.rejects and e.sign_flip.disagree
        assert e.sign_flip.p >= 0.25
    assert f"({len(rejected)} where the t-test rejects with too few pairs" in text
    assert "the sign-flip test cannot reject with 3 pairs" in text
    assert "| **disagrees**: cannot reject with 3 pairs |" in text
    assert "this rejection rests on normal per-seed differences" in text
