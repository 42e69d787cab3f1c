"""mesh-results: tables, plots and report from runs read back out of MLflow.

Three stores: one with synthetic runs logged through MlflowClient (paper-scale rows, known values,
FAILED / RUNNING / KILLED runs), one from a real two-seed tiny sweep (base and mesh), and one of
synthetic mixture-of-experts rows beside a dense one (active parameters, routing probes).
"""

from __future__ import annotations

import math
import re
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

import mlflow
import pandas as pd
import pytest
from mlflow.entities import Metric, Param
from scipy import stats as scipy_stats

from experiments.probing.files import read_probe_table, write_probe_table
from experiments.store.views import (
    GROUPED_VIEW,
    KEY_METRICS_VIEW,
    ROW_TAG,
    RUN_COLOR_TAG,
    SHARED_VIEW_TAG,
    final_stretch_range,
    grouped_view,
    key_metrics_view,
    logged_metrics,
    read_view,
)
from mesh_model.probe_names import scheme_color
from results.commands.mesh_results import main
from results.publish.folder import REPORT_ENTRIES
from results.publish.parents import tag_runs
from results.render.formats import latex_escape, to_frame
from results.render.tables import probe_table
from results.rows.aggregate import Stat, aggregate
from results.rows.paper import load_paper_numbers, paper_values
from results.runs.store import collect_runs
from results.stats.comparison import format_p

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"

# (preset, scheme, layout, B, PPL per seed, 0-shot fraction per seed or None)
SYNTHETIC = [
    ("pythia-410m", "vanilla", "24", "", [9.05, 9.07, 9.09], [0.4387, 0.4390, 0.4384]),
    ("pythia-410m", "base", "4+8R2+4", "", [9.30, 9.31, 9.32], [0.4326, 0.4330, 0.4320]),
    ("pythia-410m", "mesh", "4+8R2+4", "5", [9.02, 9.04], [0.4412, 0.4420]),
    ("pythia-410m", "mesh", "4+8R2+4", "4", [9.10, 9.12], None),
    ("pythia-410m", "mesh", "4+8R2+4", "3", [9.13], None),
    ("pythia-410m", "anchor+anchor_emb", "4+8R2+4", "", [9.17], None),
    ("tiny", "base", "1+2R2+1", "", [1500.0, 1510.0], None),
]
PARAMS = {"vanilla": 302_309_376, "base": 201_541_632, "mesh": 201_572_382, "anchor+anchor_emb": 201_541_632}
TINY_PARAMS = 200_064


def _log(client, experiment_id, tags, params, metrics, status="FINISHED", name=None):
    """One run: ``metrics`` maps a key to a value (step 0) or to [(step, value), ...]."""
    run = client.create_run(experiment_id, tags={"mlflow.runName": name or "run", **tags}, run_name=name)
    run_id = run.info.run_id
    now = int(time.time() * 1000)
    items = []
    for key, value in metrics.items():
        for step, v in value if isinstance(value, list) else [(0, value)]:
            items.append(Metric(key, float(v), now + step, step))
    client.log_batch(run_id, metrics=items, params=[Param(k, str(v)) for k, v in params.items()])
    if status != "RUNNING":
        client.set_terminated(run_id, status)
    return run_id


def _cell_metrics(scheme, preset, ppl, zero_shot):
    pct = 100.0 if scheme == "vanilla" else 100.0 * PARAMS[scheme] / PARAMS["vanilla"]
    params = TINY_PARAMS if preset == "tiny" else PARAMS[scheme]
    metrics = {
        # an early validation with a different value: the table must use the last step's
        "val/pile/loss": [(100, 3.0), (200, math.log(ppl))],
        "val/pile/ppl": [(100, math.exp(3.0)), (200, ppl)],
        "val_loss": [(200, math.log(ppl))],
        "params_non_embedding": params,
        "params_pct_of_vanilla": 66.67 if preset == "tiny" else pct,
        "train/loss": [(s, 8.0 - s / 50 + ppl / 1000) for s in (10, 20, 30, 40, 50)],
    }
    if scheme == "vanilla":  # what the probes log for one stack: prelude (all its layers), coda (0 layers)
        metrics.update({"probe/update/prelude/mean": 0.8, "probe/update/coda/mean": 0.0})
    else:
        metrics["probe/update/core1/mean"] = 0.5
        if preset != "tiny":
            metrics["probe/update/coda/mean"] = ppl / 50
    if preset != "tiny" and scheme != "vanilla":  # the probes of today's runs; tiny's are an older run's
        metrics.update(
            {
                "probe/update/core_balance": ppl / 20,
                "probe/state_update/core1/mean": ppl / 30,
                "probe/state_update/core_balance": ppl / 40,
                "probe/cka_rbf/loop_mean": ppl / 10,
                "probe/cka_rbf/floor": 0.7,
                "probe/cka_rbf_debiased/loop_mean": ppl / 10 - 0.5,
                "probe/cka_rbf_debiased/floor": 0.01,
                "probe/erank/h1": 3 * ppl,
                "probe/erank/h2": 3 * ppl + 1,
            }
        )
    if zero_shot is not None:
        metrics["eval/0shot/avg"] = zero_shot
        metrics["eval/5shot/avg"] = zero_shot + 0.01
    return metrics


def _store(tmp_path_factory, experiment: str) -> tuple[Path, str, mlflow.MlflowClient, str]:
    """(folder, tracking URI, client, experiment id) of a new sqlite store holding ``experiment``."""
    root = tmp_path_factory.mktemp(experiment)
    uri = f"sqlite:///{root / 'mlflow.db'}"
    client = mlflow.MlflowClient(uri)
    return root, uri, client, client.create_experiment(experiment, artifact_location=(root / "artifacts").as_uri())


@pytest.fixture(scope="module")
def synthetic(tmp_path_factory):
    """A sqlite store with the SYNTHETIC cells, one FAILED, one RUNNING and one pruned (KILLED) run."""
    root, uri, client, experiment_id = _store(tmp_path_factory, "synthetic")
    parent = _log(client, experiment_id, {"kind": "sweep", "sweep": "synthetic"}, {}, {}, name="sweep:synthetic")
    for preset, scheme, layout, slots, ppls, zero_shots in SYNTHETIC:
        for seed, ppl in enumerate(ppls):
            tags = {"scheme": scheme, "layout": layout, "preset": preset, "seed": str(seed), "buffer_slots": slots}
            tags.update({"config_hash": f"h{seed}", "git_commit": "abc123", "mlflow.parentRunId": parent})
            params = {"model": preset, "scheme": scheme, "seed": seed, "data.corpus": "pile", "max_steps": 200}
            metrics = _cell_metrics(scheme, preset, ppl, zero_shots[seed] if zero_shots else None)
            _log(client, experiment_id, tags, params, metrics, name=f"{preset}-{layout}-{scheme}{slots}-s{seed}")
    broken = {"scheme": "base", "layout": "4+8R2+4", "preset": "pythia-410m", "buffer_slots": "", "seed": "3"}
    params = {"model": "pythia-410m", "scheme": "base", "seed": 3, "data.corpus": "pile", "max_steps": 200}
    wild = _cell_metrics("base", "pythia-410m", 1000.0, 0.9)
    _log(client, experiment_id, {**broken, "error": "RuntimeError: loss is nan"}, params, wild, "FAILED", "failed-run")
    _log(client, experiment_id, {**broken, "seed": "4"}, {**params, "seed": 4}, wild, "RUNNING", "unfinished-run")
    pruned = {**broken, "seed": "5", "pruned": "TrialPruned: step 100"}
    _log(client, experiment_id, pruned, {**params, "seed": 5}, wild, "KILLED", "pruned-run")
    out = root / "out"
    assert main(["synthetic", "--tracking-uri", uri, "--out", str(out)]) == 0
    return out


def _block_rows(markdown: str, block: str) -> dict[str, list[str]]:
    """'scheme layout B' -> the cells of that row, in the table of ``block``."""
    section = markdown.split(f"### {block}\n", 1)[1].lstrip("\n").split("\n\n", 1)[0]
    lines = [line for line in section.splitlines() if line.startswith("|")]
    header = [c.strip() for c in lines[0].strip("|").split("|")]
    rows = {}
    for line in lines[2:]:
        cells = [c.strip() for c in line.strip("|").split("|")]
        row = dict(zip(header, cells, strict=True))
        rows[" ".join(filter(None, [row["scheme"].replace("\\", ""), row["layout"], row.get("B", "")]))] = cells
    return {"header": header, **rows}


def test_table_numbers_equal_the_logged_ones(synthetic):
    table = pd.read_csv(synthetic / "table.csv", dtype={"buffer_slots": str})
    table["buffer_slots"] = table["buffer_slots"].fillna("")
    for preset, scheme, _, slots, ppls, zero_shots in SYNTHETIC:
        selected = table[(table.preset == preset) & (table.scheme == scheme) & (table.buffer_slots == slots)]
        assert len(selected) == 1
        row = selected.iloc[0]
        assert row["n_runs"] == len(ppls)  # the FAILED / RUNNING / KILLED base runs are not averaged in
        assert row["val/pile/ppl_mean"] == pytest.approx(statistics.fmean(ppls), abs=1e-9)
        if len(ppls) > 1:
            assert row["val/pile/ppl_std"] == pytest.approx(statistics.stdev(ppls), abs=1e-9)
        else:
            assert math.isnan(row["val/pile/ppl_std"])
        assert row["val/pile/loss_mean"] == pytest.approx(statistics.fmean(math.log(p) for p in ppls), abs=1e-9)
        assert row["val/pile/ppl_n"] == len(ppls)
        if zero_shots:
            assert row["eval/0shot/avg_pct_mean"] == pytest.approx(100 * statistics.fmean(zero_shots))
            assert row["eval/0shot/avg_pct_std"] == pytest.approx(100 * statistics.stdev(zero_shots))
    mesh = table[(table.scheme == "mesh") & (table.buffer_slots == "5")].iloc[0]
    # a PPL is compared on the log scale (Row.compare, as the claims): Δ is the difference of mean log PPL
    # (the seeds spread around these means: log of the mean to 1e-5)
    assert mesh["delta_val_ppl_vs_vanilla"] == pytest.approx(math.log(9.03) - math.log(9.07), abs=1e-5)
    assert mesh["delta_val_ppl_vs_base"] == pytest.approx(math.log(9.03) - math.log(9.31), abs=1e-5)
    assert mesh["params_non_embedding"] == PARAMS["mesh"]


def test_cells_show_mean_std_and_n(synthetic):
    rows = _block_rows((synthetic / "table.md").read_text(), "pythia-410m, compute depth 24")
    column = rows["header"].index("PPL (pile)")
    assert rows["vanilla 24"][column] == "<u>9.070 ± 0.020 (n=3)</u>"
    assert rows["anchor+anchor_emb 4+8R2+4"][column] == "9.170 (n=1)"  # one seed: no ±
    assert rows["base 4+8R2+4"][rows["header"].index("vs vanilla")] == "-33.3%"
    assert rows["vanilla 24"][rows["header"].index("vs vanilla")] == "100%"
    assert "single seed: no spread shown" in (synthetic / "report.md").read_text()
    assert "ddof=1" in (synthetic / "report.md").read_text()


def test_best_is_bold_and_second_underlined_per_block(synthetic):
    rows = _block_rows((synthetic / "table.md").read_text(), "pythia-410m, compute depth 24")
    header = rows["header"]
    for name, better_first, second in (
        ("PPL (pile)", "mesh 4+8R2+4 5", "vanilla 24"),
        ("loss (pile)", "mesh 4+8R2+4 5", "vanilla 24"),
        ("0-shot avg (%)", "mesh 4+8R2+4 5", "vanilla 24"),  # higher is better
    ):
        column = header.index(name)
        marked = {key: cells[column] for key, cells in rows.items() if key != "header"}
        assert [k for k, v in marked.items() if v.startswith("**")] == [better_first], name
        assert [k for k, v in marked.items() if v.startswith("<u>")] == [second], name
    # the tiny block has its own ranking (one row: nothing to mark)
    tiny = _block_rows((synthetic / "table.md").read_text(), "tiny, compute depth 6")
    assert "**" not in " ".join(tiny["base 1+2R2+1"])


def test_differences_carry_ci_p_and_test_in_md_tex_and_csv(synthetic):
    # PPL on the log scale: the same test the claims run (one comparison per pair)
    vanilla, base = [math.log(v) for v in SYNTHETIC[0][4]], [math.log(v) for v in SYNTHETIC[1][4]]
    mesh = [math.log(v) for v in SYNTHETIC[2][4]]
    paired = scipy_stats.ttest_rel(base, vanilla)  # both rows ran seeds 0, 1, 2
    welch = scipy_stats.ttest_ind(mesh, base, equal_var=False)  # mesh ran seeds 0, 1 only
    table = pd.read_csv(synthetic / "table.csv", dtype={"buffer_slots": str})
    row = table[table.scheme == "base"].iloc[0]
    assert row["delta_val_ppl_vs_vanilla"] == pytest.approx(statistics.fmean(base) - statistics.fmean(vanilla))
    interval = paired.confidence_interval(0.95)
    assert (row["ci_low_val_ppl_vs_vanilla"], row["ci_high_val_ppl_vs_vanilla"]) == pytest.approx(
        (interval.low, interval.high)
    )
    assert (
        row["p_val_ppl_vs_vanilla"] == pytest.approx(paired.pvalue)
        and row["test_val_ppl_vs_vanilla"] == "paired t (n=3)"
    )
    row = table[(table.scheme == "mesh") & (table.buffer_slots == "5")].iloc[0]
    interval = welch.confidence_interval(0.95)
    assert (row["ci_low_val_ppl_vs_base"], row["ci_high_val_ppl_vs_base"]) == pytest.approx(
        (interval.low, interval.high)
    )
    assert row["p_val_ppl_vs_base"] == pytest.approx(welch.pvalue) and row["test_val_ppl_vs_base"] == "Welch t"
    one_seed = table[table.scheme == "anchor+anchor_emb"].iloc[0]  # n=1: the difference, no test
    assert one_seed["delta_val_ppl_vs_base"] == pytest.approx(math.log(9.17) - math.log(9.31), abs=1e-5)
    assert math.isnan(one_seed["p_val_ppl_vs_base"])

    rows = _block_rows((synthetic / "table.md").read_text(), "pythia-410m, compute depth 24")
    header = rows["header"]
    delta, p, test = (
        header.index(f"{c} vs base{')' if c != 'ΔPPL' else ' (95% CI)'}") for c in ("ΔPPL", "p (PPL", "test (PPL")
    )
    mesh_cells = rows["mesh 4+8R2+4 5"]
    ratio = math.expm1(statistics.fmean(mesh) - statistics.fmean(base))
    low, high = math.expm1(interval.low), math.expm1(interval.high)
    assert mesh_cells[delta] == f"{100 * ratio:+.1f}% \\[{100 * low:+.1f}%, {100 * high:+.1f}%\\]"
    assert mesh_cells[p] == format_p(welch.pvalue) and mesh_cells[test] == "Welch t"
    assert (
        rows["anchor+anchor_emb 4+8R2+4"][delta] == f"{100 * math.expm1(math.log(9.17 / 9.31)):+.1f}%"
        and rows["anchor+anchor_emb 4+8R2+4"][test] == ""
    )
    assert rows["base 4+8R2+4"][delta] == "—"
    assert rows["base 4+8R2+4"][header.index("test (PPL vs vanilla)")] == "paired t (n=3)"
    markdown = (synthetic / "table.md").read_text()
    assert "rank means only and do not say that a difference is significant" in markdown
    assert "paired t-test on the per-seed differences" in markdown and "Welch-Satterthwaite" in markdown
    tex = (synthetic / "table.tex").read_text()
    assert r"$\Delta$PPL vs base (95\% CI) & p (PPL vs base) & test (PPL vs base)" in tex
    cell = f"{100 * ratio:+.1f}\\% [{100 * low:+.1f}\\%, {100 * high:+.1f}\\%]"  # LaTeX escapes the %
    assert "paired t (n=3)" in tex and "Welch t" in tex and cell in tex


def test_probe_table_cka_beside_its_floor_and_differences_vs_base(synthetic):
    markdown = (synthetic / "probes.md").read_text()
    rows = _block_rows(markdown, "pythia-410m, compute depth 24")
    header = rows["header"]
    for estimator in ("rbf", "rbf debiased"):
        column = header.index(f"CKA {estimator} h(t),h(t+1)")
        assert header[column + 1] == f"floor {estimator}"
    assert "CKA linear h(t),h(t+1)" not in header  # not logged: no column
    for name in ("core balance", "CKA rbf", "CKA rbf debiased", "erank"):
        assert {f"Δ{name} vs base (95% CI)", f"p ({name} vs base)", f"test ({name} vs base)"} <= set(header)
    assert {"update core1", "state update core1", "core balance", "state balance"} <= set(header)
    assert "core update f(h) vs h" in markdown and "state update" in markdown and "null floor" in markdown
    # an older run with only the update column renders, with a note on what its update may be
    tiny = _block_rows(markdown, "tiny, compute depth 6")
    assert tiny["base 1+2R2+1"][tiny["header"].index("update core1")] == "0.500 ± 0.000 (n=2)"
    assert "Rows without state update columns (base 1+2R2+1)" in markdown

    probes = pd.read_csv(synthetic / "probes.csv", dtype={"buffer_slots": str})
    mesh = probes[(probes.scheme == "mesh") & (probes.buffer_slots == "5")].iloc[0]
    base_ppl, mesh_ppl = SYNTHETIC[1][4], SYNTHETIC[2][4]
    welch = scipy_stats.ttest_ind([p / 20 for p in mesh_ppl], [p / 20 for p in base_ppl], equal_var=False)
    assert mesh["p_probe/update/core_balance_vs_base"] == pytest.approx(welch.pvalue)
    assert mesh["test_probe/update/core_balance_vs_base"] == "Welch t"
    erank = [statistics.fmean([3 * p, 3 * p + 1]) for p in mesh_ppl]
    assert mesh["probe/erank/loop_mean_mean"] == pytest.approx(statistics.fmean(erank))
    for column in ("delta", "ci_low", "ci_high", "p", "test"):
        assert f"{column}_probe/cka_rbf_debiased/loop_mean_vs_base" in probes.columns
    tex = (synthetic / "probes.tex").read_text()
    assert r"CKA rbf h(t),h(t+1) & floor rbf" in tex and r"test (erank vs base)" in tex


def test_probe_table_shows_a_vanilla_row_one_stack_and_no_core_or_coda(synthetic):
    markdown = (synthetic / "probes.md").read_text()
    rows = _block_rows(markdown, "pythia-410m, compute depth 24")
    header, vanilla, mesh = rows["header"], rows["vanilla 24"], rows["mesh 4+8R2+4 5"]
    assert header.index("update stack") < header.index("update core1") < header.index("update coda")
    assert vanilla[header.index("update stack")] == "0.800 ± 0.000 (n=3)"
    for column in ("update core1", "update coda", "state update core1", "core balance"):
        assert vanilla[header.index(column)] == "", column  # blocks a vanilla layout does not have
    assert mesh[header.index("update stack")] == "" and mesh[header.index("update coda")].startswith("0.181")
    assert "update prelude" not in header  # no row logged a prelude of its own: no column
    probes = pd.read_csv(synthetic / "probes.csv", dtype={"buffer_slots": str})
    vanilla_csv = probes[probes.scheme == "vanilla"].iloc[0]
    assert vanilla_csv["probe/update/stack/mean_mean"] == pytest.approx(0.8)
    assert pd.isna(vanilla_csv["probe/update/coda/mean_mean"]) and vanilla_csv["probe/update/coda/mean_n"] == 0


def _probe_table_file(folder: Path, values: dict[str, float | None]) -> Path:
    """``<folder>/probes/final/probes.csv`` holding ``values``, as the probe callback writes it."""
    (folder / "probes" / "final").mkdir(parents=True)
    return write_probe_table(values, folder / "probes" / "final" / "probes.csv")


def test_probe_values_mlflow_lacks_are_read_from_the_runs_final_probe_table(tmp_path_factory, tmp_path):
    """A run of today logs its summary probe metrics and keeps the others in probes/final/probes.csv:
    under its run dir when this machine has it, else as an artifact. What MLflow holds wins (an
    older run logged every value), an empty cell stays NaN, a table that does not parse is left out."""
    _, _, client, experiment_id = _store(tmp_path_factory, "probe-tables")
    cell = {"preset": "tiny", "scheme": "mesh", "layout": "1+2R2+1", "buffer_slots": "5"}
    summary = {"val_loss": 4.0, "probe/update/core_balance": 0.25}
    local = tmp_path / "local"
    _probe_table_file(
        local, {"probe/update/core_balance": 0.5, "probe/update/core1/mean": 0.7, "probe/cka_rbf/h0/h1": None}
    )
    _log(client, experiment_id, {**cell, "seed": "0", "run_dir": str(local)}, {}, summary, name="local")
    remote = _log(
        client, experiment_id, {**cell, "seed": "1", "run_dir": str(tmp_path / "gone")}, {}, summary, name="remote"
    )
    client.log_artifact(
        remote, str(_probe_table_file(tmp_path / "upload", {"probe/update/core1/mean": 0.9})), "probes/final"
    )
    older = tmp_path / "older"  # every value in MLflow, no table
    _log(
        client,
        experiment_id,
        {**cell, "seed": "2", "run_dir": str(older)},
        {},
        {**summary, "probe/update/core1/mean": 0.3},
        name="older",
    )
    broken = tmp_path / "broken"
    _probe_table_file(broken, {}).write_text("not a probe table\n1,2\n")
    _log(client, experiment_id, {**cell, "seed": "3", "run_dir": str(broken)}, {}, summary, name="broken")
    unprobed = tmp_path / "unprobed"  # logged no probe: its table is not read
    _probe_table_file(unprobed, {"probe/update/core1/mean": 0.1})
    _log(client, experiment_id, {**cell, "seed": "4", "run_dir": str(unprobed)}, {}, {"val_loss": 4.0}, name="unprobed")

    frame = collect_runs(client, ["probe-tables"]).set_index("run_name")
    assert frame.loc["local", "probe/update/core_balance"] == 0.25  # MLflow's, not the table's 0.5
    assert frame.loc["local", "probe/update/core1/mean"] == 0.7 and math.isnan(
        frame.loc["local", "probe/cka_rbf/h0/h1"]
    )
    assert frame.loc["remote", "probe/update/core1/mean"] == 0.9  # downloaded: its run dir is gone
    assert frame.loc["older", "probe/update/core1/mean"] == 0.3
    assert (
        math.isnan(frame.loc["broken", "probe/update/core1/mean"])
        and frame.loc["broken", "probe/update/core_balance"] == 0.25
    )
    assert math.isnan(frame.loc["unprobed", "probe/update/core1/mean"])
    # what could not be read is recorded on its run and listed by the report, not left a silent default
    assert frame.loc["broken", "read_error"].startswith("probes/final/probes.csv: ")
    assert (frame.drop(index="broken")["read_error"].fillna("") == "").all()
    from results.pipeline import build_report

    out = build_report(
        "probe-tables", ["probe-tables"], client.tracking_uri, tmp_path / "report", publish_to_parents=False
    )
    said = [line for line in out.report.read_text().splitlines() if line.startswith("* **Not read back**")]
    assert len(said) == 1 and "`broken`" in said[0] and "probes/final/probes.csv: " in said[0]


def test_report_links_and_summarises_the_claims(synthetic):
    report = (synthetic / "report.md").read_text()
    assert "[claims.md](claims.md)" in report and (synthetic / "claims.md").exists()
    claims = report.split("## The paper's claims", 1)[1].split("\n## ", 1)[0]
    assert (
        "| `mesh_below_base` | pythia-410m, compute depth 24 | `mesh 4+8R2+4 B5` vs `base 4+8R2+4` | `val/pile/ppl` | holds (n=2, fragile) |"
        in claims
    )


def _ranking(report: str, block: str) -> list[list[str]]:
    """The cells of the ranking's rows of ``block``."""
    section = report.split("## Ranking\n", 1)[1].split("\n## ", 1)[0]
    table = section.split(f"**{block}**", 1)[1].split("\n\n", 2)[1]
    return [[c.strip() for c in line.strip("|").split("|")] for line in table.splitlines()[2:]]


def test_the_report_opens_with_each_blocks_ranking_by_ppl_with_delta_vs_base_and_the_claims_verdict(synthetic):
    """The answer first: after the title line comes the ranking, best mean first, each row's PPL as
    logged, its difference to base (CI, described) and the verdict of the claim comparing the two."""
    report = (synthetic / "report.md").read_text()
    assert report.split("\n## ", 2)[1].startswith("Ranking\n")
    rows = _ranking(report, "pythia-410m, compute depth 24")
    labels = [r[1].strip("`") for r in rows]  # code spans, as written (no backslash escapes in them)
    assert labels == [
        "mesh 4+8R2+4 B5",
        "vanilla 24",
        "mesh 4+8R2+4 B4",
        "mesh 4+8R2+4 B3",
        "anchor+anchor_emb 4+8R2+4",
        "base 4+8R2+4",
    ]
    assert [r[0] for r in rows] == ["1", "2", "3", "4", "5", "6"]
    mesh5 = next(p for (pr, s, _, b, p, _) in SYNTHETIC if pr == "pythia-410m" and s == "mesh" and b == "5")
    base = next(p for (pr, s, _, _, p, _) in SYNTHETIC if pr == "pythia-410m" and s == "base")
    assert rows[0][2] == f"{statistics.fmean(mesh5):.3f} ± {statistics.stdev(mesh5):.3f} (n=2)"
    delta, ci = rows[0][3].split(" ", 1)  # Δ vs base: log PPL as a ratio, the claims' own test
    logs5, logs_base = [math.log(v) for v in mesh5], [math.log(v) for v in base]
    assert delta == f"{100 * math.expm1(statistics.fmean(logs5) - statistics.fmean(logs_base)):+.1f}%"
    welch = scipy_stats.ttest_ind(logs5, logs_base, equal_var=False).confidence_interval(0.95)
    assert ci == f"[{100 * math.expm1(welch.low):+.1f}%, {100 * math.expm1(welch.high):+.1f}%]"
    assert rows[0][4] == "`mesh_below_base`: holds (n=2, fragile)"
    assert rows[1][4] == "`base_worse_than_vanilla`: holds"  # vanilla against base, the claim either way round
    # no claim sets mesh B4 against base: the Δ still names its test and p (the table's), uncorrected
    assert re.match(r"Δ by (paired|Welch) t.* on log PPL, p [\d.e-]+ ", rows[2][4]) and rows[2][4].endswith(
        "(uncorrected: no claim sets this row against base)"
    )
    assert rows[-1][3:] == ["—", "reference"]


def test_the_methods_are_said_once_at_the_end_and_the_probe_table_is_an_appendix(synthetic):
    report = (synthetic / "report.md").read_text()
    headings = [line for line in report.splitlines() if line.startswith("## ")]
    assert headings[-2:] == ["## Methods", "## Appendix: the probe table"]
    assert headings.index("## Main table") < headings.index("## Methods")
    methods = report.split("## Methods\n", 1)[1]
    assert "### What was run" in methods and "* **Runs**: 17 (14 finished" in methods
    assert report.count("Welch-Satterthwaite") == 1 and report.count("ddof=1") == 2  # the cells, the probes
    # the block's heading names its preset: no scale column in Markdown; LaTeX, without headings, keeps it
    assert "| scale |" not in report and "| scale |" not in (synthetic / "table.md").read_text()
    assert (synthetic / "table.tex").read_text().splitlines()[3].startswith("scale & scheme & layout")
    probes = (synthetic / "probes.md").read_text()
    assert "core balance" in report.split("## Appendix: the probe table", 1)[1] and "core balance" in probes


def test_every_entry_a_report_writes_is_one_its_folder_may_be_replaced_for(synthetic):
    """A folder holding only these is swapped whole by the next report (results/publish/folder.py)."""
    assert {p.name for p in synthetic.iterdir()} <= REPORT_ENTRIES


def test_runs_are_coloured_by_scheme_tagged_with_their_row_and_grouped_by_row_where_b_varies(synthetic):
    """mesh-results colours every run by its scheme (the figures' palette), tags every finished run
    with its row (config without the seed), and writes the grouped view: by row here, where B and
    the preset vary besides the scheme."""
    uri = f"sqlite:///{synthetic.parent / 'mlflow.db'}"
    client = mlflow.MlflowClient(uri)
    (experiment,) = [e for e in client.search_experiments() if e.name == "synthetic"]
    runs = client.search_runs([experiment.experiment_id], max_results=1000)
    cells = [r for r in runs if "seed" in r.data.tags]
    assert all(r.data.tags[RUN_COLOR_TAG] == scheme_color(r.data.tags["scheme"]) for r in cells)
    rows = {r.info.run_name: r.data.tags.get(ROW_TAG) for r in cells}
    assert (
        rows["pythia-410m-4+8R2+4-mesh5-s0"] == rows["pythia-410m-4+8R2+4-mesh5-s1"] == "mesh 4+8R2+4 B5 · pythia-410m"
    )
    assert rows["pythia-410m-4+8R2+4-mesh4-s0"] == "mesh 4+8R2+4 B4 · pythia-410m"
    assert rows["tiny-1+2R2+1-base-s0"] == "base 1+2R2+1 · tiny" != rows["pythia-410m-4+8R2+4-base-s0"]
    assert rows["failed-run"] is None and rows["unfinished-run"] is None  # in no row of the table
    views = client.get_experiment(experiment.experiment_id).tags
    logged = logged_metrics(client, experiment.experiment_id)
    final = final_stretch_range(client, experiment.experiment_id, "val/pile/ppl", tokens=False)
    assert final is not None and final["yMin"] < final["yMax"]  # the rows' final PPLs differ
    view = read_view(views[SHARED_VIEW_TAG + GROUPED_VIEW])
    assert view == grouped_view(["pile"], ROW_TAG, logged, {"val/pile/ppl": final})
    zoomed = [c for c in view["compareRunCharts"] if c["metricKey"] == "val/pile/ppl" and c["range"]]
    assert [c["type"] for c in zoomed] == ["LINE"] and zoomed[0]["range"] == final  # no bar chart from 0
    assert read_view(views[SHARED_VIEW_TAG + KEY_METRICS_VIEW]) == key_metrics_view(["pile"], logged)


def test_a_run_logged_before_its_seed_was_a_tag_gets_the_tag_so_the_views_select_it(tmp_path_factory):
    """The views select training runs by ``tags.seed``; a run whose seed is only a param (an older
    version's) is tagged with it, its colour and its row when read."""
    _, uri, client, experiment_id = _store(tmp_path_factory, "old_runs")
    tags = {"scheme": "mesh", "layout": "1+2R2+1", "preset": "tiny", "buffer_slots": "5", "config_hash": "h"}
    run_id = _log(client, experiment_id, tags, {"seed": 3, "model": "tiny"}, {"val/pile/ppl": 50.0, "val_loss": 3.9})
    results = aggregate(collect_runs(client, ["old_runs"]), "val_loss")
    tag_runs(client, results.runs)
    tagged = client.get_run(run_id).data.tags
    assert tagged["seed"] == "3" and tagged[ROW_TAG] == "mesh 1+2R2+1 B5 · tiny"
    assert tagged[RUN_COLOR_TAG] == scheme_color("mesh")
    selected = client.search_runs([experiment_id], key_metrics_view(["pile"])["searchFilter"])
    assert [r.info.run_id for r in selected] == [run_id]


def test_a_grid_of_schemes_only_is_grouped_by_scheme_and_its_parent_note_starts_with_the_ranking(
    tmp_path_factory, tmp_path, capsys
):
    root, uri, client, experiment_id = _store(tmp_path_factory, "schemes_only")
    parent = _log(client, experiment_id, {"kind": "sweep", "sweep": "schemes_only"}, {}, {}, name="sweep")
    for scheme, ppls in (("base", (50.0, 51.0)), ("mesh", (48.0, 48.5))):
        for seed, ppl in enumerate(ppls):
            tags = {"scheme": scheme, "layout": "1+2R2+1", "preset": "tiny", "seed": str(seed), "buffer_slots": ""}
            tags.update({"config_hash": f"{scheme}{seed}", "git_commit": "abc", "mlflow.parentRunId": parent})
            params = {"model": "tiny", "scheme": scheme, "seed": seed, "data.corpus": "pile", "max_steps": 200}
            _log(client, experiment_id, tags, params, _cell_metrics("base", "tiny", ppl, None), name=f"{scheme}{seed}")
    out = tmp_path / "report"
    assert main(["schemes_only", "--tracking-uri", uri, "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    grouped = read_view(client.get_experiment(experiment_id).tags[SHARED_VIEW_TAG + GROUPED_VIEW])
    assert grouped["groupBy"]["groupByKeys"] == [{"mode": "tag", "groupByData": "scheme"}]
    note = client.get_run(parent).data.tags["mlflow.note.content"]
    ranking = (out / "report.md").read_text().split("## Ranking\n\n", 1)[1].split("\n\n## ", 1)[0]
    assert note.startswith(ranking.strip()) and "| 1 | `mesh 1+2R2+1` |" in note
    assert note.index("`mesh-results schemes_only`") < note.index("| scheme | layout |")  # the table after
    page = f"http://127.0.0.1:5000/#/experiments/{experiment_id}/runs/{parent}?workflowType=machine_learning"
    assert f"on the sweep's parent run:\n{page}\n" in printed  # the URL on its own line
    assert "viewStateShareKey=mesh-grouped" in printed and "viewStateShareKey=mesh-key-metrics" not in printed
    assert "| " not in printed and "(every metric and test: " in printed  # the ranking in plain text, not the table


@pytest.mark.slow
def test_a_killed_mesh_results_leaves_the_previous_report_or_none_and_the_next_run_writes_it(synthetic, tmp_path):
    """SIGKILL while the report is being written (its tables are there, report.md not yet): a new
    folder does not appear, an existing one keeps the previous report whole; the next run writes
    the folder and removes what the killed ones left. A folder holding other files keeps them."""
    uri = f"sqlite:///{synthetic.parent / 'mlflow.db'}"
    previous = tmp_path / "previous"
    shutil.copytree(synthetic, previous)
    before = {p.relative_to(previous): p.read_bytes() for p in previous.rglob("*") if p.is_file()}
    fresh = tmp_path / "fresh"
    for out in (fresh, previous):
        command = [str(Path(sys.executable).parent / "mesh-results"), "synthetic", "--tracking-uri", uri]
        process = subprocess.Popen([*command, "--out", str(out)], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        partial = out.with_name(f".{out.name}.partial-{process.pid}")
        deadline = time.monotonic() + 600  # a hang guard: a mesh-results that exits fails at once
        while not (partial / "table.md").exists():
            assert process.poll() is None, process.stderr.read().decode()
            assert time.monotonic() < deadline, "mesh-results wrote no table in 600 s"
            time.sleep(0.02)
        process.kill()
        process.wait()
        assert partial.is_dir()  # what it was writing is beside the folder, hidden
    assert not fresh.exists()
    assert {p.relative_to(previous): p.read_bytes() for p in previous.rglob("*") if p.is_file()} == before
    assert main(["synthetic", "--tracking-uri", uri, "--out", str(fresh)]) == 0
    assert (fresh / "report.md").is_file()
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".fresh.")]
    (previous / "my notes.txt").write_text("mine")
    (previous / "report.md").write_text("old")
    assert main(["synthetic", "--tracking-uri", uri, "--out", str(previous)]) == 0
    assert (previous / "my notes.txt").read_text() == "mine" and (previous / "report.md").read_text().startswith("# ")
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".previous.")]


def test_paper_number_beside_the_matching_row(synthetic):
    rows = _block_rows((synthetic / "table.md").read_text(), "pythia-410m, compute depth 24")
    header = rows["header"]
    paper = header.index("paper PPL")
    assert header[paper - 1] == "PPL (pile)"
    assert rows["base 4+8R2+4"][paper] == "9.31"
    assert rows["vanilla 24"][paper] == "9.07"
    assert rows["mesh 4+8R2+4 5"][paper] == "9.09"  # the headline table, default B = K + 3
    assert rows["mesh 4+8R2+4 3"][paper] == "9.1231"  # the B ablation
    assert rows["anchor+anchor_emb 4+8R2+4"][paper] == "9.1694"  # the skip-combination ablation
    assert rows["base 4+8R2+4"][header.index("paper 0-shot")] == "43.26"
    tiny = _block_rows((synthetic / "table.md").read_text(), "tiny, compute depth 6")
    assert tiny["base 1+2R2+1"][tiny["header"].index("paper PPL")] == ""  # no paper row for CPU presets


def test_paper_numbers_come_from_the_data_file(tmp_path):
    rows = load_paper_numbers()
    assert paper_values(rows, "pythia-410m", "base", "4+8R2+4", "")["ppl"].text == "9.31"
    assert paper_values(rows, "pythia-410m", "base", "4+8R2+4", "", prefer=("skip_combos",))["ppl"].text == "9.3542"
    assert paper_values(rows, "pythia-1b", "anchor*", "3+5R2+3", "")["0shot"].value == 46.85
    assert paper_values(rows, "tiny", "base", "1+2R2+1", "") == {}
    other = tmp_path / "numbers.csv"
    other.write_text(
        "source,table,preset,scheme,layout,buffer_slots,loss,ppl,0shot,5shot,note\nx,t,tiny,base,1+2R2+1,,,1.5,,,\n"
    )
    assert paper_values(load_paper_numbers(other), "tiny", "base", "1+2R2+1", "")["ppl"].value == 1.5


def _strip_escaped_braces(tex: str) -> str:
    return tex.replace(r"\{", "").replace(r"\}", "")


def test_latex_is_well_formed(synthetic):
    tex = (synthetic / "table.tex").read_text()
    body = _strip_escaped_braces(tex)
    assert body.count("{") == body.count("}")
    assert tex.count(r"\toprule") == 1 and tex.count(r"\bottomrule") == 1
    assert tex.count(r"\midrule") == 2  # one per block
    assert r"anchor+anchor\_emb" in tex and r"-33.3\%" in tex and r"0-shot avg (\%)" in tex
    assert r"\textbf{9.030 $\pm$ 0.014 (n=2)}" in tex
    assert r"\underline{9.070 $\pm$ 0.020 (n=3)}" in tex
    for line in tex.splitlines()[1:]:  # below the comment line: every special character escaped
        bare = line
        for escaped in (r"$\pm$", r"$\Delta$", r"\_", r"\%", r"\&", r"\#", r"\$"):
            bare = bare.replace(escaped, "")
        assert not re.search(r"[_%#$]", bare), line
        assert bare.count("&") == len(re.findall(r"(?<!\\)&", line)), line
    assert r"\begin{tabular}" in tex and r"\end{tabular}" in tex
    rows = [line for line in tex.splitlines() if line.endswith(r"\\")]
    widths = {len(re.split(r"(?<!\\)&", line)) for line in rows}
    assert len(widths) == 1  # every row has as many cells as the header


def test_latex_escape_every_special():
    assert latex_escape(r"a_b%c&d#e$f{g}h~i^j\k") == (
        r"a\_b\%c\&d\#e\$f\{g\}h\textasciitilde{}i\textasciicircum{}j\textbackslash{}k"
    )
    assert latex_escape("1.0 ± 0.1") == r"1.0 $\pm$ 0.1"


def test_stat_sample_std():
    stat = Stat((1.0, 2.0, 4.0))
    assert stat.std == pytest.approx(statistics.stdev([1.0, 2.0, 4.0]))  # ddof=1
    assert Stat((3.0,)).text(2) == "3.00 (n=1)"


def test_failed_and_unfinished_runs_are_listed_not_averaged(synthetic):
    report = (synthetic / "report.md").read_text()
    failed = report.split("### Failed runs: 1", 1)[1].split("###", 1)[0]
    assert "failed-run" in failed and "RuntimeError: loss is nan" in failed
    assert "unfinished-run" in report.split("### Unfinished runs", 1)[1].split("###", 1)[0]
    killed = report.split("### Killed runs", 1)[1]
    assert "pruned-run" in killed and "TrialPruned" in killed
    assert "sweep:synthetic" not in report  # the parent run is not a cell
    runs = pd.read_csv(synthetic / "runs.csv")
    assert sorted(runs.status.unique()) == ["FAILED", "FINISHED", "KILLED", "RUNNING"]


def _assert_image(path: Path) -> None:
    assert path.exists(), path
    assert path.stat().st_size > 1024
    assert path.read_bytes()[:8] == PNG_MAGIC
    assert path.with_suffix(".svg").stat().st_size > 1024


def test_plots_exist(synthetic):
    for name in ("ranking", "ppl_vs_params", "buffer_slots", "train_loss"):  # two blocks: PPL vs parameters too
        _assert_image(synthetic / "figures" / f"{name}.png")
    report = (synthetic / "report.md").read_text()
    assert "](figures/buffer_slots.png)" in report and "](figures/ppl_vs_params.png)" in report
    assert report.index("](figures/ranking.png)") < report.index("](figures/ppl_vs_params.png)")


def test_a_one_block_grid_of_schemes_gets_the_ranking_not_ppl_vs_params(tmp_path_factory):
    """The main job's shape: vanilla at 100% of its parameters, every looped row at 66.7%."""
    root, uri, client, experiment_id = _store(tmp_path_factory, "oneblock")
    for scheme, layout, pct, ppls in [
        ("vanilla", "6", 100.0, [90.0, 92.0]),
        ("base", "1+2R2+1", 66.67, [96.0, 97.0]),
        ("anchor_emb", "1+2R2+1", 66.67, [82.0, 81.0]),
        ("mesh", "1+2R2+1", 67.33, [83.0, 84.0]),  # MeSH's routers: 67.3% of vanilla in the main job
    ]:
        for seed, ppl in enumerate(ppls):
            tags = {"preset": "tiny", "scheme": scheme, "layout": layout, "seed": str(seed), "buffer_slots": ""}
            tags["config_hash"] = f"{scheme}-{seed}"
            params = {"model": "tiny", "scheme": scheme, "seed": seed, "data.corpus": "pile"}
            metrics = {"val/pile/loss": math.log(ppl), "val/pile/ppl": ppl, "val_loss": math.log(ppl)}
            metrics |= {"params_pct_of_vanilla": pct, "train/loss": [(s, 6.0 - s / 100) for s in (10, 20, 30)]}
            _log(client, experiment_id, tags, params, metrics, name=f"{scheme}-s{seed}")
    out = root / "out"
    assert main(["oneblock", "--tracking-uri", uri, "--out", str(out)]) == 0
    _assert_image(out / "figures" / "ranking.png")
    assert not (out / "figures" / "ppl_vs_params.png").exists()
    report = (out / "report.md").read_text()
    assert "](figures/ranking.png)" in report and "ppl_vs_params" not in report


def test_cli_errors(tmp_path, synthetic, capsys):
    assert main(["nope", "--runs-dir", str(tmp_path)]) == 2
    assert "no MLflow store" in capsys.readouterr().err
    uri = f"sqlite:///{synthetic.parent / 'mlflow.db'}"
    assert main(["nope", "--tracking-uri", uri, "--out", str(tmp_path / "x")]) == 2
    assert "known: synthetic" in capsys.readouterr().err
    assert not (tmp_path / "x").exists()  # a refused report leaves no folder behind
    assert main(["synthetic", "--tracking-uri", uri, "--out", str(tmp_path / "x"), "--metric", "val/x/loss"]) == 2
    assert "val/pile/loss" in capsys.readouterr().err
    filtered = tmp_path / "tiny"
    assert main(["--filter", "tags.preset = 'tiny'", "--tracking-uri", uri, "--out", str(filtered)]) == 0
    table = pd.read_csv(filtered / "table.csv")
    assert list(table.preset) == ["tiny"]


def test_a_runs_dir_on_the_command_line_beats_the_environment(tmp_path, synthetic, capsys, monkeypatch):
    """The grid's printed ``results:`` command names its store with --runs-dir: it reads that store
    even when $MLFLOW_TRACKING_URI points elsewhere; without --runs-dir the environment decides."""
    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{tmp_path / 'elsewhere' / 'mlflow.db'}")
    assert main(["synthetic", "--runs-dir", str(synthetic.parent), "--out", str(tmp_path / "out")]) == 0
    assert (tmp_path / "out" / "table.csv").exists()
    capsys.readouterr()
    assert main(["synthetic", "--out", str(tmp_path / "other")]) == 2
    assert f"no MLflow store at {tmp_path / 'elsewhere' / 'mlflow.db'}" in capsys.readouterr().err


def test_a_grid_with_no_finished_run_yet_gets_no_report(tmp_path_factory, tmp_path, capsys):
    """A grid that has only started (its runs running or failed) is refused in one line that
    counts them, and writes no folder: an empty report would read as a result."""
    _, uri, client, experiment_id = _store(tmp_path_factory, "started")
    tags = {"preset": "tiny", "scheme": "base", "layout": "1+2R2+1", "compute_depth": "6"}
    _log(client, experiment_id, tags, {"seed": 0}, {"val_loss": 4.0}, status="RUNNING")
    _log(client, experiment_id, tags, {"seed": 1}, {}, status="FAILED")
    out = tmp_path / "started"
    assert main(["started", "--tracking-uri", uri, "--out", str(out)]) == 2
    err = capsys.readouterr().err.strip()
    assert err == "error: no finished run in started yet (1 running, 1 failed); a report needs one", err
    assert not out.exists()


def test_a_report_over_two_grids_lands_beside_each_grids_own_report(tmp_path_factory, tmp_path, capsys):
    """Each grid's parent run keeps its own report (note and ``report/``); a report over both
    goes under ``reports/<label>/`` of each parent and changes neither note."""
    root, uri, client, _ = _store(tmp_path_factory, "grid_a")
    parents = {}
    for experiment, seeds_ppl in (("grid_a", (50.0, 51.0)), ("grid_b", (40.0, 41.0))):
        experiment_id = client.get_experiment_by_name(experiment)
        experiment_id = experiment_id.experiment_id if experiment_id else client.create_experiment(experiment)
        parents[experiment] = _log(client, experiment_id, {"kind": "sweep", "sweep": experiment}, {}, {})
        for seed, ppl in enumerate(seeds_ppl):
            tags = {"scheme": "base", "layout": "1+2R2+1", "preset": "tiny", "seed": str(seed), "buffer_slots": ""}
            tags.update(
                {"config_hash": f"{experiment}{seed}", "git_commit": "abc", "mlflow.parentRunId": parents[experiment]}
            )
            params = {"model": "tiny", "scheme": "base", "seed": seed, "data.corpus": "pile", "max_steps": 200}
            _log(
                client,
                experiment_id,
                tags,
                params,
                _cell_metrics("base", "tiny", ppl, None),
                name=f"{experiment}-s{seed}",
            )
    for experiment in parents:
        assert main([experiment, "--tracking-uri", uri, "--out", str(tmp_path / experiment)]) == 0
    capsys.readouterr()
    notes = {e: client.get_run(run).data.tags["mlflow.note.content"] for e, run in parents.items()}
    assert all(f"mesh-results {e}`" in note for e, note in notes.items())
    assert main(["grid_a,grid_b", "--tracking-uri", uri, "--out", str(tmp_path / "both")]) == 0
    assert (
        "the report is in the artifacts of the sweeps' parent runs, reports/grid_a-grid_b/" in capsys.readouterr().out
    )
    for experiment, run in parents.items():
        assert client.get_run(run).data.tags["mlflow.note.content"] == notes[experiment]  # its own, still
        own = {a.path for a in client.list_artifacts(run, "report")}
        shared = {a.path for a in client.list_artifacts(run, "reports/grid_a-grid_b")}
        assert "report/report.md" in own and "reports/grid_a-grid_b/report.md" in shared
        own_table = Path(client.download_artifacts(run, "report/table.md", str(tmp_path / f"dl-{experiment}")))
        assert own_table.read_text() == (tmp_path / experiment / "table.md").read_text()


# ---------------------------------------------------------------- a real sweep


@pytest.fixture(scope="module")
def trained(tmp_path_factory, grid_cell_overrides):
    """Two schemes x two seeds (the session's single tiny run cannot give a mean and a spread)."""
    from sweeps.sweep import run_sweep

    runs = tmp_path_factory.mktemp("trained")
    assert run_sweep("schemes", ["scheme=base,mesh", "seeds=2", *grid_cell_overrides(f"runs_dir={runs}")]) == 0
    out = runs / "results"
    assert main(["schemes", "--runs-dir", str(runs), "--out", str(out)]) == 0
    return runs, out


@pytest.mark.slow
def test_real_sweep_tables_match_mlflow(trained):
    runs, out = trained
    client = mlflow.MlflowClient(f"sqlite:///{runs / 'mlflow.db'}")
    experiment = client.get_experiment_by_name("schemes")
    logged: dict[str, list[float]] = {}
    for run in client.search_runs([experiment.experiment_id], "tags.seed IS NOT NULL"):  # not the parent
        logged.setdefault(run.data.tags["scheme"], []).append(run.data.metrics["val/shakespeare/ppl"])
    table = pd.read_csv(out / "table.csv")
    assert sorted(table.scheme) == sorted(logged) == ["base", "mesh"]
    for scheme, values in logged.items():
        row = table[table.scheme == scheme].iloc[0]
        assert row["n_runs"] == 2 and row["seeds"] == "0 1"
        assert row["val/shakespeare/ppl_mean"] == pytest.approx(statistics.fmean(values))
        assert row["val/shakespeare/ppl_std"] == pytest.approx(statistics.stdev(values))
    report = (out / "report.md").read_text()
    assert "**Commit**" in report and "`tiny`" in report
    _assert_image(out / "figures" / "train_loss.png")
    probes = out / "figures" / "probes" / "tiny_compute_depth_6"
    for kind in ("updates", "cka_rbf", "cka_linear", "spectra"):
        _assert_image(probes / f"probe_compare_{kind}.png")
    assert "core balance" in (out / "probes.md").read_text()


UPDATE_MEANS = [
    *(f"probe/update/{block}/mean" for block in ("prelude", "core1", "core2", "coda")),
    *(f"probe/state_update/{block}/mean" for block in ("core1", "core2")),
]


def _final_tables(runs: Path) -> dict[str, list[dict[str, float]]]:
    """scheme -> the ``probes/final/probes.csv`` of each of its runs in the ``trained`` store, read
    from its run dir; each run is one of today's, which logs no per-block value to MLflow."""
    client = mlflow.MlflowClient(f"sqlite:///{runs / 'mlflow.db'}")
    experiment = client.get_experiment_by_name("schemes")
    tables: dict[str, list[dict[str, float]]] = {}
    for run in client.search_runs([experiment.experiment_id], "tags.seed IS NOT NULL"):  # not the parent
        assert not set(UPDATE_MEANS) & set(run.data.metrics) and "probe/update/core_balance" in run.data.metrics
        table = read_probe_table(Path(run.data.tags["run_dir"]) / "probes" / "final" / "probes.csv")
        tables.setdefault(run.data.tags["scheme"], []).append(table)
    return tables


def _assert_probe_table_reads(probes: pd.DataFrame, tables: dict[str, list[dict[str, float]]]) -> None:
    """Each row's per-block update means (and loop erank) are the means of its runs' table values."""
    assert sorted(probes.scheme) == sorted(tables) == ["base", "mesh"]
    for scheme, runs in tables.items():
        row = probes[probes.scheme == scheme].iloc[0]
        for metric in [*UPDATE_MEANS, "probe/erank/loop_mean"]:
            assert row[f"{metric}_n"] == 2, metric
            assert row[f"{metric}_mean"] == pytest.approx(statistics.fmean(t[metric] for t in runs), rel=1e-12)


@pytest.mark.slow
def test_the_probe_table_reads_each_runs_update_means_from_its_probes_csv(trained):
    runs, out = trained
    _assert_probe_table_reads(pd.read_csv(out / "probes.csv"), _final_tables(runs))


@pytest.mark.slow
def test_the_probe_table_reads_the_probes_csv_artifacts_when_the_run_dirs_are_gone(trained, tmp_path):
    """Runs read on another machine than the one that trained them (or whose folders were moved):
    the tables come from the store's artifacts."""
    runs, _ = trained
    tables = _final_tables(runs)
    client = mlflow.MlflowClient(f"sqlite:///{runs / 'mlflow.db'}")
    folders = [Path(run_dir) for run_dir in collect_runs(client, ["schemes"])["run_dir"]]
    assert len(folders) == 4 and all((folder / "probes").is_dir() for folder in folders)
    try:
        for folder in folders:
            folder.rename(tmp_path / folder.name)
        probes = to_frame(probe_table(aggregate(collect_runs(client, ["schemes"]))))
    finally:
        for folder in folders:
            (tmp_path / folder.name).rename(folder)
    _assert_probe_table_reads(probes, tables)


@pytest.mark.slow
def test_the_routing_section_reads_every_validation_of_every_looped_run(trained):
    runs, out = trained
    client = mlflow.MlflowClient(f"sqlite:///{runs / 'mlflow.db'}")
    frame = pd.read_csv(out / "routing.csv")
    assert set(frame.scheme) == {"base", "mesh"} and sorted(frame.step.unique()) == [3, 6]
    base = frame[(frame.scheme == "base") & (frame.metric == "routing/coef/coda/f2/mean")]
    assert len(base) == 4 and (base.value == 1.0).all()  # 2 seeds x 2 validations, base's coda input is f_K
    mesh = frame[frame.scheme == "mesh"]
    assert {"routing/transition/read/entropy", "routing/loop2/read/entropy", "routing/coef/coda/h_emb/mean"} <= set(
        mesh.metric
    )
    for run_id, group in mesh[mesh.metric == "routing/loop2/read/entropy"].groupby("run_id"):
        logged = client.get_metric_history(run_id, "routing/loop2/read/entropy")
        assert sorted((m.step, m.value) for m in logged) == sorted(zip(group.step, group.value, strict=True))
    _assert_image(out / "figures" / "routing_coefficients.png")
    (row_figure,) = (out / "figures").glob("routing_mesh*.png")
    _assert_image(row_figure)
    report = (out / "report.md").read_text()
    assert "## Routing" in report and "## Appendix: the routing table" in report
    appendix = report.split("## Appendix: the routing table")[1]
    base_line = next(line for line in appendix.splitlines() if line.startswith("| base"))
    assert "| 1.000 ± 0.000 |" in base_line  # f2 in base's coda input, every seed


# ---------------------------------------------------------------- mixture of experts

# (preset, scheme, layout, PPL per seed); the MoE rows log their active parameters and routing.
MOE_ROWS = [
    ("tiny", "base", "1+2R2+1", [50.0, 51.0]),
    ("tiny-moe", "vanilla", "6", [45.0, 46.0]),
    ("tiny-moe", "base", "1+2R2+1", [49.0, 50.0]),
    ("tiny-moe", "mesh", "1+2R2+1", [47.0, 47.5]),
]
MOE_NON_EMB = {"tiny": 200_064, ("tiny-moe", "6"): 900_224, ("tiny-moe", "1+2R2+1"): 600_192}
MOE_ACTIVE = {("tiny-moe", "6"): 303_488, ("tiny-moe", "1+2R2+1"): 202_368}


@pytest.fixture(scope="module")
def moe_results(tmp_path_factory):
    """A store of MOE_ROWS: a dense tiny row and tiny-moe's vanilla, base and MeSH, two seeds each."""
    root, uri, client, experiment_id = _store(tmp_path_factory, "moe")
    for preset, scheme, layout, ppls in MOE_ROWS:
        for seed, ppl in enumerate(ppls):
            tags = {"preset": preset, "scheme": scheme, "layout": layout, "seed": str(seed), "buffer_slots": ""}
            tags["config_hash"] = f"{preset}-{scheme}-{seed}"
            params = {"model": preset, "scheme": scheme, "seed": seed, "data.corpus": "pile"}
            moe = preset == "tiny-moe"
            metrics = {
                "val/pile/loss": math.log(ppl),
                "val/pile/ppl": ppl,
                "val_loss": math.log(ppl),
                "params_non_embedding": MOE_NON_EMB[(preset, layout)] if moe else MOE_NON_EMB[preset],
                "params_pct_of_vanilla": 100.0 if scheme == "vanilla" else 66.67,
            }
            if moe:
                metrics["params_active_non_embedding"] = MOE_ACTIVE[(preset, layout)]
                metrics["probe/moe_load_cv/mean"] = 0.1 + seed / 100
                metrics["probe/moe_entropy/mean"] = 2.0
                metrics["probe/moe_jaccard/chance"] = 5 / 28
                calls = [f"prelude.{i}" for i in range(6)]
                if scheme != "vanilla":
                    calls = ["prelude.0", *(f"cores.0.{c}/iter{t}" for c in (0, 1) for t in (1, 2)), "coda.0"]
                    jaccard = 0.9 if scheme == "base" else 0.5 + seed / 10
                    metrics.update({f"probe/moe_jaccard/cores.0.{c}/iter1/iter2": jaccard for c in (0, 1)})
                    metrics["probe/moe_jaccard/loop_mean"] = jaccard
                for call in calls:
                    metrics[f"probe/moe_load_cv/{call}"] = 0.1
                    metrics[f"probe/moe_entropy/{call}"] = 2.0
            _log(client, experiment_id, tags, params, metrics, name=f"{preset}-{scheme}-s{seed}")
    out = root / "out"
    assert main(["moe", "--tracking-uri", uri, "--out", str(out)]) == 0
    return out


def test_tables_show_total_and_active_parameters_of_moe_rows_in_their_own_blocks(moe_results):
    table = pd.read_csv(moe_results / "table.csv")
    assert sorted(set(table.block)) == ["tiny, compute depth 6", "tiny-moe, compute depth 6"]
    for preset, scheme, layout, _ in MOE_ROWS:
        (row,) = table[(table.preset == preset) & (table.scheme == scheme)].itertuples()
        moe = preset == "tiny-moe"
        assert row.params_non_embedding == (MOE_NON_EMB[(preset, layout)] if moe else MOE_NON_EMB[preset])
        # a dense row's every parameter is active
        assert row.params_active_non_embedding == (MOE_ACTIVE[(preset, layout)] if moe else MOE_NON_EMB[preset])
    markdown = (moe_results / "table.md").read_text()
    assert "| non-emb params | active non-emb params |" in markdown and "600,192 | 202,368 |" in markdown
    assert "what one token applies" in markdown
    probes = (moe_results / "probes.md").read_text()
    assert "expert load CV" in probes and "Jaccard t,t+1" in probes and "Jaccard chance" in probes
    assert "ΔJaccard vs base (95% CI)" in probes
    figure = next(moe_results.rglob("probe_compare_routing.png"))
    assert figure.parent.name == "tiny-moe_compute_depth_6" and figure.stat().st_size > 1024
    report = (moe_results / "report.md").read_text()
    assert f"]({figure.relative_to(moe_results).as_posix()})" in report  # the report shows it
    # The paper's ordering claims are tested in the MoE block as in any other.
    claims = (moe_results / "claims.md").read_text()
    verdict = "| `mesh_below_base` | tiny-moe, compute depth 6 | `mesh 1+2R2+1` vs `base 1+2R2+1` | `val/pile/ppl` |"
    assert f"{verdict} inconclusive, leans the paper's way (n=2, fragile) |" in claims  # two seeds each
    assert "> **Fewer than 3 seeds**" in claims


def test_the_routing_figure_draws_each_moe_row_in_its_schemes_colour_in_the_order_calls_run():
    from matplotlib.colors import to_hex

    from experiments.probing.routing_figures import routing_comparison_figure
    from results.render.plots import routing_series
    from results.rows.aggregate import Row

    def row(scheme: str, layout: str, calls: list[str], jaccard: float | None) -> Row:
        stats = {f"probe/moe_entropy/{c}": Stat((float(i), float(i) + 0.2), ("0", "1")) for i, c in enumerate(calls)}
        stats["probe/moe_entropy/mean"] = Stat((9.0, 9.0), ("0", "1"))  # a summary, not a call
        if jaccard is not None:
            stats["probe/moe_jaccard/cores.0.0/iter1/iter2"] = Stat((jaccard, jaccard), ("0", "1"))
        return Row("tiny-moe", scheme, layout, "", "", [f"{scheme}-0", f"{scheme}-1"], ["0", "1"], stats)

    looped = ["coda.0", "cores.0.1/iter2", "cores.0.0/iter2", "cores.0.1/iter1", "cores.0.0/iter1", "prelude.0"]
    rows = [row("vanilla", "6", [f"prelude.{i}" for i in range(6)], None), row("mesh", "1+2R2+1", looped, 0.4)]
    series = {r.label: routing_series(r) for r in rows}
    assert set(series["vanilla 6"]) == {"entropy"} and set(series["mesh 1+2R2+1"]) == {"entropy", "jaccard"}
    fig = routing_comparison_figure(series, {r.label: r.scheme for r in rows}, chance=5 / 28)
    entropy, jaccard = fig.axes
    lines = {container.get_label(): container.lines[0] for container in entropy.containers}  # errorbar: data line
    assert {label: to_hex(line.get_color()) for label, line in lines.items()} == {
        "vanilla 6": scheme_color("vanilla"),
        "mesh 1+2R2+1": scheme_color("mesh"),
    }
    # mesh's calls in the order they run: prelude.0, cores iteration 1, cores iteration 2, coda.0
    order = ["prelude.0", "cores.0.0/iter1", "cores.0.1/iter1", "cores.0.0/iter2", "cores.0.1/iter2", "coda.0"]
    assert list(lines["mesh 1+2R2+1"].get_ydata()) == pytest.approx([looped.index(c) + 0.1 for c in order])
    (bar,) = jaccard.patches
    assert to_hex(bar.get_facecolor()) == scheme_color("mesh") and bar.get_height() == pytest.approx(0.4)


def test_a_report_from_the_store_is_rebuilt_from_its_folder_byte_for_byte(synthetic):
    """mesh-results writes the data beside the report (runs.csv with the params it reads, curves,
    train loss, report.json); rebuilding the folder from them alone (make reports) gives every file
    back with the same bytes: one pipeline, written whole, nothing patched."""
    from results.commands.reports import check_folder

    assert {"report.json", "runs.csv", "train_loss.csv"} <= {p.name for p in synthetic.iterdir()}
    assert check_folder(synthetic) == []
