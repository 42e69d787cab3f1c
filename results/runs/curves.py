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
from typing import Any

import pandas as pd

from results.rows.aggregate import Results
from results.rows.curves import COLUMNS, _tokens_per_step, curve_keys


def read_curves(client: Any, results: Results) -> pd.DataFrame:
    """One line per run (of a row), validation metric and logged step: the columns of :data:`COLUMNS`.
    Only keys a run logged are asked for (its final metrics name them)."""
    logged = results.runs.set_index("run_id")
    per_step = _tokens_per_step(results)
    records = []
    for block in results.blocks:
        for row in block.rows:
            for run_id, seed in zip(row.run_ids, row.seeds, strict=True):
                for key in curve_keys(results):
                    if key not in logged or not math.isfinite(float(logged.at[run_id, key])):
                        continue
                    for m in client.get_metric_history(run_id, key):
                        tokens = m.step * per_step[run_id] if run_id in per_step else math.nan
                        records.append((run_id, row.label, row.scheme, seed, block.name, m.step, tokens, key, m.value))
    frame = pd.DataFrame.from_records(records, columns=list(COLUMNS))
    return frame.sort_values(["block", "row", "metric", "seed", "step"], kind="stable", ignore_index=True)
