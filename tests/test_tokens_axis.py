"""The tokens a run has trained on, logged beside every curve (the metric ``tokens``) so the UI can
draw the curves over tokens: its value at each logged step, read back from a real sqlite store, once
per step, and none logged twice after a resume (the resumed run's own histories are compared whole
in tests/test_faults_run.py, ``tokens`` among them)."""

from __future__ import annotations

import mlflow

from experiments.store.sqlite import isolated_tracking_uri
from experiments.store.views import TOKENS_METRIC
from experiments.trainer import ResumedMLFlowLogger


def history(client, run_id: str, key: str) -> list[tuple[int, float]]:
    return [(m.step, m.value) for m in sorted(client.get_metric_history(run_id, key), key=lambda m: m.step)]


def test_a_run_logs_the_tokens_it_trained_on_at_every_step_it_logs_a_curve(tiny_run):
    """The tiny run (10 steps of 8 x 64 tokens, training logged every 5th step at Lightning's 0-based
    step, validated and its routing read after 5 and 10 steps): the tokens the model had trained on
    when each value was measured, step x 512, at exactly the steps something else was logged."""
    client, run_id = tiny_run.client, tiny_run.run_id
    metrics = client.get_run(run_id).data.metrics
    per_step = metrics["tokens_per_step"]
    assert per_step == 8 * 64
    curves = ["train/loss", "lr", "val/shakespeare/ppl", *(k for k in metrics if k.startswith("routing/"))]
    steps = sorted({step for key in curves for step, _ in history(client, run_id, key)})
    assert steps == [4, 5, 9, 10]
    assert history(client, run_id, TOKENS_METRIC) == [(s, s * per_step) for s in steps]  # each step once


def test_the_logger_adds_the_tokens_to_every_step_and_logs_no_step_of_a_metric_twice(tmp_path):
    """A run resumed after step 9 was logged: the redone step 9 is left out, a validation and the
    next training log at the same step 10 log the tokens there once, and a later step goes on."""
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    client = mlflow.MlflowClient(uri)
    run_id = client.create_run(client.create_experiment("tokens")).info.run_id
    client.log_metric(run_id, "train/loss", 2.0, step=9)
    client.log_metric(run_id, TOKENS_METRIC, 900.0, step=9)
    with isolated_tracking_uri():  # Lightning's MLFlowLogger sets the process's tracking URI, as train() undoes
        logger = ResumedMLFlowLogger(
            tracking_uri=uri, run_id=run_id, last_logged_steps={"train/loss": 9, TOKENS_METRIC: 9}, tokens_per_step=100
        )
        logger.log_metrics({"train/loss": 2.0}, step=9)  # redone after the resume
        logger.log_metrics({"val/shakespeare/ppl": 50.0}, step=10)  # after 10 steps
        logger.log_metrics({"train/loss": 1.5}, step=10)  # the 11th step, at Lightning's step 10
        logger.log_metrics({"train/loss": 1.0}, step=14)
    assert history(client, run_id, TOKENS_METRIC) == [(9, 900.0), (10, 1000.0), (14, 1400.0)]
    assert history(client, run_id, "train/loss") == [(9, 2.0), (10, 1.5), (14, 1.0)]
    assert history(client, run_id, "val/shakespeare/ppl") == [(10, 50.0)]
