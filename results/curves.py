"""Validation over training: every logged validation step of every run, and the claims evaluated there.

:func:`read_curves` reads ``val/<set>/loss`` and ``val/<set>/ppl`` at every logged step (one
``get_metric_history`` per run and key) into the long frame written as ``curves.csv``; the tokens
seen at a step are ``step x tokens_per_step`` (the metric every run logs at step 0, see
``experiments/train.py``; empty when a run did not log it). :func:`results_at_step` puts the values
of one step in place of the final ones, so that :func:`results.claims.evaluate` tests the claims
there; :func:`claims_over_training` does so at every validation step common to the runs, and
:func:`spans_text` says where along training each verdict held.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import pandas as pd
from scipy import stats as scipy_stats

from results.aggregate import Results, Row, Stat
from results.claims import NOT_TESTED, Claim, ClaimSet, Evaluation, evaluate, load_claims
from results.render import markdown_escape
from results.stats import CONFIDENCE

FILE = "curves.csv"
COLUMNS = ("run_id", "row", "scheme", "seed", "block", "step", "tokens", "metric", "value")
TOKENS_PER_STEP = "tokens_per_step"
PRIMARY = ("mesh_below_base", "mesh_below_anchor", "mesh_below_anchor_emb", "base_worse_than_vanilla")


def curve_keys(results: Results) -> list[str]:
    """The validation metrics read over training: loss and PPL of every validation set."""
    return [f"val/{s}/{kind}" for s in results.sets for kind in ("loss", "ppl")]


def _tokens_per_step(results: Results) -> dict[str, float]:
    runs = results.runs
    if TOKENS_PER_STEP not in runs:
        return {}
    values = pd.to_numeric(runs[TOKENS_PER_STEP], errors="coerce")
    return {r: float(v) for r, v in zip(runs["run_id"], values, strict=True) if math.isfinite(v)}


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
    return BELOW if c.ci_high < 0 else ABOVE if c.ci_low > 0 else COVERS


@dataclass(frozen=True)
class Trajectory:
    """One final evaluation's description at each validation step (``tokens`` NaN when not logged):
    descriptive, the same runs looked at every step without adjustment, so no verdict."""

    evaluation: Evaluation
    steps: tuple[int, ...]
    tokens: tuple[float, ...]
    verdicts: tuple[str, ...]


def claims_over_training(
    results: Results, curves: pd.DataFrame, final: Sequence[Evaluation], claims: ClaimSet | None = None
) -> list[Trajectory]:
    """For each evaluation of ``final`` (the claims on the final values), its verdict at every step of
    :func:`common_steps`, from :func:`results.claims.evaluate` on :func:`results_at_step`. A step's
    evaluation is matched to the final one by claim, block, metric and claimed row, then in order (the
    compared rows come in the block's order at every step); one with no match keeps "not tested"."""
    claims = claims or load_claims()
    steps = common_steps(curves)
    tokens = curves.groupby("step")["tokens"].mean()
    verdicts: dict[int, list[str]] = {i: [] for i in range(len(final))}
    for step in steps:
        at_step = evaluate(results_at_step(results, curves, step), claims)
        by_key: dict[tuple, list[Evaluation]] = {}
        for evaluation in at_step:
            by_key.setdefault(_key(evaluation), []).append(evaluation)
        seen: dict[tuple, int] = {}
        for i, evaluation in enumerate(final):
            key = _key(evaluation)
            matches, k = by_key.get(key, []), seen.get(key, 0)
            seen[key] = k + 1
            verdicts[i].append(describe(matches[k]) if k < len(matches) else NOT_TESTED)
    return [
        Trajectory(e, tuple(steps), tuple(float(tokens.get(s, math.nan)) for s in steps), tuple(verdicts[i]))
        for i, e in enumerate(final)
    ]


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
        for line in e.lines if e.row is not None else []:
            for step in steps:
                row, other = at[step].get((e.block, e.row.label)), at[step].get((e.block, line.other.label))
                comparison = row.compare(other, metric) if row is not None and other is not None else None
                if comparison is None:
                    continue
                low, high = (comparison.ci_low, comparison.ci_high) if comparison.tested else (None, None)
                records.append(
                    (e.claim.id, e.block, metric, e.row.label, line.other.label, line.other.scheme, step)
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


def format_tokens(tokens: float, like: float | None = None) -> str:
    """400000 -> 0.4M, 12288 -> 12.3k, 1.6e9 -> 1.6B; in the unit of ``like`` when given (so that a
    range reads 0.2M to 1.6M)."""
    reference = abs(tokens if like is None else like)
    for scale, suffix in ((1e9, "B"), (1e6, "M"), (1e3, "k")):
        if reference >= scale:
            return f"{tokens / scale:.3g}{suffix}"
    return f"{tokens:.0f}"


def spans_text(groups: Sequence[Span], unit: str = "tokens") -> str:
    """``holds from 0.4M to 1.6M tokens; inconclusive after``: where each verdict held, in training
    order; the last of several spans is "after" the one before it. ``unit``: tokens or steps."""

    def point(value: float) -> str:
        return f"{format_tokens(value)} tokens" if unit == "tokens" else f"step {value:.0f}"

    def span(first: float, last: float) -> str:
        if unit == "tokens":
            return f"{format_tokens(first, like=last)} to {format_tokens(last)} tokens"
        return f"step {first:.0f} to {last:.0f}"

    if not groups:
        return "no validation step common to the runs"
    if len(groups) == 1:
        g = groups[0]
        if g.points == 1:
            return f"{g.verdict} at the one validation point ({point(g.first)})"
        return f"{g.verdict} at every validation point, from {span(g.first, g.last)}"
    parts = [
        f"{g.verdict} at {point(g.first)}" if g.points == 1 else f"{g.verdict} from {span(g.first, g.last)}"
        for g in groups[:-1]
    ]
    return "; ".join(parts) + f"; {groups[-1].verdict} after"  # verdict words may hold commas


def trajectory_text(trajectory: Trajectory) -> str:
    """:func:`spans_text` of a trajectory, on tokens when every step's tokens are known, else on steps."""
    on_tokens = bool(trajectory.tokens) and all(math.isfinite(t) for t in trajectory.tokens)
    positions = trajectory.tokens if on_tokens else tuple(float(s) for s in trajectory.steps)
    return spans_text(spans(positions, trajectory.verdicts), "tokens" if on_tokens else "steps")


def primary_claims(claims: Iterable[Claim]) -> list[str]:
    """The ids of the claims marked ``priority: primary``; :data:`PRIMARY` while the data file has no
    such field."""
    claims = list(claims)
    if any(hasattr(c, "priority") for c in claims):
        return [c.id for c in claims if getattr(c, "priority", None) == "primary"]
    return [c.id for c in claims if c.id in PRIMARY]


def over_training_lines(
    results: Results, curves: pd.DataFrame, final: Sequence[Evaluation], claims: ClaimSet | None = None
) -> list[str]:
    """The "Over training" section of ``claims.md``: for each evaluation, where along training its
    verdict held (:func:`claims_over_training`, :func:`trajectory_text`)."""
    keys = set(curve_keys(results))
    trajectories = [
        t
        for t in claims_over_training(results, curves, final, claims)  # all of them: matched in order
        if t.evaluation.metric in keys and t.evaluation.row is not None and t.evaluation.lines
    ]
    steps = trajectories[0].steps if trajectories else ()
    lines = [
        "## Over training (descriptive)",
        "",
        "Descriptive, not a test: each comparison above looked at again at every validation step that all "
        f"runs logged at the same tokens ({len(steps)} step{'s' if len(steps) != 1 else ''}; the values of that "
        "step in place of the final ones), saying only where the unadjusted 95% CI of Δ lies (below 0, above "
        "0, or covering 0). The same runs are looked at many times with no correction across the steps, so no "
        "verdict is drawn from these spans; the verdicts are the ones above, at the end of training. "
        "Consecutive steps alike are one span. The curves are in `curves.csv` beside this file.",
        "",
    ]
    if not steps or not trajectories:
        return [*lines, "No validation step common to the runs, or no tested comparison: nothing to follow."]
    for t in trajectories:
        e = t.evaluation
        rows = f"`{e.row.label}` vs " + ", ".join(f"`{x.other.label}`" for x in e.lines)
        where = ", ".join(p for p in (f"`{e.claim.id}`", markdown_escape(e.block), f"`{e.metric}`", rows) if p)
        lines.append(f"* {where}: {trajectory_text(t)}{fragile_mark(e)}")
    return lines


def fragile_mark(evaluation: Evaluation) -> str:
    """`` (n=2, fragile)`` where the evaluation compares fewer than ``FRAGILE_N`` seeds a row, as its
    verdict says in ``claims.md`` (one degree of freedom at n = 2); else nothing."""
    if not evaluation.fragile:
        return ""
    n = min(min(x.comparison.n_a, x.comparison.n_b) for x in evaluation.lines if x.comparison.tested)
    return f" (n={n}, fragile)"


__all__ = [
    "COLUMNS",
    "FILE",
    "Span",
    "Trajectory",
    "claim_deltas",
    "claims_over_training",
    "common_steps",
    "curve_keys",
    "format_tokens",
    "fragile_mark",
    "loss_metric",
    "over_training_lines",
    "primary_claims",
    "read_curves",
    "results_at_step",
    "row_bands",
    "spans",
    "spans_text",
    "t_band",
    "trajectory_text",
]
