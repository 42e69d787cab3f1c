"""Every path mesh-results prints is absolute, whatever folder it was started in and however
``--out`` was written: read from its output on a real sqlite store."""

from __future__ import annotations

import math
import re

import mlflow

from results.commands.mesh_results import main


def test_mesh_results_prints_absolute_paths_from_a_relative_out(tmp_path, monkeypatch, capsys):
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    client = mlflow.MlflowClient(uri)
    experiment_id = client.create_experiment("paths", artifact_location=(tmp_path / "artifacts").as_uri())
    for scheme, ppl in (("base", 60.0), ("mesh", 55.0)):
        for seed in (0, 1, 2):
            tags = {"scheme": scheme, "layout": "1+2R2+1", "preset": "tiny", "seed": str(seed), "buffer_slots": ""}
            run_id = client.create_run(experiment_id, tags=tags, run_name=f"{scheme}-s{seed}").info.run_id
            for key, value in {"model": "tiny", "scheme": scheme, "seed": seed, "data.corpus": "pile"}.items():
                client.log_param(run_id, key, value)
            value = math.log(ppl + seed * 0.5 + (0.3 if scheme == "mesh" and seed == 1 else 0.0))
            for key, logged in (("val/pile/loss", value), ("val/pile/ppl", math.exp(value)), ("val_loss", value)):
                client.log_metric(run_id, key, logged, step=100)
            client.set_terminated(run_id, "FINISHED")
    monkeypatch.chdir(tmp_path)
    for out in ([], ["--out", "reports/here"]):
        assert main(["paths", "--tracking-uri", uri, *out]) == 0
        printed = capsys.readouterr().out
        folder = tmp_path / ("reports/here" if out else "results/paths")
        assert str(folder / "report.md") in printed and str(folder / "table.md") in printed
        relative = re.findall(r"(?<![\w/.:-])(?:results|reports)/[\w./-]+", printed)
        assert not relative, relative
