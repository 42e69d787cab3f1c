"""The answer in the terminal, read in ten seconds: each block's rows ranked by the key PPL in
plain text, five columns (rank, row, mean ± sd (n), Δ vs base [95% CI], verdict).

The same ranking as ``report.md`` opens with (:mod:`results.verdicts.ranking`), without Markdown markup;
the full table (every metric, every test) stays in ``table.md``. A verdict reached on fewer than
three seeds carries "fragile", as in ``claims.md``.
"""

from __future__ import annotations

from collections.abc import Sequence

from results.rows.aggregate import Results
from results.verdicts.claims import Evaluation
from results.verdicts.ranking import ranked_cells

HEADER = ("#", "row", "mean ± sd (n)", "Δ vs base [95% CI]", "verdict")


def summary_lines(results: Results, evaluations: Sequence[Evaluation]) -> list[str]:
    """Per block: its name and metric, then the ranked rows as aligned plain-text columns."""
    order = "lower" if results.lower_is_better else "higher"
    lines: list[str] = []
    for block in results.blocks:
        rows = ranked_cells(results, block, evaluations)
        if not rows:
            continue
        table = [HEADER]
        for rank, (row, mean, delta, said) in enumerate(rows, 1):
            table.append((str(rank), row.label, mean, delta, said.replace("`", "")))
        widths = [max(len(r[i]) for r in table) for i in range(len(HEADER) - 1)]
        lines += [f"{block.name}: {results.metric_label}, {order} is better", ""]
        for cells in table:
            fixed = [
                cells[0].rjust(widths[0]),
                cells[1].ljust(widths[1]),
                *(c.rjust(w) for c, w in zip(cells[2:4], widths[2:4], strict=True)),
            ]
            lines.append("  ".join([*fixed, cells[4]]).rstrip())
        lines.append("")
    return lines


__all__ = ["summary_lines"]
