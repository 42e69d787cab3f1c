"""How each row passes state along the loop, from the ``routing/*`` metrics every looped run logs at
each validation (experiments/probing/state_routing.py): ``routing.csv``, the figures and the
report's routing section and appendix table. Descriptive: no claim is tested here.

* ``routing.csv``: every logged step of every run for the coda input's coefficients
  (``routing/coef/coda/<source>/mean``) and MeSH's router entropies (``routing/<router>/<kind>/entropy``).
* ``routing_coefficients``: the coda input's coefficient of f_K over tokens, every row's mean over
  seeds in its scheme's colour; a fixed scheme is a flat line (base 1), so every scheme sits in it.
* ``routing_<row>``, one per MeSH row: each source's coefficient in the coda input over tokens, one
  line per seed coloured by the run's final validation PPL, and the entropy of the transitional and
  the final read.
"""

from __future__ import annotations

import math
from typing import Any

import pandas as pd

from results.rows.aggregate import Results
from results.rows.routing import COLUMNS, curve_keys, routed_rows


def read_routing(client: Any, results: Results) -> pd.DataFrame:
    """Every logged step of the routing curves of every routed row (:data:`COLUMNS`)."""
    runs = results.runs.set_index("run_id")
    per_step = pd.to_numeric(runs.get("tokens_per_step", pd.Series(dtype=float)), errors="coerce")
    records = []
    for row in routed_rows(results):
        for run_id, seed in zip(row.run_ids, row.seeds, strict=True):
            step_tokens = float(per_step.get(run_id, math.nan))
            for key in curve_keys(row):
                for m in client.get_metric_history(run_id, key):
                    records.append((run_id, row.label, row.scheme, seed, m.step, m.step * step_tokens, key, m.value))
    frame = pd.DataFrame.from_records(records, columns=list(COLUMNS))
    return frame.sort_values(["row", "metric", "seed", "step"], kind="stable", ignore_index=True)
