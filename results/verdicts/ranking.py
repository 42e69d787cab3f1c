"""The answer first: each block's rows ranked by the key PPL, one line each, with the difference to
the base row and the verdict of the paper's claim that compares the two (:func:`ranking`).

``report.md`` opens with it and the sweep's parent run starts its description with it
(:mod:`results.publish.parents`). The differences are described (mean and 95% CI); the tests and their
correction across claims are in ``claims.md``: a row that no claim compares with base gets no
verdict here, rather than an uncorrected one.
"""

from __future__ import annotations

from collections.abc import Sequence

from results.rows.aggregate import Block, Results, Row, decimals_for, is_accuracy, is_ppl
from results.stats.comparison import Comparison, delta_text
from results.verdicts.claims import Evaluation

BASE = "base"


NO_CLAIM = "Δ described, not tested: no claim sets this row against base"


def ranked_rows(results: Results, block: Block) -> list[Row]:
    """The rows of ``block`` that logged the key PPL, best mean first."""
    metric = results.ppl_metric
    valued = [r for r in block.rows if metric in r.stats]
    return sorted(valued, key=lambda r: r.stats[metric].mean, reverse=not results.lower_is_better)


def base_of(block: Block, row: Row) -> Row | None:
    """The base row ``row`` is set against: base of the same layout, else (vanilla, compute-matched
    with every layout of the block) the block's base row with the same other settings."""
    same = block.reference(row, BASE, same_layout=True)
    if same is None and row.scheme == "vanilla":
        return block.reference(row, BASE, same_layout=False)
    return same


def verdict(row: Row, base: Row | None, evaluations: Sequence[Evaluation], metrics: set[str]) -> str:
    """The verdict of the pairwise claim on the key PPL between ``row`` and ``base`` (either way
    round), with the claim's name; ``reference`` for the base row itself. A row no claim sets
    against base gets :data:`NO_CLAIM` and the names of the claims that test it against other rows
    (where claims.md says how it compares), if any."""
    if base is row:
        return "reference"
    others: list[str] = []
    for e in evaluations:
        involved = {id(e.row), *(id(x.other) for x in e.lines)}
        if (
            e.claim.kind != "pairwise"
            or e.supplementary
            or not e.lines
            or e.metric not in metrics
            or id(row) not in involved
        ):
            continue
        if len(e.lines) == 1 and involved == {id(row), id(base)}:
            return f"`{e.claim.id}`: {e.verdict_text}"
        others.append(f"`{e.claim.id}`")
    if others:
        return f"{NO_CLAIM}; tested against other rows in {', '.join(dict.fromkeys(others))}"
    return NO_CLAIM


def ranked_cells(results: Results, block: Block, evaluations: Sequence[Evaluation]) -> list[tuple[Row, str, str, str]]:
    """``block``'s rows best first, each with its mean ± sd (n), its Δ vs base [95% CI] and the
    verdict (Markdown code spans around the claim's name): what the report's ranking and the
    terminal's (:mod:`results.render.terminal`) show."""
    metric = results.ppl_metric
    scale = 100.0 if is_accuracy(metric) else 1.0
    metrics = {metric, *(f"val/{s}/ppl" for s in results.sets[:1])}
    cells = []
    for row in ranked_rows(results, block):
        stat = row.stats[metric]
        decimals = decimals_for(metric, stat.mean * scale)
        base = base_of(block, row)
        comparison = row.compare(base, metric) if base is not None and base is not row else None
        delta = "—" if base is row else delta_text(comparison.scaled(scale), metric, decimals) if comparison else ""
        said = verdict(row, base, evaluations, metrics)
        if said.startswith(NO_CLAIM) and comparison is not None and comparison.tested:
            said = untested_delta(comparison, is_ppl(metric)) + said.removeprefix(NO_CLAIM)
        cells.append((row, stat.text(decimals, scale), delta, said))
    return cells


def untested_delta(comparison: Comparison, log_ppl: bool = True) -> str:
    """What stands behind a Δ that no claim tests: the one comparison per pair (Row.compare), named with
    its p, uncorrected, so the ranking never says "not tested" beside a p the table prints."""
    on = " on log PPL" if log_ppl else ""
    return f"Δ by {comparison.test}{on}, p {comparison.p:.2g} (uncorrected: no claim sets this row against base)"
