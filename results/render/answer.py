"""What these runs show, in words: the lines the terminal, ``report.md``, ``claims.md`` and the sweep's
parent run open with, written once here so the four cannot drift.

:func:`opening` puts this grid's own answer first (:func:`answer_lines`: per block the rows best
first with their mean, the seeds per row, and, under three seeds, that every test is fragile), then
the grid's ``context``: the lines its job recorded (``mesh-demo``: where the decided result is, in
another regime stated as such, and this grid's regime; :mod:`results.commands.demo_regime`).
"""

from __future__ import annotations

from collections.abc import Sequence

from results.rows.aggregate import Results, decimals_for, is_accuracy
from results.verdicts.claims import FRAGILE_N, Evaluation
from results.verdicts.ranking import ranked_rows


def answer_lines(results: Results, evaluations: Sequence[Evaluation] = ()) -> list[str]:
    """One line per block: ``What these runs show (tiny, compute depth 6; validation PPL (shakespeare),
    lower is better; n = 2 seeds per row): anchor_emb 82.1, base 85.0, ..., mesh 98.2, last. Every test
    here is fragile at n = 2 ...``."""
    metric = results.ppl_metric
    scale = 100.0 if is_accuracy(metric) else 1.0
    order = "lower" if results.lower_is_better else "higher"
    lines = []
    for block in results.blocks:
        rows = ranked_rows(results, block)
        if not rows:
            continue
        counts = sorted({row.stats[metric].n for row in rows})
        n = f"n = {counts[0]}" if len(counts) == 1 else f"n = {counts[0]}-{counts[-1]}"
        ranked = []
        for rank, row in enumerate(rows, 1):
            mean = row.stats[metric].mean * scale
            text = f"{row.label} {mean:.{decimals_for(metric, mean)}f}"
            if rank == 1 and len(rows) > 1:
                text += " (first)"
            elif rank == len(rows) and len(rows) > 1:
                text += " (last)"
            ranked.append(text)
        line = (
            f"What these runs show ({block.name}; {results.metric_label}, {order} is better; {n} seeds per row): "
            + ", ".join(ranked)
            + "."
        )
        if counts[0] < FRAGILE_N:
            line += (
                f" Every test here is fragile at {n} (under {FRAGILE_N} seeds a verdict can turn with one more seed): "
                "the ranking says which claim tests each Δ, claims.md gives the tests."
            )
        lines.append(line)
    return lines


def opening(results: Results, evaluations: Sequence[Evaluation], context: Sequence[str]) -> list[str]:
    """The lines a grid's outputs open with: :func:`answer_lines`, then ``context`` (the lines its job
    recorded); none where there is no context (a report of runs that no job described)."""
    if not context:
        return []
    return [*answer_lines(results, evaluations), *context]


__all__ = ["answer_lines", "opening"]
