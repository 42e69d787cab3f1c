"""What a finished training run's page in the MLflow UI shows first: its description (validation
PPL and training loss at the last step, where the curves and probe values are), the few summary
probe metrics and every probe value as a table artifact, read back from the session's tiny run in
a real sqlite store."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from experiments.probing.files import SUMMARY_METRICS, read_probe_table
from experiments.store.views import NOTE_TAG, finished_run_note


def test_a_finished_run_page_opens_on_its_validation_ppl_and_training_loss(tiny_run):
    run = tiny_run.client.get_run(tiny_run.run_id)
    note = run.data.tags[NOTE_TAG]
    ppl, loss = run.data.metrics["val/shakespeare/ppl"], run.data.metrics["train/loss"]
    first = note.split("\n\n")[0]
    assert first == f"**validation PPL (shakespeare) {ppl:.2f}** · training loss {loss:.4f} · after 10 steps"
    assert "`probes/final/probes.csv`" in note


def test_a_finished_run_keeps_every_probe_value_in_a_table_artifact_and_logs_the_summaries(tiny_run, tmp_path):
    local = Path(tiny_run.client.download_artifacts(tiny_run.run_id, "probes/final/probes.csv", str(tmp_path)))
    table = read_probe_table(local)
    metrics = tiny_run.client.get_run(tiny_run.run_id).data.metrics
    logged = {k: v for k, v in metrics.items() if k.startswith("probe/")}  # 7 of the table's 127
    assert len(table) == 127 and set(logged) == set(SUMMARY_METRICS) & set(table) and len(logged) == 7
    assert all(table[k] == pytest.approx(v) or math.isnan(table[k]) for k, v in logged.items())


def test_the_note_names_the_other_validation_sets_and_leaves_out_a_loss_it_does_not_have():
    result = {"val/pile/ppl": 80.123, "val/kjv/ppl": 120.5, "steps": 400}
    lines = finished_run_note(result, ["pile", "kjv", "cpython"]).split("\n\n")
    assert lines[0] == "**validation PPL (pile) 80.12** · after 400 steps"
    assert lines[1] == "Validation PPL on the other sets: kjv 120.50"
