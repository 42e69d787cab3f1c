"""The answer first: each block's rows ranked by the key PPL, one line each, with the difference to
the base row and the verdict of the paper's claim that compares the two (:func:`ranking`).

``report.md`` opens with it and the sweep's parent run starts its description with it
(:mod:`results.publish.parents`). The differences are described (mean and 95% CI); the tests and their
correction across claims are in ``claims.md``: a row that no claim compares with base gets no
verdict here, rather than an uncorrected one.
"""

from __future__ import annotations

from collections.abc import Sequence

from results.render.formats import code_span, markdown_escape
from results.rows.aggregate import Results, is_accuracy
from results.verdicts.claims import Evaluation
from results.verdicts.ranking import ranked_cells


def ranking(results: Results, evaluations: Sequence[Evaluation]) -> list[str]:
    """Markdown: per block, a line naming it and the metric, then a table of its rows best first
    (row | mean ± sd (n) | Δ vs base [95% CI] | verdict), then one line on how to read it."""
    unit = " (% points)" if is_accuracy(results.ppl_metric) else ""
    order = "lower" if results.lower_is_better else "higher"
    lines: list[str] = []
    for block in results.blocks:
        rows = ranked_cells(results, block, evaluations)
        if not rows:
            continue
        lines += [
            f"**{markdown_escape(block.name)}**: {markdown_escape(results.metric_label)}, {order} is better",
            "",
            "| # | row | mean ± sd (n) | Δ vs base [95% CI]" + unit + " | verdict |",
            "|---:|---|---:|---:|---|",
        ]
        for rank, (row, mean, delta, said) in enumerate(rows, 1):
            lines.append("| " + " | ".join([str(rank), code_span(row.label), mean, delta, said]) + " |")
        lines.append("")
    if not lines:
        return []
    lines.append(
        "Δ: difference of means against base (same layout) with its 95% CI, described, not tested. Verdict: "
        "the paper's claim that compares the two rows, as tested in claims.md."
    )
    return lines
