"""The depth study's report (results/stats/shape.py, results/verdicts/depth.py, results/rows/depth.py,
results/render/depth.py): the intervals equal scipy's, the declared words follow the intervals, exit
curves are read where they are measured and nowhere else, and on a real tiny depth grid the report
says what its runs' CSVs say, built from the store and rebuilt from its folder to the same bytes."""

from __future__ import annotations

import io
import math

import numpy as np
import pandas as pd
import pytest
from scipy import stats

from results.rows.aggregate import Row
from results.rows.depth import DepthArm
from results.stats.shape import MeanInterval, t_interval, value_at
from results.verdicts.depth import decide_depth, difference, shape


@pytest.mark.parametrize("values", [[0.1, -0.02, 0.05], [1.0, 2.0], [-0.3, -0.1, -0.25, -0.2, 0.05]])
def test_the_interval_of_a_mean_of_paired_differences_is_scipys(values):
    mine = t_interval(values)
    theirs = stats.ttest_1samp(values, 0.0).confidence_interval(0.95)
    assert (mine.low, mine.high) == pytest.approx((theirs.low, theirs.high), rel=1e-12)
    assert mine.mean == pytest.approx(np.mean(values)) and mine.sd == pytest.approx(np.std(values, ddof=1))
    assert t_interval([0.2]).n == 1 and math.isnan(t_interval([0.2]).low)
    assert t_interval([math.nan, 0.1, 0.3]).n == 2  # a seed without the value is left out


def test_a_declared_words_follow_the_interval():
    def interval(low, high):
        return MeanInterval(3, (low + high) / 2, 0.1, low, high)

    assert shape(interval(-0.05, -0.001)) == "improves"
    assert shape(interval(0.002, 0.3)) == "worsens"
    assert shape(interval(-0.009, 0.0095)) == "flat"
    assert shape(interval(-0.02, 0.005)) == "inconclusive"
    assert shape(MeanInterval(1, 0.5, math.nan, math.nan, math.nan)) == "inconclusive"
    assert [difference(interval(*e)) for e in [(-0.2, -0.1), (0.1, 0.2), (-0.005, 0.005), (-0.1, 0.1)]] == [
        "lower", "higher", "equal", "inconclusive",
    ]  # fmt: skip


def test_an_exit_curve_is_read_between_adjacent_thresholds_and_nowhere_else():
    loops_used = [8.0, 8.0, 5.0, 2.0, 1.0]  # eps rising: fewer steps per token
    ppl = [200.0, 200.0, 100.0, 60.0, 70.0]
    assert value_at(loops_used, ppl, 6.0) == pytest.approx(100 + (200 - 100) * (6 - 5) / (8 - 5))
    assert value_at(loops_used, ppl, 2.0) == 60.0 and value_at(loops_used, ppl, 1.5) == pytest.approx(65.0)
    assert math.isnan(value_at(loops_used, ppl, 0.5)) and math.isnan(value_at([8.0, 7.5], [1.0, 2.0], 2.0))
    # in threshold order, as declared: where loops used is not monotone, the first bracketing pair
    assert value_at([8.0, 5.0, 6.0, 2.0], [10.0, 40.0, 20.0, 50.0], 5.5) == pytest.approx(10 + 30 * 2.5 / 3)


def _arm(loss: dict[int, list[float]], training="fixed", rule=None, scheme="base") -> DepthArm:
    seeds = ["0", "1", "2"]
    row = Row("tiny", scheme, "1+2R2+1", "", "", [f"r{s}" for s in seeds], seeds, {})
    frame = pd.DataFrame(loss, index=seeds)
    return DepthArm(row, training, rule, 2, seeds, frame, pd.DataFrame(), {})


def test_the_declared_rule_on_constructed_arms():
    at2 = [4.0, 4.1, 4.2]
    worsens = _arm({2: at2, 4: [4.3, 4.45, 4.52], 8: [5.0, 5.1, 5.3]})
    flat = _arm({2: at2, 4: [4.001, 4.099, 4.2005], 8: [4.05, 4.05, 4.25]}, training="uniform")
    findings = decide_depth([worsens, flat])
    assert [s.verdict for s in findings.shapes] == [{4: "worsens", 8: "worsens"}, {4: "flat", 8: "inconclusive"}]
    d4 = [0.3, 0.35, 0.32]
    expected = stats.ttest_1samp(d4, 0).confidence_interval(0.95)
    assert (findings.shapes[0].d[4].low, findings.shapes[0].d[4].high) == pytest.approx(tuple(expected))
    (pair,) = findings.sampled_vs_fixed  # sampled minus fixed, seed by seed
    diffs = [0.001 - 0.3, -0.001 - 0.35, 0.0005 - 0.32]
    assert pair.interval.mean == pytest.approx(np.mean(diffs)) and pair.word == "lower"


@pytest.fixture(scope="module")
def depth_grid(tmp_path_factory, grid_cell_overrides):
    """The depth sweep on a tiny budget: base and MeSH at fixed K = 2, MeSH at uniform K in 1..3 under the
    cycle rule (the study's ninth arm), 2 seeds,
    each cell evaluated as it ends (the sweep file's depth_eval: loops 1..8, exits with room for 8)."""
    from sweeps.sweep import run_sweep

    runs = tmp_path_factory.mktemp("depth_grid")
    cells = grid_cell_overrides("data=shakespeare", "probes.enabled=false")
    grid = ["seed=200,201", "launcher=local", f"runs_dir={runs}"]
    assert run_sweep("depth", [*cells, *grid, "scheme=base,mesh", "loops=fixed"], out=io.StringIO()) == 0
    # the ninth arm's kind: MeSH trained at sampled K under the cycle rule
    assert run_sweep("depth", [*cells, *grid, "arm=mesh_cycle", "scheme=mesh", "loops=uniform"], out=io.StringIO()) == 0
    return runs


def _runs_csv(runs, name):
    """Every run's own evaluation CSV by (scheme, training, seed): what the report must agree with."""
    frames = {}
    for path in runs.glob(f"depth/*/eval/depth-step6/{name}"):
        run_dir = path.parents[2]
        training = "uniform" if "distribution: uniform" in (run_dir / "config.yaml").read_text() else "fixed"
        parts = run_dir.name.split("-")  # tiny-1+2R2+1-<scheme>[-B<slots>]-s<seed>-<hash>
        scheme, seed = parts[2], parts[-2]
        frames[(scheme, training, seed)] = pd.read_csv(path)
    return frames


def test_the_depth_report_says_what_the_runs_csvs_say_and_rebuilds_to_the_same_bytes(depth_grid, tmp_path):
    from results.pipeline import build_report, rebuild_report
    from results.render.depth import SECTION

    out = tmp_path / "report"
    uri = f"sqlite:///{depth_grid / 'mlflow.db'}"
    build_report("depth", ["depth"], uri, out)
    text = (out / "report.md").read_text()
    assert SECTION in text and "figures/depth_curves.png" in text and "figures/exit_curves.png" in text
    table = pd.read_csv(out / "depth_ppl.csv")
    assert sorted(set(table["arm"])) == [
        "base, fixed K = 2", "mesh, fixed K = 2, rule cycle", "mesh, fixed K = 2, rule last",
        "mesh, sampled K, rule cycle",
    ]  # fmt: skip
    runs = _runs_csv(depth_grid, "depth.csv")
    assert len(runs) == 6
    for (scheme, _, _), frame in runs.items():  # every run evaluated 1..8 under its rules
        assert sorted(set(frame["loops"])) == [1, 2, 3, 4, 6, 8]
        assert set(frame["rule"]) == ({"last", "cycle"} if scheme == "mesh" else {"last"})
    # the table's base fixed-K PPL at each K' is the mean over seeds of exp(loss) in the runs' own files
    base = [f for (s, t, _), f in runs.items() if (s, t) == ("base", "fixed")]
    for k in (1, 2, 8):
        mine = table[(table["arm"] == "base, fixed K = 2") & (table["loops"] == k)]["ppl_mean"].item()
        assert mine == pytest.approx(np.mean([math.exp(f[f["loops"] == k]["loss"].item()) for f in base]), rel=1e-9)
    # its shape verdict at K' = 4 is the declared rule on d4 per seed, by scipy
    d4 = [f[f["loops"] == 4]["loss"].item() - f[f["loops"] == 2]["loss"].item() for f in base]
    ci = stats.ttest_1samp(d4, 0).confidence_interval(0.95)
    verdicts = pd.read_csv(out / "depth_verdicts.csv")
    line = verdicts[(verdicts["kind"] == "shape") & (verdicts["arm"] == "base, fixed K = 2") & (verdicts["loops"] == 4)]
    assert (line["d_low"].item(), line["d_high"].item()) == pytest.approx((ci.low, ci.high), rel=1e-9)
    assert line["verdict"].item() == shape(t_interval(d4))
    assert set(verdicts["kind"]) == {"shape", "sampled_minus_fixed", "cycle_minus_last"}
    (pair,) = verdicts[verdicts["kind"] == "sampled_minus_fixed"].itertuples()  # the cycle-trained arm
    assert (pair.arm, pair.against) == ("mesh, sampled K, rule cycle", "mesh, fixed K = 2, rule cycle")
    assert "K' = K equals each run's final validation loss (relative difference under 1e-6 in all 6)" in text
    exits = pd.read_csv(out / "exit_points.csv")
    assert set(exits["loops_per_token"]) == {2.0, 4.0, 6.0} and set(exits["criterion"]) == {"state", "output"}
    # the stability monitor: a fixed-K row once (both rules share its runs), a sampled arm by its rule
    monitor = (out / "depth.md").read_text().split("**Stability of the loop map**")[1]
    rows = [
        line.split(" | ")[0].lstrip("| ")
        for line in monitor.splitlines()
        if line.startswith("| ") and "---" not in line
    ]
    assert rows[1:] == ["base, fixed K = 2", "mesh, fixed K = 2", "mesh, sampled K, rule cycle"]
    kept = {p.name: p.read_bytes() for p in out.iterdir() if p.is_file()}
    rebuild_report(out)
    assert {p.name: p.read_bytes() for p in out.iterdir() if p.is_file()} == kept
    # a report of the sampled runs alone (no setting varies between its rows) keeps how they trained
    alone = tmp_path / "sampled"
    build_report("sampled", ["depth"], uri, alone, filter_string="params.`loops.distribution` = 'uniform'",
                 publish_to_parents=False)  # fmt: skip
    assert set(pd.read_csv(alone / "depth_ppl.csv")["arm"]) == {"mesh, sampled K, rule cycle"}
    kept = {p.name: p.read_bytes() for p in alone.iterdir() if p.is_file()}
    rebuild_report(alone)
    assert {p.name: p.read_bytes() for p in alone.iterdir() if p.is_file()} == kept
    # MLflow's grouped view (rewritten by the report) charts the depth curves: each group's mean over
    # its seeds at every loop count, the run's own rule first, the losses hidden
    import mlflow

    from experiments.store.views import GROUPED_VIEW, SHARED_VIEW_TAG, read_view

    experiment = mlflow.MlflowClient(uri).get_experiment_by_name("depth")
    view = read_view(experiment.tags[SHARED_VIEW_TAG + GROUPED_VIEW])
    sections = {sec["uuid"]: sec["name"] for sec in view["compareRunSections"]}
    drawn = [c for c in view["compareRunCharts"] if not c["deleted"]]
    depth = [c["metricKey"] for c in drawn if sections[c["metricSectionId"]] == "depth"]
    assert depth[0] == "depth/shakespeare/ppl" and {"depth/last/shakespeare/ppl", "depth/cycle/shakespeare/ppl"} <= set(
        depth
    )
    exits = {c["metricKey"] for c in drawn if sections[c["metricSectionId"]] == "exit"}
    assert {"exit/state/shakespeare/ppl", "exit/output/shakespeare/loops_used"} <= exits
    hidden = {c["metricKey"] for c in view["compareRunCharts"] if c["deleted"]}
    assert {"depth/shakespeare/loss", "exit/state/eps"} <= hidden and view["groupBy"]["groupByKeys"][0]["groupByData"]


def test_plan_of_the_depth_study_gives_its_budget_first_and_no_power(tmp_path):
    from results.commands.seeds_auto import print_plan

    out = io.StringIO()
    assert print_plan("depth", ["data=shakespeare", "max_steps=6", f"runs_dir={tmp_path}"], out) == 0
    lines = out.getvalue().splitlines()
    assert lines[0].startswith("depth: 24 cells (8 configs x 3 seeds); estimate: ") and "CPU-h" in lines[0]
    assert lines[-1].endswith("no claim's power to plan") and "depth_eval (loops [1, 2, 3, 4, 6, 8]" in lines[-2]


def _files(folder):
    return {p.name: p.read_bytes() for p in folder.iterdir() if p.is_file()}


def test_a_grid_reported_in_parts_with_add_is_the_grid_reported_whole(depth_grid, tmp_path):
    """A study run in parts (each session or machine its own store, every part the grid's arms for some
    of its seeds) is reported by ``mesh-results --add`` into the same folder: the runs the folder reports
    and the store lacks are kept, and the report is the one of the whole grid; a cell trained again
    (another run id, the same config hash) replaces its earlier run instead of counting twice; parts
    whose rows the folder cannot tell apart (it keeps only the settings that set its own rows apart)
    are refused in one line."""
    from results.commands.mesh_results import main
    from results.pipeline import build_report, rebuild_report
    from results.rows.frame import ResultsError

    uri = f"sqlite:///{depth_grid / 'mlflow.db'}"
    whole, parts = tmp_path / "whole", tmp_path / "parts"
    build_report("depth", ["depth"], uri, whole, publish_to_parents=False)
    build_report("depth", ["depth"], uri, parts, filter_string="params.seed = '200'", publish_to_parents=False)
    assert set(pd.read_csv(parts / "runs.csv")["seed"]) == {200}
    args = ["depth", "--tracking-uri", uri, "--out", str(parts), "--filter", "params.seed = '201'", "--add"]
    assert main(args) == 0
    same = ("depth_ppl.csv", "depth_verdicts.csv", "exit_points.csv", "depth.md", "table.md", "claims.md")
    assert {n: _files(parts)[n] for n in same} == {n: _files(whole)[n] for n in same}
    assert sorted(pd.read_csv(parts / "runs.csv")["run_id"]) == sorted(pd.read_csv(whole / "runs.csv")["run_id"])
    kept = _files(parts)
    rebuild_report(parts)
    assert _files(parts) == kept
    # the seed-200 cells as if trained in another store: other run ids, the same config hashes
    renamed = {}
    for name in ("runs.csv", "curves.csv", "train_loss.csv", "depth.csv", "exit.csv"):
        frame = pd.read_csv(parts / name, dtype={"run_id": str})
        renamed.update({r: f"old{r[3:]}" for r in frame["run_id"].unique()})
        frame.assign(run_id=frame["run_id"].map(renamed)).to_csv(parts / name, index=False)
    build_report("depth", ["depth"], uri, parts, publish_to_parents=False, add=True)
    assert {n: _files(parts)[n] for n in same} == {n: _files(whole)[n] for n in same}
    assert not any(r.startswith("old") for r in pd.read_csv(parts / "runs.csv", dtype={"run_id": str})["run_id"])
    # parts split by training: each alone has no setting that sets its MeSH rows apart
    fixed = tmp_path / "fixed"
    build_report("depth", ["depth"], uri, fixed, filter_string="params.`loops.distribution` = 'fixed'",
                 publish_to_parents=False)  # fmt: skip
    before = _files(fixed)
    with pytest.raises(ResultsError, match="cannot tell apart"):
        build_report("depth", ["depth"], uri, fixed, filter_string="params.`loops.distribution` = 'uniform'",
                     publish_to_parents=False, add=True)  # fmt: skip
    assert _files(fixed) == before


def test_runs_added_with_columns_the_folder_lacks_keep_the_derived_columns_last():
    """A part whose runs log columns the folder's runs lack (MeSH's routers up to a sampled cap) is
    joined with the derived columns (main_set, val_ppl) last, where reading the folder back puts them:
    otherwise the merged runs.csv would not rebuild to the same bytes."""
    import pandas as pd

    from results.pipeline import RunData, merged
    from results.runs.committed import DERIVED

    kept = pd.DataFrame({"run_id": ["a"], "config_hash": ["h1"], "x": [1.0], "main_set": ["docs"], "val_ppl": [50.0]})
    new = pd.DataFrame(
        {
            "run_id": ["b"],
            "config_hash": ["h2"],
            "x": [2.0],
            "main_set": ["docs"],
            "val_ppl": [60.0],
            "routing/w5": [0.1],
        }
    )
    frame = merged(RunData(kept), RunData(new)).frame
    assert list(frame["run_id"]) == ["a", "b"]
    assert list(frame.columns)[-2:] == [c for c in DERIVED if c in frame.columns] == ["main_set", "val_ppl"]
    assert "routing/w5" in frame.columns
