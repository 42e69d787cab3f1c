"""Validation over training (results/verdicts/over_training.py): curves.csv read back from a real sqlite MLflow store,
the verdict spans, the claims evaluated at each validation step against scipy, and the figures."""

from __future__ import annotations

import math

import mlflow
import pandas as pd
import pytest
from scipy import stats as scipy_stats

from results.commands.mesh_results import main
from results.render import over_training as curves_text
from results.rows import curves as curve_rows
from results.stats import bands
from results.verdicts import decide as decide_mod
from results.verdicts import over_training as curves

TOKENS_PER_STEP = 2048
STEPS = (10, 20, 30, 40)
SEEDS = (0, 1, 2)
NOISE = (0.01, -0.012, 0.004)  # per seed: the paired differences spread by this much
# MeSH's loss gap below base grows over training: within noise at step 10, clear by step 40.
GAP = {10: 0.0, 20: 0.02, 30: 0.1, 40: 0.2}
ROWS = (("vanilla", "6"), ("base", "1+2R2+1"), ("mesh", "1+2R2+1"))


def loss(scheme: str, seed: int, step: int) -> float:
    value = 6.0 - step / 20 + 0.05 * seed
    if scheme == "mesh":
        value += -GAP[step] + NOISE[seed]
    if scheme == "vanilla":
        value += 0.03
    return value


def log_curve_run(client, experiment_id: str, scheme: str, layout: str, seed: int, losses: dict[int, float]) -> None:
    """One finished run of ``scheme`` whose validation loss (and PPL, and val_loss) was logged at each
    step of ``losses``, as train() logs it."""
    tags = {"scheme": scheme, "layout": layout, "preset": "tiny", "seed": str(seed), "buffer_slots": ""}
    run_id = client.create_run(experiment_id, tags=tags, run_name=f"{scheme}-s{seed}").info.run_id
    for key, value in {"model": "tiny", "scheme": scheme, "seed": seed, "data.corpus": "shakespeare"}.items():
        client.log_param(run_id, key, value)
    client.log_metric(run_id, "tokens_per_step", TOKENS_PER_STEP, step=0)
    for step, value in losses.items():
        client.log_metric(run_id, "val/shakespeare/loss", value, step=step)
        client.log_metric(run_id, "val/shakespeare/ppl", math.exp(value), step=step)
        client.log_metric(run_id, "val_loss", value, step=step)
    client.set_terminated(run_id, "FINISHED")


@pytest.fixture(scope="module")
def report(tmp_path_factory):
    """A sqlite store with three schemes x three seeds whose validation was logged at STEPS
    (log_metric at each step), and the report mesh-results writes from it."""
    root = tmp_path_factory.mktemp("curves")
    uri = f"sqlite:///{root / 'mlflow.db'}"
    client = mlflow.MlflowClient(uri)
    experiment_id = client.create_experiment("curves", artifact_location=(root / "artifacts").as_uri())
    for scheme, layout in ROWS:
        for seed in SEEDS:
            log_curve_run(
                client, experiment_id, scheme, layout, seed, {step: loss(scheme, seed, step) for step in STEPS}
            )
    out = root / "out"
    assert main(["curves", "--tracking-uri", uri, "--out", str(out)]) == 0
    return out, client


def test_curves_csv_holds_every_logged_validation_step_with_its_tokens(report):
    out, client = report
    table = pd.read_csv(out / curve_rows.FILE)
    assert list(table.columns) == list(curve_rows.COLUMNS)
    assert sorted(table["metric"].unique()) == ["val/shakespeare/loss", "val/shakespeare/ppl"]
    assert len(table) == len(ROWS) * len(SEEDS) * len(STEPS) * 2
    for _, line in table.iterrows():
        logged = {m.step: m.value for m in client.get_metric_history(line["run_id"], line["metric"])}
        assert line["value"] == pytest.approx(logged[line["step"]], rel=1e-12)
        expected = loss(line["scheme"], int(line["seed"]), int(line["step"]))
        assert line["value"] == pytest.approx(math.exp(expected) if line["metric"].endswith("ppl") else expected)
        assert line["tokens"] == line["step"] * TOKENS_PER_STEP
    assert set(table["scheme"]) == {s for s, _ in ROWS}
    assert table["block"].nunique() == 1 and table["row"].nunique() == len(ROWS)


def test_spans_group_consecutive_verdicts():
    verdicts = ["a", "a", "a", "b", "c", "c"]
    tokens = [2e5, 4e5, 1.6e6, 2e6, 2.4e6, 3e6]
    groups = curves.spans(tokens, verdicts)
    assert [(g.verdict, g.first, g.last, g.points) for g in groups] == [
        ("a", 2e5, 1.6e6, 3),
        ("b", 2e6, 2e6, 1),
        ("c", 2.4e6, 3e6, 2),
    ]
    assert curves_text.spans_text(groups) == "a from 0.2M to 1.6M tokens; b at 2M tokens; c after"
    assert curves_text.spans_text(curves.spans([10, 20], ["a", "a"]), "steps") == (
        "a at every validation point, from step 10 to 20"
    )
    assert curves_text.spans_text(curves.spans([12288], ["a"])) == "a at the one validation point (12.3k tokens)"
    with pytest.raises(ValueError, match="2 positions for 1 verdicts"):
        curves.spans([1, 2], ["a"])


def test_t_band_is_scipys_t_interval():
    values = [3.1, 2.9, 3.4, 3.05]
    mean, half = bands.t_band(values)
    low, high = scipy_stats.t.interval(0.95, len(values) - 1, loc=mean, scale=scipy_stats.sem(values))
    assert (mean - half, mean + half) == pytest.approx((low, high), rel=1e-12)
    assert bands.t_band([2.0]) == (2.0, None)


def _results(out):
    from results.rows.aggregate import aggregate
    from results.runs.store import collect_runs, open_client

    return aggregate(collect_runs(open_client(f"sqlite:///{out.parent / 'mlflow.db'}"), ["curves"]), "val_loss")


def test_claims_are_evaluated_at_each_validation_step(report):
    from results.verdicts.engine import evaluate

    out, _ = report
    results = _results(out)
    table = pd.read_csv(out / curve_rows.FILE)
    final = evaluate(results)
    trajectories = decide_mod.claims_over_training(results, table, final)
    (mesh_base,) = [t for t in trajectories if t.evaluation.claim.id == "mesh_below_base"]
    assert mesh_base.steps == STEPS and mesh_base.tokens == tuple(s * TOKENS_PER_STEP for s in STEPS)
    # the paired test scipy runs on the PPL at each step decides where the verdict changes
    p = {}
    for step in STEPS:
        mesh = [math.exp(loss("mesh", s, step)) for s in SEEDS]
        base = [math.exp(loss("base", s, step)) for s in SEEDS]
        p[step] = scipy_stats.ttest_rel(mesh, base).pvalue
    assert p[10] > 0.05 and p[40] < 0.05
    assert mesh_base.verdicts[-1] == curves.BELOW  # the last step is the final value: CI below 0
    assert mesh_base.verdicts[0] != mesh_base.verdicts[-1]
    for step, label in zip(STEPS, mesh_base.verdicts, strict=True):  # descriptive: where the CI lies, no verdict
        assert (label == curves.BELOW) == (p[step] < 0.05), (step, p[step], label)
        assert label in (curves.BELOW, curves.ABOVE, curves.COVERS)
    text = (out / "claims.md").read_text()
    assert "## Over training (descriptive)" in text and "no verdict is drawn" in text
    section = text.split("## Over training", 1)[1]
    assert not any(word in section for word in (" holds", "contradicted", "inconclusive", "equivalent"))
    assert curves_text.trajectory_text(mesh_base) in text
    assert "tokens" in curves_text.trajectory_text(mesh_base)


def test_claim_deltas_are_the_paired_difference_in_loss_with_scipys_ci(report):
    from results.verdicts.engine import evaluate

    out, _ = report
    results = _results(out)
    table = pd.read_csv(out / curve_rows.FILE)
    chosen = [e for e in evaluate(results) if e.claim.id == "mesh_below_base"]
    deltas = curves.claim_deltas(results, table, chosen)
    assert set(deltas["metric"]) == {"val/shakespeare/loss"}
    for step in STEPS:
        (line,) = deltas[deltas["step"] == step].itertuples()
        diffs = [loss("mesh", s, step) - loss("base", s, step) for s in SEEDS]
        ci = scipy_stats.ttest_rel(
            [loss("mesh", s, step) for s in SEEDS], [loss("base", s, step) for s in SEEDS]
        ).confidence_interval()
        assert line.diff == pytest.approx(sum(diffs) / len(diffs), abs=1e-12)
        assert (line.low, line.high) == pytest.approx((ci.low, ci.high), abs=1e-12)
        assert line.tokens == step * TOKENS_PER_STEP


def test_report_links_the_validation_and_delta_figures(report):
    out, _ = report
    text = (out / "report.md").read_text()
    assert "## Over training" in text and "](curves.csv)" in text
    pngs = sorted(p.name for p in (out / "figures").glob("*.png"))
    val = [n for n in pngs if n.startswith("val_ppl_")]
    assert len(val) == 1 and f"](figures/{val[0]})" in text
    assert "delta_mesh_below_base.png" in pngs and "](figures/delta_mesh_below_base.png)" in text
    for name in [*val, "delta_mesh_below_base.png"]:
        path = out / "figures" / name
        assert path.stat().st_size > 1024 and path.with_suffix(".svg").exists()
