"""The README's main job, on a reduced number of steps: runs, table and report."""

from __future__ import annotations

import mlflow

from results.main_job import run_main_job

REDUCED = ["data.seq_len=32", "data.batch_size=4", "data.val_batches=1", "log_every=2"]


def test_main_job_runs_the_schemes_grid_and_writes_table_and_report(tmp_path, capsys):
    out = tmp_path / "report"
    assert run_main_job(steps=4, seeds=2, runs_dir=str(tmp_path / "runs"), out=str(out), extra=REDUCED) == 0
    printed = capsys.readouterr().out

    client = mlflow.MlflowClient(f"sqlite:///{tmp_path / 'runs' / 'mlflow.db'}")
    experiment = client.get_experiment_by_name("schemes")
    runs = client.search_runs([experiment.experiment_id])
    children = [r for r in runs if r.data.tags.get("kind") != "sweep"]
    assert len(children) == 12 and all(r.info.status == "FINISHED" for r in children)
    assert sorted({r.data.tags["scheme"] for r in children}) == sorted(
        ["vanilla", "base", "residual", "anchor", "anchor_emb", "mesh"]
    )

    table = (out / "table.md").read_text()
    for scheme in ("vanilla", "base", "residual", "anchor", "anchor\\_emb", "mesh"):
        assert scheme in table or scheme.replace("\\", "") in table
    assert "(n=2)" in table and "±" in table
    report = (out / "report.md").read_text()
    assert "table" in report.lower() and "figures/" in report
    assert (out / "table.tex").exists() and (out / "table.csv").exists()
    assert table.strip() in printed  # the table is printed
    assert "report.md" in printed and "mlflow ui --backend-store-uri sqlite:///" in printed
