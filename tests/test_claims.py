"""results.verdicts.claims: the paper's claims file, the verdicts on synthetic runs built to give each one,
and claims.md."""

from __future__ import annotations

import json
import math

import numpy as np
import pandas as pd
import pytest
from scipy import stats as scipy_stats

from experiments.probing.files import SUMMARY_METRICS
from results.render.claims_md import write_claims
from results.rows.aggregate import Row, aggregate
from results.rows.frame import RUN_COLUMNS, TAG_COLUMNS, add_main_set
from results.stats.comparison import Comparison, compare, format_p, holm, min_detectable, seeds_needed
from results.verdicts.claims import (
    CONTRADICTED,
    EQUIVALENT,
    HOLDS,
    INCONCLUSIVE,
    NOT_TESTED,
    RULED_OUT,
    VERDICTS,
    Claim,
    ClaimComparison,
    best_of_verdict,
    pairwise_verdict,
)
from results.verdicts.decide import decide
from results.verdicts.engine import evaluate
from results.verdicts.schema import ClaimsError, Selector, load_claims

COMMIT = "0123456789abcdef0123"
ACTIVE = "params_active_non_embedding"
# (preset, scheme, layout, B) -> {metric: value per seed 0, 1, 2}. Every PPL row ran seeds 0-2, so
# PPL comparisons are paired.
TINY, MINI = ("tiny", "1+2R2+1"), ("mini", "2+4R2+2")
CELLS = {
    ("tiny", "vanilla", "6", ""): {"ppl": [120.0, 125.0, 130.0]},
    # base below vanilla by 1 on average, within noise: inconclusive, leaning against
    ("tiny", "base", *TINY[1:], ""): {
        "ppl": [119.0, 127.0, 126.0],
        "probe/update/core_balance": [0.30, 0.35, 0.32],
        "probe/cka_rbf/loop_mean": [0.990, 0.985, 0.990],
        "probe/cka_rbf_debiased/loop_mean": [0.60, 0.50, 0.65],
        "probe/erank/h1": [30.0, None, None],  # logged by one seed only: n=1, not tested
        "probe/erank/h2": [28.0, None, None],
    },
    # MeSH: far below base (holds), barely below anchor (inconclusive, leaning the paper's way), far above anchor* (contradicted)
    ("tiny", "mesh", *TINY[1:], "5"): {
        "ppl": [100.0, 101.0, 102.0],
        "probe/update/core_balance": [0.80, 0.85, 0.90],
        "probe/cka_rbf/loop_mean": [0.90, 0.92, 0.91],
        "probe/cka_rbf_debiased/loop_mean": [0.60, 0.80, 0.50],  # above base: disagrees
        "probe/erank/h1": [40.0, 42.0, 41.0],
        "probe/erank/h2": [39.0, 40.0, 42.0],
    },
    ("tiny", "anchor", *TINY[1:], ""): {"ppl": [101.0, 110.0, 95.0]},
    ("tiny", "anchor_emb", *TINY[1:], ""): {"ppl": [90.0, 91.0, 92.5]},
    # mini: MeSH at B = K + 3 = 5 below base and below every other B
    ("mini", "base", *MINI[1:], ""): {"ppl": [150.0, 152.0, 149.0]},
    ("mini", "mesh", *MINI[1:], "3"): {"ppl": [130.0, 131.0, 133.0]},
    ("mini", "mesh", *MINI[1:], "4"): {"ppl": [125.0, 127.0, 126.0]},
    ("mini", "mesh", *MINI[1:], "5"): {"ppl": [110.0, 111.0, 112.5]},
    ("mini", "mesh", *MINI[1:], "6"): {"ppl": [118.0, 119.0, 121.0]},
    # a looped mixture of experts (its runs log their active parameters): MeSH below the looped
    # base, above the non-looped model, as the paper's OLMoE
    ("tiny-moe", "vanilla", "6", ""): {"ppl": [80.0, 81.0, 82.5], ACTIVE: [3e5] * 3},
    ("tiny-moe", "base", *TINY[1:], ""): {"ppl": [95.0, 96.0, 98.0], ACTIVE: [1e5] * 3},
    ("tiny-moe", "mesh", *TINY[1:], "5"): {"ppl": [85.0, 86.0, 87.0], ACTIVE: [1e5] * 3},
}


def runs_frame(cells=CELLS) -> pd.DataFrame:
    """The frame :func:`results.runs.store.collect_runs` returns for these cells: one FINISHED run per
    seed (0, 1, ... as many as a cell's lists hold) with its tags, params and final metrics
    (``val/shakespeare/{loss,ppl}``, ``val_loss``)."""
    records = []
    for (preset, scheme, layout, slots), metrics in cells.items():
        for seed in range(len(next(iter(metrics.values())))):
            tags = dict.fromkeys(TAG_COLUMNS, "")
            tags.update(preset=preset, scheme=scheme, layout=layout, seed=str(seed), buffer_slots=slots)
            tags.update(config_hash=f"{preset}-{scheme}-{slots}-{seed}", git_commit=COMMIT)
            record = {
                "run_id": f"{preset}-{scheme}{slots}-s{seed}",
                "run_name": f"{preset}-{scheme}{slots}-s{seed}",
                "experiment": "claims",
                "status": "FINISHED",
                "start_time": pd.Timestamp("2026-01-01") + pd.Timedelta(minutes=len(records)),
                "end_time": pd.Timestamp("2026-01-01") + pd.Timedelta(minutes=len(records) + 1),
                **tags,
                "read_error": "",
                "params": {"model": preset, "scheme": scheme, "seed": str(seed), "data.corpus": "shakespeare"},
            }
            for metric, values in metrics.items():
                value = values[seed]
                if metric == "ppl":
                    record.update({"val/shakespeare/ppl": value, "val/shakespeare/loss": math.log(value)})
                    record["val_loss"] = math.log(value)
                elif value is not None:
                    record[metric] = value
            records.append(record)
    frame = pd.DataFrame.from_records(records)
    assert set(RUN_COLUMNS) <= set(frame.columns)
    return add_main_set(frame)


@pytest.fixture(scope="module")
def written(tmp_path_factory):
    out = tmp_path_factory.mktemp("claims")
    results = aggregate(runs_frame())
    decided = decide(results)
    path, evaluations = write_claims(decided, results, out, "claims-test", ["claims"]), decided.evaluations
    return path.read_text(), evaluations


def _summary(text: str) -> list[dict[str, str]]:
    """The rows of claims.md's summary table."""
    section = text.split("## Summary\n\n", 1)[1].split("\n\n", 1)[0]
    lines = section.splitlines()
    header = [c.strip() for c in lines[0].strip("|").split("|")]
    return [dict(zip(header, (c.strip() for c in line.strip("|").split("|")), strict=True)) for line in lines[2:]]


def _verdicts(text: str) -> dict[tuple[str, str, str], str]:
    """(claim, block, metric) -> verdict, from the summary table (one evaluation per key here)."""
    found = {}
    for row in _summary(text):
        key = (row["claim"].strip("`"), row["block"].split(",")[0], row["metric"].split(" ")[0].strip("`"))
        assert key not in found, key
        found[key] = row["verdict"]
    return found


def _section(text: str, claim: str) -> str:
    return text.split(f"## `{claim}`\n", 1)[1].split("\n## ", 1)[0]


def test_each_verdict_from_runs_built_for_it(written):
    text, _ = written
    verdicts = _verdicts(text)
    ppl = "val/shakespeare/ppl"
    with_paper, against = f"{INCONCLUSIVE}, leans the paper's way", f"{INCONCLUSIVE}, leans against"
    assert verdicts == {
        ("mesh_below_base", "tiny", ppl): HOLDS,
        ("mesh_below_base", "mini", ppl): HOLDS,
        ("mesh_below_anchor", "tiny", ppl): with_paper,
        ("mesh_below_anchor", "mini", ppl): NOT_TESTED,  # no anchor row in mini
        ("mesh_below_anchor_emb", "tiny", ppl): CONTRADICTED,
        ("mesh_below_anchor_emb", "mini", ppl): NOT_TESTED,
        # anchor* is significantly better than MeSH after Holm's correction over the 3 comparisons
        ("mesh_best_skip_combination", "tiny", ppl): CONTRADICTED,
        # against base only: every comparison holds, but 8 of the 9 schemes the claim names are missing
        ("mesh_best_skip_combination", "mini", ppl): with_paper,
        ("base_worse_than_vanilla", "tiny", ppl): against,
        ("base_worse_than_vanilla", "mini", ppl): NOT_TESTED,  # no vanilla row in mini
        ("mesh_balances_core_updates", "tiny", "probe/update/core_balance"): HOLDS,
        ("mesh_balances_core_updates", "mini", "probe/update/core_balance"): NOT_TESTED,  # not probed
        ("mesh_lowers_loop_cka", "tiny", "probe/cka_rbf/loop_mean"): HOLDS,
        ("mesh_lowers_loop_cka", "tiny", "probe/cka_rbf_debiased/loop_mean"): against,  # also shown
        ("mesh_lowers_loop_cka", "mini", "probe/cka_rbf/loop_mean"): NOT_TESTED,
        ("mesh_flatter_loop_spectra", "tiny", "probe/erank/loop_mean"): NOT_TESTED,  # base: one seed
        ("mesh_flatter_loop_spectra", "mini", "probe/erank/loop_mean"): NOT_TESTED,
        ("buffer_k_plus_3_best", "tiny", ppl): NOT_TESTED,  # one B only
        ("buffer_k_plus_3_best", "mini", ppl): HOLDS,  # B=5 below B=3, 4 and 6, each significantly
        # the mixture-of-experts block: the MoE claim there alone, the others where their rows are
        ("mesh_below_base", "tiny-moe", ppl): HOLDS,
        # MeSH 5.7% above vanilla: significant, but far more than "slightly" (margin 2%)
        ("moe_mesh_short_of_vanilla", "tiny-moe", ppl): f"{CONTRADICTED} (not slight)",
        ("mesh_below_anchor", "tiny-moe", ppl): NOT_TESTED,
        ("mesh_below_anchor_emb", "tiny-moe", ppl): NOT_TESTED,
        ("mesh_best_skip_combination", "tiny-moe", ppl): with_paper,
        ("base_worse_than_vanilla", "tiny-moe", ppl): HOLDS,
        ("mesh_balances_core_updates", "tiny-moe", "probe/update/core_balance"): NOT_TESTED,
        ("mesh_lowers_loop_cka", "tiny-moe", "probe/cka_rbf/loop_mean"): NOT_TESTED,
        ("mesh_flatter_loop_spectra", "tiny-moe", "probe/erank/loop_mean"): NOT_TESTED,
        ("buffer_k_plus_3_best", "tiny-moe", ppl): NOT_TESTED,
    }
    assert "(also shown)" in next(r["metric"] for r in _summary(text) if "debiased" in r["metric"])


def test_the_numbers_behind_a_verdict(written):
    text, evaluations = written
    mesh, base = CELLS[("tiny", "mesh", *TINY[1:], "5")]["ppl"], CELLS[("tiny", "base", *TINY[1:], "")]["ppl"]
    # PPL on the log scale: a paired t-test on per-seed log PPL
    expected = scipy_stats.ttest_rel(np.log(mesh), np.log(base))
    interval = expected.confidence_interval(0.95)
    diff = float(np.mean(np.log(mesh) - np.log(base)))
    line = next(x for x in _section(text, "mesh_below_base").splitlines() if x.startswith("| tiny"))
    assert "101.0 ± 1.0 (n=3)" in line and "124.0 ± 4.4 (n=3)" in line  # means ± sample std, n
    assert (
        f"| 3, 2.0 | {diff:+.4f} [{interval.low:+.4f}, {interval.high:+.4f}] | {math.expm1(diff) * 100:+.1f}% |" in line
    )
    assert f"| {math.expm1(-0.036) * 100:+.1f}% |" in line  # the paper's effect beside it
    # MDE and seeds from the noncentral t on the SD of the per-seed log differences
    sd = float(np.std(np.log(mesh) - np.log(base), ddof=1))
    # at the level the verdict uses: alpha / m over the tested primary family (Bonferroni, Holm's first step)
    level = 0.05 / len([e for e in evaluations if e.family == "primary" and e.p is not None])
    mde, needed = min_detectable(sd, 3, level), seeds_needed(-0.036, sd, level)
    assert f"| ±{math.expm1(mde) * 100:.1f}% | {needed} |" in line
    # raw p, then Holm across the primary family of this report
    primary = [e for e in evaluations if e.family == "primary" and e.p is not None]
    assert (
        f"| {format_p(expected.pvalue)} | {format_p(holm([e.p for e in primary])[0])} (Holm) | paired t (n=3) | holds |"
        in line
    )
    # a row with one seed: the difference, no test, and why
    erank = next(x for x in _section(text, "mesh_flatter_loop_spectra").splitlines() if x.startswith("| tiny"))
    assert "(n=1)" in erank and "not tested (n < 2)" in erank
    # a claim no block can test says which row is missing
    assert "not tested (no anchor row of the same layout in this block)" in _section(text, "mesh_below_anchor")


def test_families_holm_over_primary_and_bh_over_secondary(written):
    _, evaluations = written
    tested = [e for e in evaluations if e.p is not None]
    primary = [e for e in tested if e.family == "primary"]
    secondary = [e for e in tested if e.family == "secondary"]
    assert {e.claim.id for e in primary} == {
        "mesh_below_base",
        "mesh_below_anchor",
        "mesh_below_anchor_emb",
        "base_worse_than_vanilla",
    }
    assert any(e.supplementary for e in secondary)  # `also` metrics are secondary
    assert [e.p_adjusted for e in primary] == pytest.approx(holm([e.p for e in primary]))
    fdr = scipy_stats.false_discovery_control([e.p for e in secondary])
    assert [e.p_adjusted for e in secondary] == pytest.approx(list(fdr))


def test_best_of_lists_every_comparison_with_holm(written):
    text, evaluations = written
    section = _section(text, "mesh_best_skip_combination")
    assert "**contradicted** (significantly better after Holm's correction: `anchor_emb 1+2R2+1`" in section
    tiny = next(e for e in evaluations if e.claim.id == "mesh_best_skip_combination" and e.block.startswith("tiny"))
    assert sorted(x.other.scheme for x in tiny.lines) == ["anchor", "anchor_emb", "base"]
    raw = sorted(x.comparison.p for x in tiny.lines)
    assert sorted(x.p_holm for x in tiny.lines) == pytest.approx(
        [3 * raw[0], max(3 * raw[0], 2 * raw[1]), 1.0 * max(raw[2], 2 * raw[1])]
    )
    # incomplete: base only of the 9 schemes named
    assert "best of the 2 rows present; 1 of 1 comparisons significant" in section
    assert "cannot hold the full claim: no residual, anchor, anchor_emb" in section
    slots = _section(text, "buffer_k_plus_3_best")
    assert "**holds** (3 of 3 comparisons significant in the paper's direction" in slots
    assert all(f"`mesh 2+4R2+2 B{b}`" in slots for b in (3, 4, 6)) and "`mesh 2+4R2+2 B5` 111.2 ± 1.3 (n=3)" in slots


def test_header_names_the_tests_alpha_commit_and_generator(written):
    text, _ = written
    header = text.split("## Summary", 1)[0]
    assert "Generated by `mesh-results`" in header and "experiments `claims`" in header
    assert f"commit `{COMMIT[:12]}`" in header
    assert "α = 0.05" in header and "paired t-test" in header and "Welch's t-test" in header
    assert "intersection-union test" in header and "Holm" in header and "Benjamini-Hochberg" in header
    assert "TOST" in header and "MDE" in header and "log scale" in header
    assert all(f"**{v}**" in header for v in VERDICTS)
    assert "Fewer than 3 seeds" not in header  # every row here ran 3 seeds


def _row(scheme: str) -> Row:
    return Row("tiny", scheme, "1+2R2+1", "", "", ["r"], ["0"], {})


def test_best_of_holm_keeps_a_lone_raw_p_below_alpha_from_contradicting():
    # three comparisons; another row is better with raw p = 0.03 < 0.05, but Holm's 3 x 0.03 is not
    better = Comparison(0.5, 0.1, 0.9, 0.03, "Welch t", 3, 3)
    worse = compare([1.0, 2.0, 3.0], [1.5, 2.2, 4.0])
    lines = [
        ClaimComparison(_row("anchor"), better, CONTRADICTED, 0.09),
        ClaimComparison(_row("base"), worse, INCONCLUSIVE, 0.6),
        ClaimComparison(_row("residual"), worse, INCONCLUSIVE, 0.6),
    ]
    assert best_of_verdict(lines, "lower") == (
        INCONCLUSIVE,
        "leans against",
        "not the best mean of the 4 rows present; 0 of 3 comparisons significant in the paper's direction",
    )
    lines[0] = ClaimComparison(lines[0].other, better, CONTRADICTED, 0.04)
    assert best_of_verdict(lines, "lower")[0] == CONTRADICTED
    # every other row worse, but not every difference significant: inconclusive, leaning the paper's way
    assert best_of_verdict(lines[1:], "lower")[:2] == (INCONCLUSIVE, "leans the paper's way")


def _claim(**fields) -> Claim:
    base = {
        "id": "c",
        "statement": "s",
        "metric": "ppl",
        "expect": "lower",
        "kind": "pairwise",
        "row": Selector(("mesh",)),
        "against": Selector(("base",)),
        "priority": "primary",
    }
    return Claim(**{**base, **fields})


def _log_pairs(a: list[float], b: list[float]) -> Comparison:
    return compare({str(i): math.log(x) for i, x in enumerate(a)}, {str(i): math.log(x) for i, x in enumerate(b)})


def test_tost_equivalent_when_the_90_ci_is_inside_the_margin():
    # MeSH within 0.1% of base, 6 seeds, small spread: the 90% CI sits inside ±1%
    base = [100.0, 102.0, 98.0, 101.0, 99.0, 100.5]
    mesh = [x * (1 + d) for x, d in zip(base, [0.001, -0.001, 0.002, 0.0, -0.002, 0.001], strict=True)]
    comparison = _log_pairs(mesh, base)
    low, high = comparison.interval(0.90)
    claim = _claim(margin=0.01)
    assert -0.01 < low < high < 0.01 and comparison.p > 0.05
    assert pairwise_verdict(comparison, claim) == (EQUIVALENT, "", "TOST at 0.05: the 90% CI inside ±0.01")
    # the same runs with a margin narrower than the CI: inconclusive
    assert pairwise_verdict(comparison, _claim(margin=abs(low) / 2))[0] == INCONCLUSIVE
    # at the family's level (alpha / 4): the 97.5% CI must fit
    wide = comparison.interval(1 - 2 * 0.0125)
    verdict = pairwise_verdict(comparison, _claim(margin=max(abs(wide[0]), abs(wide[1])) * 0.99), level=0.0125)
    assert verdict[0] == INCONCLUSIVE


def test_the_papers_effect_ruled_out_by_the_one_sided_bound():
    """The one-pass MeSH < base case: Δ > 0, not significant, but the paper's -3.6% is excluded."""
    base = [56.2, 59.2, 54.5, 57.7, 58.6, 54.5, 55.5, 56.6, 58.2]
    mesh = [61.3, 61.2, 53.2, 57.0, 59.4, 58.9, 60.8, 55.8, 58.3]
    comparison = _log_pairs(mesh, base)
    level = 0.0125
    bound = comparison.diff - scipy_stats.t.ppf(1 - level, comparison.df) * comparison.se
    assert bound > -0.036 and comparison.ci_low < 0  # not significant, the paper's effect excluded
    verdict = pairwise_verdict(comparison, _claim(paper_effect=-0.036), level=level)
    assert verdict == (RULED_OUT, "", f"one-sided 98.75% bound {bound:+.4f} vs paper -0.036")
    # no paper effect: nothing to rule out; a default ±1% PPL margin is tested for equivalence instead
    assert pairwise_verdict(comparison, _claim(), level=level)[0] == INCONCLUSIVE
    # with the paper's effect as default margin the old "equivalent" is gone: the claim says what it rules out
    assert _claim(paper_effect=-0.036).equivalence_margin is None


def test_inconclusive_when_the_ci_covers_0_and_the_paper_effect():
    comparison = _log_pairs([100.0, 104.0, 97.0], [101.0, 100.0, 102.0])
    assert comparison.ci_low < -0.036 and comparison.ci_high > 0
    verdict = pairwise_verdict(comparison, _claim(paper_effect=-0.036))
    assert verdict[:2] == (INCONCLUSIVE, "leans the paper's way" if comparison.diff < 0 else "leans against")


def test_slightly_short_needs_a_significant_deficit_inside_the_margin():
    claim = _claim(expect="higher", margin=0.02, within_margin=True)
    small = Comparison(0.010, 0.005, 0.015, 0.001, "paired t (n=4)", 4, 4, "", 3.0, 0.002, 0.003)
    assert pairwise_verdict(small, claim)[0] == HOLDS
    large = Comparison(0.050, 0.040, 0.060, 0.001, "paired t (n=4)", 4, 4, "", 3.0, 0.003, 0.006)
    assert pairwise_verdict(large, claim) == (CONTRADICTED, "", "not slight: Δ beyond the ±0.02 margin")
    straddling = Comparison(0.015, 0.005, 0.025, 0.01, "paired t (n=4)", 4, 4, "", 3.0, 0.003, 0.006)
    assert pairwise_verdict(straddling, claim)[0] == INCONCLUSIVE


def test_two_seeds_are_fragile_and_get_a_banner(tmp_path):
    cells = {key: value for key, value in CELLS.items() if key[0] == "tiny"}
    frame = runs_frame(cells)
    frame = frame[frame["seed"] != "2"]
    results = aggregate(frame)
    decided = decide(results)
    path, evaluations = write_claims(decided, results, tmp_path, "two-seeds", ["claims"]), decided.evaluations
    text = path.read_text()
    assert "> **Fewer than 3 seeds**" in text
    base = next(e for e in evaluations if e.claim.id == "mesh_below_base")
    assert base.fragile and base.verdict_text.endswith("(n=2, fragile)")
    assert f"| {base.verdict_text} |" in text


def test_the_packaged_claims_file():
    claims = load_claims()
    assert claims.alpha == 0.05
    primary = [c.id for c in claims.claims if c.priority == "primary"]
    assert primary == ["mesh_below_base", "mesh_below_anchor", "mesh_below_anchor_emb", "base_worse_than_vanilla"]
    assert claims.claims[0].paper_effect == pytest.approx(math.log(11.37 / 11.79), abs=5e-4)
    ids = [c.id for c in claims.claims]
    assert ids == [
        "mesh_below_base",
        "mesh_below_anchor",
        "mesh_below_anchor_emb",
        "mesh_best_skip_combination",
        "base_worse_than_vanilla",
        "moe_mesh_short_of_vanilla",
        "mesh_balances_core_updates",
        "mesh_lowers_loop_cka",
        "mesh_flatter_loop_spectra",
        "buffer_k_plus_3_best",
    ]
    moe = claims.claims[ids.index("moe_mesh_short_of_vanilla")]
    assert moe.row.moe == "only" and moe.expect == "higher"  # dense rows are not its rows
    cka = claims.claims[ids.index("mesh_lowers_loop_cka")]
    assert cka.metric == "probe/cka_rbf/loop_mean" and cka.also == ("probe/cka_rbf_debiased/loop_mean",)


def test_every_probe_metric_a_claim_reads_is_a_summary_the_probes_log_to_mlflow():
    """The probes log only SUMMARY_METRICS to MLflow (the rest is in each run's probes.csv): a claim
    on another probe value would keep its numbers only while mesh-results reads the table."""
    claims = load_claims().claims
    read = {m for c in claims for m in (c.metric, *c.also) if m.startswith("probe/")}
    assert read == {
        "probe/update/core_balance",
        "probe/cka_rbf/loop_mean",
        "probe/cka_rbf_debiased/loop_mean",
        "probe/erank/loop_mean",
    }
    assert read <= set(SUMMARY_METRICS)


GOOD = """
claims:
  - id: one
    statement: MeSH is lower than base.
    priority: primary
    metric: ppl
    expect: lower
    kind: pairwise
    row: {scheme: mesh}
    against: {scheme: base}
"""


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (("expect: lower", "expect: less"), "claim 1 (one): field 'expect' is 'less'; allowed: lower, higher"),
        (("kind: pairwise", "kind: pairs"), "field 'kind' is 'pairs'; allowed: pairwise, best_of"),
        (("{scheme: base}", "{scheme: bse}"), "field 'scheme' is 'bse'; allowed: vanilla, same, use base, mesh"),
        (("{scheme: base}", "{scheme: base, layuot: same}"), "field 'layuot' is 'same'; allowed: one of the fields"),
        (("    metric: ppl\n", ""), "field 'metric' is None; allowed: it is required"),
        (
            ("{scheme: mesh}", "{scheme: mesh, buffer_slots: other}"),
            "field 'buffer_slots' is 'other'; allowed: any, default",
        ),
        (("{scheme: mesh}", "{scheme: mesh, moe: yes}"), "field 'moe' is True; allowed: any, only, never"),
        (("{scheme: base}", "{scheme: base, moe: only}"), "field 'moe' is 'only'; allowed: one of the fields"),
        (("id: one", "id: One"), "field 'id' is 'One'; allowed: a new name of lowercase letters"),
        (("claims:", "alpha: 5.0\nclaims:"), "field 'alpha' is 5.0; allowed: a number between 0 and 1"),
        (("claims:", "claim:"), "field 'claim' is [{'id': 'one', "),
        (("row: {scheme: mesh}", "row: [mesh"), "cannot be read"),
        (("priority: primary", "priority: high"), "field 'priority' is 'high'; allowed: primary, secondary"),
        (("priority: primary", "priority: primary\n    margin: -1"), "field 'margin' is -1; allowed: a number > 0"),
        (("priority: primary", "priority: primary\n    within_margin: 2"), "field 'within_margin' is 2; allowed"),
    ],
)
def test_claims_file_errors_say_where_and_what_is_allowed(tmp_path, change, message):
    path = tmp_path / "claims.yaml"
    path.write_text(GOOD.replace(*change))
    with pytest.raises(ClaimsError, match=None) as error:
        load_claims(path)
    assert str(error.value).startswith(f"{path}:") and message in str(error.value), str(error.value)
    assert "\n" not in str(error.value)


def test_duplicate_ids_are_an_error(tmp_path):
    path = tmp_path / "claims.yaml"
    entry = GOOD.split("claims:\n", 1)[1]
    path.write_text("claims:\n" + entry + entry)
    with pytest.raises(ClaimsError, match=r"claim 2 \(one\): field 'id' is 'one'"):
        load_claims(path)


def test_claims_are_evaluated_for_any_experiment_set():
    # a set with no MeSH and no vanilla row: every claim is listed, none can be tested
    frame = runs_frame({key: value for key, value in CELLS.items() if key[1] == "anchor"})
    evaluations = evaluate(aggregate(frame))
    assert {e.claim.id for e in evaluations} == {c.id for c in load_claims().claims}
    assert {e.verdict for e in evaluations} == {NOT_TESTED}
    assert any(e.reason == "no mesh row with B = K + 3 in these runs" for e in evaluations)


def test_claims_rebuilt_from_runs_csv_match_the_store_frame(tmp_path):
    from results.pipeline import rebuild_claims
    from results.runs.committed import read_runs_csv

    frame = runs_frame()
    results = aggregate(frame)
    csv = tmp_path / "runs.csv"
    results.runs.drop(columns=["params"]).to_csv(csv, index=False)  # what a report commits
    back = read_runs_csv(csv)
    assert set(frame.columns) <= set(back.columns) and len(back) == len(frame)
    assert (
        back["seed"].tolist() == frame["seed"].tolist()
        and back["buffer_slots"].tolist() == frame["buffer_slots"].tolist()
    )
    again = aggregate(back)
    assert [r.label for r in again.rows] == [r.label for r in results.rows]
    for ours, theirs in zip(results.rows, again.rows, strict=True):
        assert ours.stats["val/shakespeare/ppl"] == theirs.stats["val/shakespeare/ppl"]
    path, evaluations, _ = rebuild_claims(csv, tmp_path, name="my_grid", experiments=["claims"])
    direct = evaluate(results)
    assert [(e.claim.id, e.block, e.metric, e.verdict_text) for e in evaluations] == [
        (e.claim.id, e.block, e.metric, e.verdict_text) for e in direct
    ]
    text = path.read_text()
    assert text.startswith("# The paper's claims, tested on these runs: my\\_grid\n")
    assert "Generated by `mesh-results` from experiments `claims` (runs whose last ended " in text
    # the whole report is written again from the folder's data, not patched
    assert (tmp_path / "report.md").read_text().startswith("# Results: my\\_grid\n")
    assert json.loads((tmp_path / "report.json").read_text())["experiments"] == ["claims"]


def test_rows_set_apart_by_param_overrides_are_rebuilt_from_runs_csv(tmp_path):
    """runs.csv keeps each run's overrides label; the params read back from it group the runs into the
    rows the store's params gave (an arm's key unset on the control: "" on both sides)."""
    from results.rows.frame import runs_table
    from results.runs.committed import read_runs_csv

    frame = runs_frame()
    mesh = frame["scheme"] == "mesh"
    frame["params"] = [
        {"optim.lr": "0.001" if i % 2 else "0.002", "max_steps": "12"}
        | ({"model_overrides.mesh_router_z_coef": "0.001"} if m else {"model_overrides": "{}"})
        for i, m in enumerate(mesh)
    ]
    results = aggregate(frame)
    assert results.group_keys == ["model_overrides.mesh_router_z_coef", "optim.lr"]
    runs_table(results.runs).to_csv(tmp_path / "runs.csv", index=False)
    back = aggregate(read_runs_csv(tmp_path / "runs.csv"))
    assert [r.label for r in back.rows] == [r.label for r in results.rows]
    assert back.runs.set_index("run_id")["row"].to_dict() == results.runs.set_index("run_id")["row"].to_dict()
    assert {p["max_steps"] for p in back.runs["params"]} == {"12"}  # kept for "What was run"
