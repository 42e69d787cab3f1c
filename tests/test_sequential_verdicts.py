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
from results.stats.sequential import Design
from results.verdicts.sequential import FUTILITY_STOP

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
    assert "stopped for futility at stage 2 (n=6), RCI [" in text and "fixed-n view, secondary" in text
    assert "paired t (n=6 common of 9+6)" in text  # the anchor arms stopped at 6: their 6 pairs kept
    assert "paper's effect ruled out (one-sided 98.75% bound -0.0141 vs paper -0.036)" in text
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
