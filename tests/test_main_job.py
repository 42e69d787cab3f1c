"""The main job (`make demo`, docs/demo.md), on a reduced number of steps: runs, table and report."""

from __future__ import annotations

import re
import shlex
import statistics
import sys
import tempfile
from pathlib import Path

import mlflow
import pandas as pd
import pytest

from results.commands.mesh_demo import run_main_job
from results.verdicts.schema import load_claims
from sweeps.status import find_grid


def unescape(markdown: str) -> str:
    return re.sub(r"\\(.)", r"\1", markdown)


SCHEMES = ["vanilla", "base", "residual", "anchor", "anchor_emb", "mesh"]


@pytest.mark.slow
def test_main_job_runs_the_schemes_grid_and_writes_table_and_report(tmp_path, capsys, grid_cell_overrides, monkeypatch):
    out = tmp_path / "report"
    # One store: the runs go where $MLFLOW_TRACKING_URI says, and the report reads them back from there.
    store = f"sqlite:///{tmp_path / 'elsewhere' / 'tracking.db'}"
    (tmp_path / "elsewhere").mkdir()
    monkeypatch.setenv("MLFLOW_TRACKING_URI", store)
    # run_main_job sets max_steps, val_every and checkpoint_every from `steps`; the rest is a grid cell's.
    extra = [o for o in grid_cell_overrides() if o.split("=")[0] not in ("max_steps", "val_every", "checkpoint_every")]
    assert run_main_job(steps=4, seeds=2, runs_dir=str(tmp_path / "runs"), out=str(out), extra=extra) == 0
    printed = capsys.readouterr().out

    assert not (tmp_path / "runs" / "mlflow.db").exists()
    client = mlflow.MlflowClient(store)
    experiment = client.get_experiment_by_name("schemes")
    runs = client.search_runs([experiment.experiment_id])
    children = [r for r in runs if r.data.tags.get("kind") != "sweep"]
    (parent,) = [r for r in runs if r.data.tags.get("kind") == "sweep"]
    assert len(children) == 12 and all(r.info.status == "FINISHED" for r in children)
    assert sorted({r.data.tags["scheme"] for r in children}) == sorted(SCHEMES)
    logged: dict[str, list[float]] = {}
    for run in children:
        logged.setdefault(run.data.tags["scheme"], []).append(run.data.metrics["val/shakespeare/ppl"])

    # table.csv: one row per scheme, the mean and spread of its two seeds as logged.
    table = pd.read_csv(out / "table.csv")
    assert sorted(table.scheme) == sorted(SCHEMES) and list(table.n_runs) == [2] * 6
    for scheme, values in logged.items():
        row = table[table.scheme == scheme].iloc[0]
        assert row["val/shakespeare/ppl_mean"] == pytest.approx(statistics.fmean(values))
        assert row["val/shakespeare/ppl_std"] == pytest.approx(statistics.stdev(values))
    # table.md: a row per scheme whose perplexity cell is the mean ± std of its two seeds (n=2).
    markdown = (out / "table.md").read_text()
    lines = [line for line in markdown.splitlines() if line.startswith("|")]
    header = [c.strip() for c in lines[0].strip("|").split("|")]
    rows = {}
    for line in lines[2:]:
        cells = dict(zip(header, (c.strip() for c in line.strip("|").split("|")), strict=True))
        rows[cells["scheme"].replace("\\", "")] = (line, cells["PPL (shakespeare)"])
    assert sorted(rows) == sorted(SCHEMES)
    for scheme, (_, cell) in rows.items():
        numbers = re.fullmatch(r"(?:\*\*|<u>)?([\d.,]+) ± ([\d.,]+) \(n=2\)(?:\*\*|</u>)?", cell)
        assert numbers, cell
        mean, std = (float(n.replace(",", "")) for n in numbers.groups())
        assert mean == pytest.approx(statistics.fmean(logged[scheme]), abs=0.05)
        assert std == pytest.approx(statistics.stdev(logged[scheme]), abs=0.05)
    # report.md: the store it read, what was run, the table and the figures it links.
    report = (out / "report.md").read_text()
    assert f"* **Store**: `{store}`" in report
    assert "* **Runs**: 12 (12 finished, 0 failed, 0 running, 0 killed)" in report
    assert all(f"`{s}`" in report for s in SCHEMES)
    assert "](figures/train_loss.png)" in report and (out / "figures" / "train_loss.png").stat().st_size > 1024
    assert all(line in report for line, _ in rows.values())  # the table is in the report
    assert r"\begin{tabular}" in (out / "table.tex").read_text()
    # claims.md: every claim the schemes grid can test is tested (at 4 steps the verdicts may be
    # anything); B = K + 3 cannot be, with one B only, nor the MoE claim, with no mixture of experts.
    # The report links it.
    claims = (out / "claims.md").read_text()
    verdicts: dict[str, set[str]] = {}
    summary = claims.split("## Summary\n\n", 1)[1].split("\n\n", 1)[0].splitlines()
    verdict_column = [c.strip() for c in summary[0].strip("|").split("|")].index("verdict")
    for line in summary[2:]:
        cells = [c.strip() for c in line.strip("|").split("|")]
        verdicts.setdefault(cells[0].strip("`"), set()).add(cells[verdict_column].split(",")[0].split(" (")[0])
    tested = {"holds", "equivalent", "inconclusive", "contradicted"}
    untestable = ("buffer_k_plus_3_best", "moe_mesh_short_of_vanilla")  # one B; no mixture of experts
    assert all(verdicts[claim] == {"not tested"} for claim in untestable)
    for claim in (c.id for c in load_claims().claims if c.id not in untestable):
        assert verdicts.get(claim) and verdicts[claim] <= tested, (claim, verdicts.get(claim))
    assert "[claims.md](claims.md)" in report
    # The sweep's parent run carries the report: its description (MLflow's run note) starts with the
    # ranking, then the claims' verdicts and the results table; the report folder is among its artifacts.
    # The parent's description, report.md and claims.md open with this grid's answer (its ranking in words,
    # its n, fragile at n = 2), then the decided result named as another regime's, then this regime; then the
    # ranking. No line quotes another regime's phase as this one's.
    note = client.get_run(parent.info.run_id).data.tags["mlflow.note.content"]
    means = {s: statistics.fmean(v) for s, v in logged.items()}
    order = sorted(means, key=means.__getitem__)
    answer, decided, regime = (line.removeprefix("> ") for line in note.split("\n\n")[0].split("\n>\n"))
    assert answer.startswith(
        r"What these runs show (tiny, compute depth 6; validation PPL (shakespeare), lower is better; n = 2 seeds per row): "
    )
    listed = answer.split("): ", 1)[1].split(". Every test", 1)[0]
    named = [unescape(item.split()[0]) for item in listed.split(", ")]
    assert named == order and answer.count("(first)") == answer.count("(last)") == 1
    assert "Every test here is fragile at n = 2" in answer
    assert decided.startswith("The decided result is another regime's, not these runs': the one-pass reproduction (")
    assert "docs corpus" in decided and "ended rank" in decided
    assert regime.startswith("Regime: 6 schemes x 2 seeds (under 3 seeds every test is fragile), 4 steps each")
    assert client.get_run(parent.info.run_id).data.tags["mesh.context"] == "\n".join(map(unescape, (decided, regime)))
    assert "\n\n**tiny, compute depth 6**: validation PPL (shakespeare), lower is better" in note
    assert report.split("\n## ", 2)[1].startswith("Ranking\n")  # and so does the report, after the same quote
    quote = note.split("\n\n")[0]
    assert report.split("\n## ", 1)[0].split("\n\n")[-1].strip() == quote
    assert (out / "claims.md").read_text().split("\n\n")[2].strip() == quote
    assert all(line in note for line, _ in rows.values())
    assert not any("early phase" in text for text in (note, report, claims, printed))
    claims_summary = claims.split("## Summary\n\n", 1)[1].split("\n\n", 1)[0]
    assert "### The paper's claims" in note and claims_summary in note
    listed = {a.path for a in client.list_artifacts(parent.info.run_id, "report")}
    assert {"report/report.md", "report/table.md", "report/claims.md", "report/figures"} <= listed
    # What the console shows: first the plan (the grid, its regime: no finding before compute); once the
    # runs are done, the same opening lines as the note (one function wrote both), then the ranking in plain
    # text (no Markdown), where the report is and how to open the store.
    first = printed.splitlines()[:3]
    assert first[0].startswith("mesh-demo: the schemes grid (vanilla, base, residual, anchor, anchor_emb, mesh)")
    assert first[1].startswith("Regime: 6 schemes x 2 seeds (under 3 seeds every test is fragile), 4 steps each")
    assert "one peak LR for every scheme" in first[1]
    opening = [unescape(line) for line in (answer, decided, regime)]
    after = printed.split(opening[0], 1)
    assert len(after) == 2 and after[1].startswith("\n" + "\n".join(opening[1:]) + "\n\n")
    ranking = printed.split("tiny, compute depth 6: validation PPL (shakespeare), lower is better\n\n", 1)[1]
    ranked = [line.split()[1] for line in ranking.splitlines()[1:7]]
    assert ranked == order
    assert "`" not in ranking.split("\n\n")[0] and "**" not in printed and "<u>" not in printed
    assert printed.count("MLflow:") == 1
    assert f"{out / 'report.md'}" in printed and f"ui --backend-store-uri {store}" in printed
    page = f"http://127.0.0.1:5000/#/experiments/{experiment.experiment_id}/runs?workflowType=machine_learning&compareRunsMode=CHART&viewStateShareKey=mesh-grouped"
    # every command and URL on its own line, nothing glued to it (a comma once named a new store `mlflow.db,`)
    command = f"{Path(sys.executable).parent / 'mlflow'} ui --backend-store-uri {store}"
    assert f"MLflow:  {command}\n         then open:\n         {page}\n" in printed
    run_page = f"http://127.0.0.1:5000/#/experiments/{experiment.experiment_id}/runs/{parent.info.run_id}"
    assert f"Parent:  {run_page}?workflowType=machine_learning\n" in printed  # not GenAI mode
    # It ends with the grid's --status command, which finds the grid from its store as printed.
    (status_line,) = [line for line in printed.splitlines() if line.startswith("Status:  ")]
    status_args = shlex.split(status_line.removeprefix("Status:  "))
    assert status_args[1] == "schemes" and status_args[-1] == "--status"
    assert find_grid("schemes", status_args[2:-1]).key.startswith("schemes-")
    assert "Seeds:   mesh-demo --seeds 3 adds seed 2 to every scheme" in printed
    # mesh-results on the demo's store (from $MLFLOW_TRACKING_URI, as the runs went), the documented next
    # step, keeps the grid's context: the parent's note, report.md and the report/ artifacts open as before.
    from results.commands.mesh_results import main as mesh_results

    again = tmp_path / "again"
    assert mesh_results(["schemes", "--out", str(again)]) == 0
    assert capsys.readouterr().out.startswith("\n".join(opening) + "\n\n")  # its terminal opens as the demo's
    quote = note.split("\n\n")[0]
    assert client.get_run(parent.info.run_id).data.tags["mlflow.note.content"].split("\n\n")[0] == quote
    assert quote in (again / "report.md").read_text() and quote in (again / "claims.md").read_text()
    logged_report = client.download_artifacts(parent.info.run_id, "report/report.md", str(tmp_path / "artifacts"))
    assert quote in Path(logged_report).read_text()


@pytest.mark.slow
def test_the_throughput_benchmark_reads_its_runs_from_the_store_they_went_to(
    tmp_path, capsys, grid_cell_overrides, monkeypatch
):
    """With $MLFLOW_TRACKING_URI set, benchmarks/grid_throughput.py once trained into that store and read
    an empty sqlite file ('NoneType' object has no attribute 'experiment_id')."""
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
    import grid_throughput

    elsewhere = tmp_path / "elsewhere.db"
    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{elsewhere}")
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    cell = [o for o in grid_cell_overrides() if o.split("=")[0] not in ("max_steps", "val_every", "checkpoint_every")]
    # two of the grid's six schemes: what is checked is where the runs go and are read from
    assert grid_throughput.main(["--steps", "2", "--seeds", "1", "--pairs", "1", *cell, "scheme=base,mesh"]) == 0
    printed = capsys.readouterr().out
    assert "schemes grid, 2 cells x 2 steps" in printed
    assert "final train loss, largest relative gap: " in printed
    assert not elsewhere.exists()  # every run went to, and was read from, the grid's own fresh store
