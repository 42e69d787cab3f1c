"""Validation over training: every logged validation step of every run, and the claims evaluated there.

:func:`read_curves` reads ``val/<set>/loss`` and ``val/<set>/ppl`` at every logged step (one
``get_metric_history`` per run and key) into the long frame written as ``curves.csv``; the tokens
seen at a step are ``step x tokens_per_step`` (the metric every run logs at step 0, see
``experiments/train.py``; empty when a run did not log it). :func:`results_at_step` puts the values
of one step in place of the final ones, so that :func:`results.verdicts.engine.evaluate` tests the claims
there; :func:`claims_over_training` does so at every validation step common to the runs, and
:func:`spans_text` says where along training each verdict held.
"""

from __future__ import annotations

import math

import pandas as pd

from results.rows.aggregate import Results

FILE = "curves.csv"


COLUMNS = ("run_id", "row", "scheme", "seed", "block", "step", "tokens", "metric", "value")


TOKENS_PER_STEP = "tokens_per_step"


def curve_keys(results: Results) -> list[str]:
    """The validation metrics read over training: loss and PPL of every validation set."""
    return [f"val/{s}/{kind}" for s in results.sets for kind in ("loss", "ppl")]


def _tokens_per_step(results: Results) -> dict[str, float]:
    runs = results.runs
    if TOKENS_PER_STEP not in runs:
        return {}
    values = pd.to_numeric(runs[TOKENS_PER_STEP], errors="coerce")
    return {r: float(v) for r, v in zip(runs["run_id"], values, strict=True) if math.isfinite(v)}
