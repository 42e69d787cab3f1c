"""The learning-rate section: each variant's PPL at each peak LR, read back from a real store, its
best LR, the edge warning, the CSV and the figure."""

from __future__ import annotations

import math
import statistics
import time

import mlflow
import pandas as pd
import pytest
from mlflow.entities import Metric, Param

from results.publish.folder import REPORT_ENTRIES
from results.render.lr import lr_markdown, write_lr_sensitivity
from results.rows.aggregate import aggregate
from results.runs.store import collect_runs
from results.verdicts.lr import best_lrs, lr_curves

# scheme -> {lr: PPL per seed}: base is best at 2e-3 (inside the range), mesh at 4e-3 (the edge).
PPL = {
    "base": {1e-3: [52.0, 52.4], 2e-3: [49.0, 49.6], 4e-3: [50.0, 50.2]},
    "mesh": {1e-3: [53.0, 53.2], 2e-3: [50.5, 50.9], 4e-3: [48.0, 48.8]},
}


def _log(client, experiment_id, tags, params, metrics):
    run_id = client.create_run(experiment_id, tags=tags, run_name=tags["mlflow.runName"]).info.run_id
    now = int(time.time() * 1000)
    items = [Metric(k, float(v), now, 400) for k, v in metrics.items()]
    client.log_batch(run_id, metrics=items, params=[Param(k, str(v)) for k, v in params.items()])
    client.set_terminated(run_id, "FINISHED")


def _results(tmp_path_factory, ppl_table):
    root = tmp_path_factory.mktemp("lr")
    uri = f"sqlite:///{root / 'mlflow.db'}"
    client = mlflow.MlflowClient(uri)
    experiment_id = client.create_experiment("lr", artifact_location=(root / "artifacts").as_uri())
    for scheme, by_lr in ppl_table.items():
        for lr, ppls in by_lr.items():
            for seed, ppl in enumerate(ppls):
                tags = {"scheme": scheme, "layout": "1+2R2+1", "preset": "tiny", "seed": str(seed)}
                tags.update({"buffer_slots": "5" if scheme == "mesh" else "", "config_hash": f"{scheme}{lr}{seed}"})
                tags["mlflow.runName"] = f"tiny-{scheme}-lr{lr}-s{seed}"
                params = {"model": "tiny", "scheme": scheme, "seed": seed, "optim.lr": lr, "peak_lr": lr}
                metrics = {"val/docs/loss": math.log(ppl), "val/docs/ppl": ppl, "val_loss": math.log(ppl)}
                _log(client, experiment_id, tags, params, metrics)
    return aggregate(collect_runs(client, ["lr"])), root


@pytest.fixture(scope="module")
def results(tmp_path_factory):
    return _results(tmp_path_factory, PPL)


def test_each_variant_gets_its_lowest_mean_lr_read_back_from_the_store(results):
    res, _ = results
    assert best_lrs(res) == {"base 1+2R2+1": 2e-3, "mesh 1+2R2+1 B5": 4e-3}
    curves = {c.variant: c for c in lr_curves(res)}
    base = curves["base 1+2R2+1"]
    assert [p.lr for p in base.points] == [1e-3, 2e-3, 4e-3]
    mean, std, n = base.points[1].ppl(res.ppl_metric)
    assert mean == pytest.approx(49.3) and std == pytest.approx(statistics.stdev([49.0, 49.6])) and n == 2
    assert not base.at_edge and curves["mesh 1+2R2+1 B5"].at_edge
    # Lead: 49.3 vs the next best mean 50.1, in % of PPL.
    assert base.lead_pct == pytest.approx(100 * (50.1 / 49.3 - 1))


def test_the_section_bolds_the_best_flags_the_edge_and_writes_csv_and_figure(results, tmp_path):
    res, _ = results
    lines, paths = write_lr_sensitivity(res, tmp_path, tmp_path / "figures")
    text = "\n".join(lines)
    assert "| base 1+2R2+1 | 52.20 ± 0.28 (n=2) | **49.30 ± 0.42 (n=2)** | 50.10 ± 0.14 (n=2) | 2e-3 | 1.6% |" in text
    assert "| 4e-3: +1.6% (2 SE " in text  # base: the runner-up 4e-3 and its gap
    assert "| mesh 1+2R2+1 B5 |" in text and "4e-3 (edge of the range tried)" in text
    assert "Best at the edge of the LRs tried: mesh 1+2R2+1 B5" in text
    assert "![" in text and "figures/lr_sensitivity.png" in text
    frame = pd.read_csv(tmp_path / "lr.csv")
    assert len(frame) == 6 and frame["best"].sum() == 2
    best = frame[frame["best"]].set_index("scheme")["lr"].to_dict()
    assert best == {"base": 2e-3, "mesh": 4e-3}
    png = tmp_path / "figures" / "lr_sensitivity.png"
    assert png in paths and png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_the_best_and_the_runner_up_are_within_noise_when_their_gap_is_at_most_2_se(results):
    """The gap is the runner-up minus the best in log PPL over seeds, paired on the seeds both LRs ran."""
    from scipy import stats as scipy_stats

    res, _ = results
    curves = {c.variant: c for c in lr_curves(res)}
    for variant, best, runner in (("base 1+2R2+1", 2e-3, 4e-3), ("mesh 1+2R2+1 B5", 4e-3, 2e-3)):
        curve = curves[variant]
        a, b = (
            [math.log(p) for p in PPL[variant.split()[0]][runner]],
            [math.log(p) for p in PPL[variant.split()[0]][best]],
        )
        paired = scipy_stats.ttest_rel(a, b)
        se = (statistics.fmean(a) - statistics.fmean(b)) / paired.statistic
        assert curve.runner_up.lr == runner and curve.gap.se == pytest.approx(se)
        assert curve.within_noise == (abs(statistics.fmean(a) - statistics.fmean(b)) <= 2 * se)
        assert curve.gap.test == "paired t (n=2)"
    base = curves["base 1+2R2+1"]
    assert base.within_noise is False and "beyond noise" in base.noise_text  # gaps 2.0% and 0.8% per seed
    assert curves["mesh 1+2R2+1 B5"].within_noise is False
    # the runner-up 4e-3 at 48.8 and 50.2 against 49.0 and 49.6: per-seed gaps -0.4% and +1.2%, within 2 SE
    from dataclasses import replace

    from results.rows.aggregate import Stat

    close = replace(base.points[2].row, stats={res.ppl_metric: Stat((48.8, 50.2), ("0", "1"))})
    noisy = replace(base, points=(*base.points[:2], replace(base.points[2], row=close)))
    assert noisy.runner_up.lr == 4e-3 and noisy.within_noise is True and "within noise" in noisy.noise_text
    assert "Best LR within noise of the runner-up: base 1+2R2+1" in "\n".join(lr_markdown([noisy], "PPL"))


def test_a_grid_at_one_lr_per_scheme_has_no_section(tmp_path_factory, tmp_path):
    res, _ = _results(tmp_path_factory, {"base": {2e-3: [49.0, 49.6]}, "mesh": {4e-3: [48.0, 48.8]}})
    assert lr_curves(res) == [] and lr_markdown([], "PPL") == []
    assert write_lr_sensitivity(res, tmp_path, tmp_path / "figures") == ([], [])
    assert not (tmp_path / "lr.csv").exists()


def test_mesh_results_puts_the_section_after_the_ranking_with_its_csv_and_figure(results, tmp_path):
    from results.commands.mesh_results import main

    _, root = results
    out = tmp_path / "report"
    assert main(["lr", "--tracking-uri", f"sqlite:///{root / 'mlflow.db'}", "--out", str(out)]) == 0
    report = (out / "report.md").read_text()
    assert report.index("## Ranking") < report.index("## Learning rate") < report.index("## Main table")
    assert "[lr.csv](lr.csv)" in report and "(figures/lr_sensitivity.png)" in report
    assert (out / "figures" / "lr_sensitivity.png").is_file()
    assert {p.name for p in out.iterdir()} <= REPORT_ENTRIES  # the next report replaces the folder whole
    assert pd.read_csv(out / "lr.csv").query("best").set_index("scheme")["lr"].to_dict() == {"base": 2e-3, "mesh": 4e-3}
