"""The design that chose the seeds is the analysis that reports them (results/verdicts/sequential.py),
checked on the committed one-pass schemes grid: its runs.csv and its seeds_auto.log."""

from __future__ import annotations

import math
import shutil
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from scipy import stats as scipy_stats

from results.pipeline import rebuild_claims
from results.runs.stages import read_confirmatory, read_design_log
from results.stats.sequential import Design, futile_stop_chance
from results.verdicts.sequential import FUTILITY_STOP, RUNNING, UNDECIDED, paired_diffs

ONE_PASS = Path(__file__).parents[1] / "results/cpu-reproduction/one-pass"
SCHEMES = ONE_PASS / "schemes"


def test_the_design_is_read_from_the_grids_log():
    record = read_design_log(SCHEMES / "seeds_auto.log")
    assert record.auto.stage == 3 and record.auto.max == 12 and record.auto.alpha == 0.05 and record.auto.futility
    assert record.claims == ("mesh_below_base", "mesh_below_anchor", "mesh_below_anchor_emb", "base_worse_than_vanilla")
    assert record.design.looks == [3, 6, 9, 12] and record.design.share == 0.0125
    assert read_design_log(SCHEMES / "no such log") is None


def _log_diffs(a: str, b: str) -> np.ndarray:
    runs = pd.read_csv(SCHEMES / "runs.csv")
    logs = runs[runs["status"] == "FINISHED"].pivot_table(index="seed", columns="scheme", values="val/docs/loss")
    pair = logs[[a, b]].dropna().sort_index()
    return (pair[a] - pair[b]).to_numpy()


@pytest.fixture(scope="module")
def rebuilt(tmp_path_factory):
    root = tmp_path_factory.mktemp("one-pass")
    shutil.copytree(SCHEMES, root / "schemes")
    shutil.copy(ONE_PASS / "confirmatory.yaml", root / "confirmatory.yaml")
    _, evaluations, _ = rebuild_claims(root / "schemes" / "runs.csv", root / "schemes")
    return root / "schemes", {e.claim.id: e for e in evaluations if e.family == "primary"}


def test_the_primary_verdicts_are_the_designs_decisions_with_their_rci(rebuilt):
    folder, primary = rebuilt
    design = Design(claims=4)
    for claim, (a, b), expected, n in (
        ("mesh_below_base", ("mesh", "base"), FUTILITY_STOP, 6),
        ("mesh_below_anchor", ("mesh", "anchor"), FUTILITY_STOP, 6),
        ("base_worse_than_vanilla", ("base", "vanilla"), "holds", 9),
    ):
        diffs = _log_diffs(a, b)[:n]  # in seed order: the seeds the design had at that look
        se = diffs.std(ddof=1) / math.sqrt(n)
        bound = design.boundaries[n // 3 - 1]
        e = primary[claim]
        assert e.verdict == expected and e.sequential.n == n and e.sequential.stage == n // 3
        assert (e.sequential.rci_low, e.sequential.rci_high) == pytest.approx(
            (diffs.mean() - bound * se, diffs.mean() + bound * se)
        )
        assert e.fixed_verdict  # the fixed-n view stays, labelled
    # MeSH < base: the one-sided 98.75% bound (scipy) excludes the paper's -0.036 at n = 6
    diffs = _log_diffs("mesh", "base")[:6]
    lower = diffs.mean() - scipy_stats.t.ppf(1 - 0.0125, 5) * diffs.std(ddof=1) / math.sqrt(6)
    assert lower > -0.036
    text = (folder / "claims.md").read_text()
    assert f"{FUTILITY_STOP} at stage 2 (n=6), RCI [" in text and "fixed-n view, secondary" in text
    assert "paired t (n=6 common of 9+6)" in text  # the anchor arms stopped at 6: their 6 pairs kept
    # the fixed-n bound is the secondary view: not called "ruled out" under the design
    assert "the paper's effect beyond the fixed-n bound (one-sided 98.75% bound -0.0141 vs paper -0.036)" in text
    assert "paper's effect ruled out (one-sided" not in text
    # at the stop the RCI excludes neither; the n = 9 RCI (the runs went on under the earlier rule) excludes -0.036
    base = primary["mesh_below_base"].sequential
    assert base.rci_low < -0.036 and base.rci_high > 0 and "excludes neither the paper's -0.036 nor 0" in base.text
    nine = _log_diffs("mesh", "base")[:9]
    half = design.boundaries[2] * nine.std(ddof=1) / 3.0
    assert base.later[0] == 9 and base.later[1:] == pytest.approx((nine.mean() - half, nine.mean() + half))
    assert base.later[1] > -0.036 and base.text.endswith(
        "excludes the paper's -0.036, not 0: the paper's effect ruled out"
    )
    # how often this design stops so when the paper's effect is true, at the claim's SD at its stop
    six = _log_diffs("mesh", "base")[:6]
    chance = futile_stop_chance(design, -0.036, six.std(ddof=1), -0.036)
    assert base.futile_chance == chance and f"is true: {100 * chance:.1f}% (simulated)" in text
    assert 0.025 < chance < 0.035  # the reviewer's 2.9-3.1% at 98.75%
    # the rule that decided: the driver's log stopped MeSH < base at n = 9, this report re-takes it at 6
    assert "Decisions re-taken under a later rule" in text and "the driver logged *futile* at n = 9" in text
    assert "| `mesh_below_base` (mesh 1+2R2+1 B5) | +1.01: continue | +1.56: futile | +1.83: futile |  |" in text
    report = (folder / "report.md").read_text()
    assert "### The sequential design" in report and "[`stages.json`](stages.json)" in report
    assert "holds at stage 3 (n=9), RCI [" in report and "refreshed" not in report  # written whole, not patched
    assert "this report is the confirmatory test of" in report


def test_other_reports_show_the_confirmatory_claims_as_replications(tmp_path):
    shutil.copytree(ONE_PASS / "k3", tmp_path / "k3")
    shutil.copy(ONE_PASS / "confirmatory.yaml", tmp_path / "confirmatory.yaml")
    assert read_confirmatory(tmp_path / "k3")["report"] == "schemes"
    _, evaluations, _ = rebuild_claims(tmp_path / "k3" / "runs.csv", tmp_path / "k3")
    (base,) = [e for e in evaluations if e.claim.id == "mesh_below_base"]
    assert base.role == "replication" and base.verdict_text.startswith("replication: ")
    assert "Replication, not the confirmatory test" in (tmp_path / "k3" / "claims.md").read_text()


def test_a_report_that_reads_the_confirmatory_runs_again_calls_its_lines_a_second_reading(tmp_path):
    """skip_combos reads the schemes grid's runs with its own: its lines for the headline claims are
    those runs' comparisons again (the same Δ and p as schemes' fixed-n view), not a replication."""
    for name in ("skip_combos", "schemes"):
        shutil.copytree(ONE_PASS / name, tmp_path / name)
    shutil.copy(ONE_PASS / "confirmatory.yaml", tmp_path / "confirmatory.yaml")
    assert read_confirmatory(tmp_path / "skip_combos")["second_readings"] == ["skip_combos"]
    _, evaluations, _ = rebuild_claims(tmp_path / "skip_combos" / "runs.csv", tmp_path / "skip_combos")
    (anchor,) = [e for e in evaluations if e.claim.id == "mesh_below_anchor"]
    assert anchor.role == "second reading" and anchor.verdict_text.startswith("second reading: ")
    text = (tmp_path / "skip_combos" / "claims.md").read_text()
    assert "Second reading, not a replication" in text and "replication: " not in text
    _, confirmatory, _ = rebuild_claims(tmp_path / "schemes" / "runs.csv", tmp_path / "schemes")
    (same,) = [e for e in confirmatory if e.claim.id == "mesh_below_anchor"]
    ours, theirs = anchor.lines[0].comparison, same.lines[0].comparison
    assert (ours.n_a, ours.diff, ours.p) == (theirs.n_a, theirs.diff, theirs.p)  # the same runs, the same line


def test_stage_b_splits_alpha_over_the_four_comparisons_it_reports_together(tmp_path):
    """Stage B ran one grid per arm, each at alpha / 2 per claim; its report decides the four comparisons
    as one family (stages.json: family 4), so a stop taken at alpha / 2 that alpha / 4 does not take is
    undecided, and the split the grids ran with is shown beside it."""
    shutil.copytree(ONE_PASS / "open_choices_confirm", tmp_path / "open_choices_confirm")
    shutil.copy(ONE_PASS / "confirmatory.yaml", tmp_path / "confirmatory.yaml")
    folder = tmp_path / "open_choices_confirm"
    _, evaluations, _ = rebuild_claims(folder / "runs.csv", folder)
    family, as_run = Design(claims=4), Design(claims=2)
    decided = [e for e in evaluations if e.sequential is not None]
    assert len(decided) == 4
    words = {}
    for e in decided:
        arm = "mesh_router_z_coef" if "mesh_router_z_coef" in e.row.label else "mesh_final_read"
        other = e.lines[0].other.label.split()[0]
        diffs = np.array([d for _, d in paired_diffs(e)])  # log PPL, by seed from 100 on
        assert e.sequential.n <= len(diffs) and e.sequential.as_run is not None
        words[(arm, other)] = (e.sequential.word, e.sequential.as_run.word)
        for design, verdict in ((family, e.sequential), (as_run, e.sequential.as_run)):
            decision = "continue"
            for n in design.looks:
                if n > len(diffs):
                    break
                decision = design.decide(diffs[:n], e.claim.paper_effect)
                if decision != "continue":
                    break
            assert verdict.decision == decision
    assert words[("mesh_router_z_coef", "base")] == (RUNNING, FUTILITY_STOP)  # the case
    assert words[("mesh_router_z_coef", "anchor")] == (RUNNING, FUTILITY_STOP)
    assert words[("mesh_final_read", "base")] == (UNDECIDED, UNDECIDED)
    text = (folder / "claims.md").read_text()
    assert "Bonferroni over the 4 primary comparisons this report decides together" in text
    assert "Under the split the grids ran with** (α over 2, 0.025 each" in text


def test_the_sign_flip_check_takes_each_decision_again_at_its_looks_level(rebuilt):
    """At the deciding look the bound c_k on |T| (n - 1 df) is a level 2·P(T > c_k) for one test;
    the sign-flip test of the same first n differences (scipy's exact test) decides at it."""
    folder, primary = rebuilt
    design = Design(claims=4)
    for claim, (a, b), n in (
        ("base_worse_than_vanilla", ("base", "vanilla"), 9),
        ("mesh_below_anchor", ("mesh", "anchor"), 6),
    ):
        diffs = _log_diffs(a, b)[:n]
        check = primary[claim].sign_flip
        level = 2 * scipy_stats.t.sf(design.boundaries[n // 3 - 1], n - 1)
        p = scipy_stats.permutation_test(
            (diffs,), np.mean, permutation_type="samples", n_resamples=np.inf, vectorized=True
        ).pvalue
        assert check.p == pytest.approx(p) and check.adjusted is None and f"p <= {level:.2g}" in check.needs
        assert check.rejects == (p <= level)
    # base > vanilla holds at n = 9 (|t| 6.58): 9 of 9 signs alike, p = 2 / 2^9 = 0.0039, above the
    # look's 0.0037: no sign-flip test on 9 pairs can reject there
    holds = primary["base_worse_than_vanilla"].sign_flip
    assert holds.t_rejects and not holds.rejects and not holds.can_reject and holds.p == pytest.approx(2 / 512)
    futile = primary["mesh_below_anchor"].sign_flip  # stopped futile at n = 6: neither rejects
    assert not futile.t_rejects and not futile.rejects and not futile.disagree
    text = (folder / "claims.md").read_text()
    assert (
        "the design's t bound rejects Δ = 0 (|t| 6.58 vs 4.06); the sign-flip test cannot reject with 9 pairs "
        "(sign-flip p = 0.0039, the smallest its pairs allow; needs p <= 0.0037, the level of stage 3's bound (n=9))"
    ) in text
    checked = sum(e.sign_flip is not None for e in primary.values())
    report = (folder / "report.md").read_text()  # the report's claims section says it too, and where
    assert "each said under its claim in [claims.md](claims.md) as *Sign-flip check disagrees*" in report
    assert checked == 4 and "| **disagrees**: cannot reject with 9 pairs |" in report


def test_docs_seeds_quotes_the_looks_levels_the_check_uses():
    text = " ".join((Path(__file__).parents[1] / "docs/seeds.md").read_text().split())
    design = Design(claims=4)
    six, nine = (2 * scipy_stats.t.sf(design.boundaries[k], n - 1) for k, n in ((1, 6), (2, 9)))
    assert f"{six:.2g} at n = 6 and {nine:.2g} at n = 9 for stage B's share" in text
    assert "0.031 at n = 6 and 0.0039 at n = 9" in text and pytest.approx(0.031, abs=5e-4) == 2 / 2**6
    assert f"with |t| 6.58 against {design.boundaries[2]:.2f}" in text
