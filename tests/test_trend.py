"""The size-and-tokens trend (results/stats/shape.py welch_interval, results/rows/arms.py,
results/verdicts/trend.py, results/commands/trend.py): the Welch interval is scipy's and covers the
truth 95% of the time at the study's sample sizes; the words follow the intervals; an arm is found by
its scheme and model overrides, once per seed or with an error; and on the committed folders the
command computes each gap from runs.csv as a reader would by hand, rebuilds to the same bytes and
answers bad input in one line."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from scipy import stats

from results.commands import trend as trend_cli
from results.rows.arms import ArmSpec, arm_runs, arm_spec
from results.rows.frame import ResultsError
from results.stats.shape import MeanInterval, WelchInterval, welch_interval
from results.verdicts.trend import CLOSES, NO_CHANGE, NO_REFERENCE, NO_RUNS, WIDENS, Gap, Point, Trend, gap

ONE_PASS = Path(__file__).resolve().parents[1] / "results" / "cpu-reproduction" / "one-pass"


@pytest.mark.parametrize(
    ("first", "second"),
    [
        ([0.1, 0.05, 0.12], [0.2, 0.15, 0.18, 0.3, 0.1, 0.22]),
        ([1.0, 2.0], [0.0, 0.5, 0.7]),
        ([-0.3, 0.4, 0.1, 0.0], [0.01, 0.02]),
    ],
)
def test_the_welch_interval_is_scipys(first, second):
    mine = welch_interval(first, second)
    theirs = stats.ttest_ind(first, second, equal_var=False)
    low, high = theirs.confidence_interval(0.95)
    assert (mine.low, mine.high) == pytest.approx((low, high), rel=1e-12)
    assert mine.df == pytest.approx(theirs.df, rel=1e-12)
    assert mine.diff == pytest.approx(np.mean(first) - np.mean(second), rel=1e-12)
    assert math.isnan(welch_interval([0.1], [0.2, 0.3]).low)  # one value: no spread, no interval
    assert welch_interval([0.1], [0.2, 0.3]).text() == "-0.1500 (no interval)"
    assert welch_interval([], [0.2, 0.3]).text() == "-"  # no runs on one side: no difference to show


@pytest.mark.parametrize(("n_point", "n_ref", "sd_point", "sd_ref"), [(3, 9, 0.03, 0.02), (3, 6, 0.02, 0.02)])
def test_where_nothing_changed_the_trend_rule_misses_5_to_7_percent_of_the_time(n_point, n_ref, sd_point, sd_ref):
    # The trend's error under no change, normal seeds, 20,000 draws (binomial SE of a miss rate near
    # 6%: 0.0017): Welch's interval is a little wide of its 95% at 3 seeds against 6-9 (misses
    # 6.9% and 5.1% at these two, with an exact t; 3.8% at 3 against 3), which trend.md's rule says.
    rng = np.random.default_rng(20261207)
    draws = 20_000
    point, ref = rng.normal(0.05, sd_point, (draws, n_point)), rng.normal(0.05, sd_ref, (draws, n_ref))
    missed = sum(not (w.low <= 0.0 <= w.high) for w in map(welch_interval, point, ref))
    assert 0.04 <= missed / draws <= 0.075


def _gap(point: str, low: float, high: float, n: int = 3) -> Gap:
    deltas = tuple(np.linspace(low, high, n))
    return Gap(point, "mesh", "anchor", "f", tuple(range(n)), deltas, MeanInterval(n, (low + high) / 2, 0.1, low, high))


def _trend(low: float, high: float) -> Trend:
    return Trend(_gap("p", 0, 0.1), _gap("ref", 0, 0.1, 6), WelchInterval(3, 6, (low + high) / 2, 0.1, 5.0, low, high))


def test_the_declared_words_follow_the_intervals():
    assert _gap("p", -0.2, -0.01).word == "MeSH lower"
    assert _gap("p", 0.01, 0.2).word == "MeSH higher"
    assert _gap("p", -0.01, 0.2).word == "inconclusive"
    assert _trend(-0.1, -0.001).word == CLOSES
    assert _trend(0.001, 0.1).word == WIDENS
    assert _trend(-0.1, 0.1).word == NO_CHANGE
    empty = Gap("p", "mesh", "anchor", "", (), (), MeanInterval(0, math.nan, math.nan, math.nan, math.nan))
    assert Trend(empty, _gap("ref", 0, 0.1), welch_interval([], [0.0, 0.1])).word == NO_RUNS
    assert Trend(_gap("p", 0, 0.1), empty, welch_interval([0.0, 0.1], [])).word == NO_REFERENCE


def test_a_table_cell_gives_the_gap_and_its_n_once():
    from results.render.trend import _cell
    from results.verdicts.trend import TrendStudy

    one = Gap("one", "mesh", "anchor", "f", (300,), (-0.02,), MeanInterval(1, -0.02, math.nan, math.nan, math.nan))
    none = Gap("none", "mesh", "anchor", "", (), (), MeanInterval(0, math.nan, math.nan, math.nan, math.nan))
    gaps = {(g.point, "mesh", "anchor"): g for g in (_gap("three", -0.2, 0.1), one, none)}
    at = TrendStudy(Point("three", ()), (), (), gaps, ())
    assert _cell(at, "three", "mesh", "anchor") == "-0.0500 [-0.2000, +0.1000] (n = 3)"
    assert _cell(at, "one", "mesh", "anchor") == "-0.0200 (n = 1)"
    assert _cell(at, "none", "mesh", "anchor") == "no runs"


def test_an_arm_is_its_scheme_and_model_overrides_as_hydra_composes_them():
    assert arm_spec("mesh_residual_read") == ArmSpec(
        "mesh_residual_read", "mesh", frozenset({"model_overrides.mesh_final_read=residual"})
    )
    assert arm_spec("anchor_emb") == ArmSpec("anchor_emb", "anchor_emb", frozenset())
    with pytest.raises(ResultsError, match="arm 'no_such_arm'"):
        arm_spec("no_such_arm")


def test_an_arms_runs_are_its_own_once_each_and_two_runs_of_a_seed_are_an_error():
    frame = pd.DataFrame(
        {
            "run_id": ["a", "a", "b", "c", "d", "e"],
            "status": ["FINISHED"] * 5 + ["FAILED"],
            "scheme": ["mesh", "mesh", "mesh", "base", "mesh", "mesh"],
            "seed": [0, 0, 0, 0, 1, 2],
            "val_loss": [4.0, 4.0, 3.9, 4.1, 4.2, 4.3],
            "overrides": [
                "optim.lr_by_scheme.mesh=0.004",
                "optim.lr_by_scheme.mesh=0.008",
                "model_overrides.mesh_final_read=residual",
                "",
                "",
                "",
            ],
            "row": ["m1", "m2", "r", "b", "m", "m"],
        }
    )
    mesh, residual = ArmSpec("mesh", "mesh", frozenset()), arm_spec("mesh_residual_read")
    assert list(arm_runs(frame, mesh)["run_id"]) == ["a", "d"]  # listed under two rows: once; failed: out
    assert list(arm_runs(frame, residual)["run_id"]) == ["b"]
    twice = frame.assign(run_id=["a", "z", "b", "c", "d", "e"])  # two runs of seed 0
    with pytest.raises(ResultsError, match="arm mesh has 2 runs of seed 0 .*rows m1; m2"):
        gap(Point("p", (("folder", twice),)), mesh, ArmSpec("base", "base", frozenset()))


def _by_hand(runs: pd.DataFrame, first_row: str, second_row: str) -> list[float]:
    a = runs[runs["row"] == first_row].set_index("seed")["val/docs/ppl"]
    b = runs[runs["row"] == second_row].set_index("seed")["val/docs/ppl"]
    return [math.log(a[s]) - math.log(b[s]) for s in sorted(set(a.index) & set(b.index))]


def test_the_command_on_the_committed_folders_computes_what_a_reader_would_and_rebuilds_alike(tmp_path, capsys):
    # The reference (the schemes grid, MeSH's residual read from stage B) against the depth study's
    # fixed-K runs: the reference's own configuration on seeds 200-202, where nothing changed.
    root = ONE_PASS.parents[2]
    ref = "results/cpu-reproduction/one-pass/schemes,results/cpu-reproduction/one-pass/open_choices_confirm@optim.lr_by_scheme.mesh=0.004"
    point = "results/cpu-reproduction/one-pass/depth@loops.distribution=fixed"
    out = tmp_path / "trend"
    args = [str(out), "--base", str(root), "--reference", f"tiny, 5.1M tokens={ref}", "--point", f"replicate={point}"]
    assert trend_cli.main(args) == 0
    table = pd.read_csv(out / "trend.csv", keep_default_na=False)
    schemes = pd.read_csv(ONE_PASS / "schemes" / "runs.csv")
    depth = pd.read_csv(ONE_PASS / "depth" / "runs.csv")
    fixed = "loops.distribution=fixed loops.max=None loops.mean=None"
    expected = {
        ("mesh", "anchor", True): _by_hand(schemes, "mesh 1+2R2+1 B5", "anchor 1+2R2+1"),
        ("mesh", "base", True): _by_hand(schemes, "mesh 1+2R2+1 B5", "base 1+2R2+1"),
        ("mesh", "anchor", False): _by_hand(depth, f"mesh 1+2R2+1 B5 {fixed}", f"anchor 1+2R2+1 {fixed}"),
        ("mesh", "base", False): _by_hand(depth, f"mesh 1+2R2+1 B5 {fixed}", f"base 1+2R2+1 {fixed}"),
    }
    for (first, second, is_ref), deltas in expected.items():
        line = table[(table["first"] == first) & (table["second"] == second) & (table["reference"] == is_ref)].iloc[0]
        got = [float(d) for d in line["deltas"].split()]
        assert got == pytest.approx(deltas, abs=2e-6)  # val loss against log of the logged PPL
        low, high = stats.ttest_1samp(deltas, 0.0).confidence_interval(0.95)
        assert (float(line["gap_low"]), float(line["gap_high"])) == pytest.approx((low, high), abs=1e-5)
    replicate = table[~table["reference"] & (table["first"] == "mesh")]
    assert set(replicate["trend"]) == {NO_CHANGE}  # the reference's own config on other seeds
    residual = table[table["first"] == "mesh_residual_read"].set_index("second")["reference_folder"]
    assert residual["anchor"].iloc[0] == residual["base"].iloc[0] == ref.split(",")[1]  # the one folder with it
    assert residual["anchor_emb"].iloc[0] == ""  # no folder has both: no reference, no word
    capsys.readouterr()
    assert trend_cli.main([str(out), "--base", str(root), "--check"]) == 0
    assert "as committed" in capsys.readouterr().out
    (out / "trend.md").write_text((out / "trend.md").read_text().replace("no change", "no chnage", 1))
    assert trend_cli.main([str(out), "--base", str(root), "--check"]) == 1


@pytest.mark.parametrize(
    ("args", "says"),
    [
        (["--reference", "tiny", "--point", "a=b"], "--reference 'tiny': give NAME=FOLDER"),
        (["--reference", "r=nowhere", "--point", "a=nowhere"], "nowhere/runs.csv cannot be read"),
        (["--reference", "r=x", "--point", "a=x", "--compare", "mesh"], "--compare 'mesh': give FIRST:SECOND"),
        (["--point", "a=b"], "give --reference and at least one --point"),
        ([], "no trend.json to rebuild from"),
    ],
)
def test_bad_input_is_one_line_naming_the_argument(tmp_path, capsys, args, says):
    assert trend_cli.main([str(tmp_path / "out"), "--base", str(tmp_path), *args]) == 2
    err = capsys.readouterr().err.strip()
    assert says in err and len(err.splitlines()) == 1
