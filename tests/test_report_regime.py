"""report.md's regime line: tokens per parameter with and without embeddings, passes over the data."""

from __future__ import annotations

from test_claims import runs_frame

from results.render.report_md import _regime
from results.rows.aggregate import aggregate
from results.runs.committed import read_runs_csv


def _frame(**metrics: float):
    frame = runs_frame({("tiny", "vanilla", "6", ""): {"ppl": [120.0, 125.0, 130.0]}})
    return frame.assign(params_non_embedding=200_000.0, params_total=500_000.0, **metrics)


def test_tokens_per_parameter_and_passes_from_tokens_planned():
    (line,) = _regime(aggregate(_frame(data_train_tokens=4e6, tokens_planned=2e6)))
    assert "training split 4.00M tokens, seen 2.00M" in line
    assert "10.0 tokens per non-embedding parameter" in line and "4.0 tokens per total parameter" in line
    assert "0.50 passes over the training split" in line and "more than one pass" not in line


def test_more_than_one_pass_is_a_warning_and_the_epoch_counter_a_lower_bound():
    (line,) = _regime(aggregate(_frame(data_train_tokens=1e6, epoch=3.0)))
    assert "seen ≥ 3.00M" in line and "≥ 15.0 tokens per non-embedding parameter" in line
    assert "≥ 3.00 passes" in line and "**more than one pass" in line


def test_the_committed_cpu_runs_state_their_regime():
    frame = read_runs_csv("results/cpu-reproduction/all/runs.csv")
    lines = _regime(aggregate(frame))
    assert [line.split("**")[1] for line in lines] == ["tiny", "tiny-moe"]
    assert all("≥ 3.00 passes" in line and "more than one pass" in line for line in lines)
