"""Bands over seeds: the mean of each row's runs at every logged step with its t-interval (the
validation curves' figures draw them)."""

from __future__ import annotations

import math
from collections.abc import Sequence

import pandas as pd
from scipy import stats as scipy_stats

from results.stats.comparison import CONFIDENCE


def t_band(values: Sequence[float], confidence: float = CONFIDENCE) -> tuple[float, float | None]:
    """(mean, half-width of the t interval of the mean); no half-width for fewer than two values."""
    n = len(values)
    mean = math.fsum(values) / n
    if n < 2:
        return mean, None
    sd = math.sqrt(math.fsum((v - mean) ** 2 for v in values) / (n - 1))
    return mean, float(scipy_stats.t.ppf(0.5 + confidence / 2, n - 1)) * sd / math.sqrt(n)


def row_bands(curves: pd.DataFrame, metric: str) -> pd.DataFrame:
    """Per block, row and step: mean of ``metric`` over the row's seeds, its 95% t band (NaN for one
    seed), n, and the tokens seen (the seeds' mean; they agree unless the runs did not)."""
    records = []
    subset = curves[curves["metric"] == metric]
    for (block, row, scheme, step), group in subset.groupby(["block", "row", "scheme", "step"], sort=False):
        mean, half = t_band(list(group["value"]))
        low, high = (math.nan, math.nan) if half is None else (mean - half, mean + half)
        records.append((block, row, scheme, step, group["tokens"].mean(), mean, low, high, len(group)))
    columns = ["block", "row", "scheme", "step", "tokens", "mean", "low", "high", "n"]
    return pd.DataFrame.from_records(records, columns=columns)


__all__ = ["row_bands", "t_band"]
