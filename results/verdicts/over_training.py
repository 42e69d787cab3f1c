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

import dataclasses
import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import pandas as pd

from results.rows.aggregate import Results, Row, Stat
from results.rows.curves import curve_keys
from results.verdicts.claims import NOT_TESTED, Claim, Evaluation

PRIMARY = ("mesh_below_base", "mesh_below_anchor", "mesh_below_anchor_emb", "base_worse_than_vanilla")


def common_steps(curves: pd.DataFrame) -> list[int]:
    """The validation steps every run of ``curves`` logged at the same tokens seen (step 0 left out:
    before training; a step where the runs' tokens differ is left out too, so rows are compared at the
    same tokens)."""
    if curves.empty:
        return []
    per_run = [set(g["step"]) for _, g in curves.groupby("run_id")]
    spread = curves.dropna(subset=["tokens"]).groupby("step")["tokens"].nunique()
    return sorted(s for s in set.intersection(*per_run) if s > 0 and spread.get(s, 1) <= 1)


def results_at_step(results: Results, curves: pd.DataFrame, step: int) -> Results:
    """``results`` with every validation metric of :func:`curve_keys` at ``step`` in place of its final
    value (a run that did not log the step leaves its row's metric without that seed); the
    main-set aliases ``val_loss`` / ``val_ppl`` are dropped so that no final value is read as this step's."""
    at = curves[curves["step"] == step].set_index(["run_id", "metric"])["value"]
    keys = set(curve_keys(results))

    def row_at(row: Row) -> Row:
        stats = {m: s for m, s in row.stats.items() if m not in keys and m not in ("val_loss", "val_ppl")}
        for key in keys:
            pairs = [(seed, at[(r, key)]) for r, seed in zip(row.run_ids, row.seeds, strict=True) if (r, key) in at]
            if pairs:
                stats[key] = Stat(tuple(float(v) for _, v in pairs), tuple(s for s, _ in pairs))
        return dataclasses.replace(row, stats=stats)

    blocks = [dataclasses.replace(b, rows=[row_at(r) for r in b.rows]) for b in results.blocks]
    return dataclasses.replace(results, blocks=blocks)


def _key(evaluation: Evaluation) -> tuple[str, str, str, str]:
    row = evaluation.row.label if evaluation.row is not None else ""
    return evaluation.claim.id, evaluation.block, evaluation.metric, row


BELOW, ABOVE, COVERS = "95% CI of Δ below 0", "95% CI of Δ above 0", "95% CI of Δ covers 0"


def describe(evaluation: Evaluation) -> str:
    """What one step's comparison shows, in words that draw no verdict: where its 95% CI lies."""
    if not evaluation.lines or not evaluation.lines[0].comparison.tested:
        return NOT_TESTED
    if evaluation.claim.kind != "pairwise":  # best of: whether the claimed row has the best mean there
        ahead = all((x.comparison.diff < 0) == (evaluation.claim.expect == "lower") for x in evaluation.lines)
        return "the claimed row's mean the best" if ahead else "another row's mean better"
    c = evaluation.lines[0].comparison
    if c.ci_low is None or c.ci_high is None:  # tested, so never: the interval comes with the p
        return NOT_TESTED
    return BELOW if c.ci_high < 0 else ABOVE if c.ci_low > 0 else COVERS


@dataclass(frozen=True)
class Trajectory:
    """One final evaluation's description at each validation step (``tokens`` NaN when not logged):
    descriptive, the same runs looked at every step without adjustment, so no verdict."""

    evaluation: Evaluation
    steps: tuple[int, ...]
    tokens: tuple[float, ...]
    verdicts: tuple[str, ...]


def loss_metric(metric: str) -> str:
    """The log-PPL form of a claim's metric: ``val/<set>/ppl`` -> ``val/<set>/loss`` (others as they are)."""
    return metric.removesuffix("/ppl") + "/loss" if metric.startswith("val/") and metric.endswith("/ppl") else metric


def claim_deltas(results: Results, curves: pd.DataFrame, evaluations: Sequence[Evaluation]) -> pd.DataFrame:
    """For each comparison of ``evaluations`` (claimed row - other), its difference in :func:`loss_metric`
    with the 95% CI of :meth:`Row.compare` at every step of :func:`common_steps` (CI NaN when untested)."""
    steps = common_steps(curves)
    tokens = curves.groupby("step")["tokens"].mean()
    at = {s: {(b.name, r.label): r for b in results_at_step(results, curves, s).blocks for r in b.rows} for s in steps}
    records = []
    keys = set(curve_keys(results))
    for e in evaluations:
        metric = loss_metric(e.metric)
        if e.metric not in keys or metric not in keys:
            continue
        claimed = e.row
        for line in e.lines if claimed is not None else []:
            assert claimed is not None
            for step in steps:
                row, other = at[step].get((e.block, claimed.label)), at[step].get((e.block, line.other.label))
                comparison = row.compare(other, metric) if row is not None and other is not None else None
                if comparison is None:
                    continue
                low, high = (comparison.ci_low, comparison.ci_high) if comparison.tested else (None, None)
                records.append(
                    (e.claim.id, e.block, metric, claimed.label, line.other.label, line.other.scheme, step)
                    + (float(tokens.get(step, math.nan)), comparison.diff)
                    + (math.nan if low is None else low, math.nan if high is None else high)
                )
    columns = ["claim", "block", "metric", "row", "other", "other_scheme", "step", "tokens", "diff", "low", "high"]
    return pd.DataFrame.from_records(records, columns=columns)


@dataclass(frozen=True)
class Span:
    """Consecutive validation points with one verdict: from ``first`` to ``last`` (tokens, or steps)."""

    verdict: str
    first: float
    last: float
    points: int


def spans(positions: Sequence[float], verdicts: Sequence[str]) -> list[Span]:
    """Consecutive equal verdicts grouped: positions (tokens or steps) in training order."""
    if len(positions) != len(verdicts):
        raise ValueError(f"{len(positions)} positions for {len(verdicts)} verdicts: give one verdict per position")
    out: list[Span] = []
    for position, verdict in zip(positions, verdicts, strict=True):
        if out and out[-1].verdict == verdict:
            out[-1] = dataclasses.replace(out[-1], last=position, points=out[-1].points + 1)
        else:
            out.append(Span(verdict, position, position, 1))
    return out


def primary_claims(claims: Iterable[Claim]) -> list[str]:
    """The ids of the claims marked ``priority: primary``; :data:`PRIMARY` while the data file has no
    such field."""
    claims = list(claims)
    if any(hasattr(c, "priority") for c in claims):
        return [c.id for c in claims if getattr(c, "priority", None) == "primary"]
    return [c.id for c in claims if c.id in PRIMARY]
