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
from collections.abc import Sequence

from results.render.formats import markdown_escape
from results.rows.aggregate import Results
from results.rows.curves import curve_keys
from results.verdicts.claims import Evaluation
from results.verdicts.over_training import Span, Trajectory, spans


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


def over_training_lines(results: Results, trajectories: Sequence[Trajectory]) -> list[str]:
    """The "Over training" section of ``claims.md``: for each decided evaluation, where along training
    its verdict held (the trajectories of :func:`results.verdicts.over_training.claims_over_training`)."""
    keys = set(curve_keys(results))
    trajectories = [
        t for t in trajectories if t.evaluation.metric in keys and t.evaluation.row is not None and t.evaluation.lines
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
        assert e.row is not None  # kept above: only evaluations of a claimed row
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
