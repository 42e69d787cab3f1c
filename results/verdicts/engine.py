"""The verdict engine: every claim evaluated on the rows (one :class:`~results.verdicts.claims.Evaluation`
per claim x block x claimed row x metric), its p-values adjusted across the family. Called once per
report, by :func:`results.verdicts.decide.decide` (and by ``seeds=auto`` at each stage)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

from results.rows.aggregate import Results, Row
from results.stats.comparison import (
    ALPHA,
    Comparison,
    benjamini_hochberg,
    holm,
    min_detectable,
    seeds_needed,
)
from results.verdicts.claims import (
    NOT_TESTED,
    ClaimComparison,
    Evaluation,
    _best_of_p,
    _missing,
    best_of_verdict,
    pairwise_verdict,
)
from results.verdicts.schema import PPL, Claim, ClaimSet, load_claims


def _metrics(claim: Claim, results: Results, rows: list[Row]) -> list[tuple[str, bool]]:
    """(metric, supplementary) to test in a block: for ``ppl`` the PPL of every validation set."""
    if claim.metric == PPL:
        per_set = [f"val/{s}/ppl" for s in results.sets if any(f"val/{s}/ppl" in r.stats for r in rows)]
        primary = per_set or ["val_ppl"]
    else:
        primary = [claim.metric]
    also = [m for m in claim.also if any(m in r.stats for r in rows)]
    return [(m, False) for m in primary] + [(m, True) for m in also]


def compare_rows(row: Row, other: Row, metric: str, log_scale: bool) -> Comparison | None:
    """``row`` - ``other`` over seeds: :meth:`Row.compare`, the one comparison of a pair (a PPL on the
    log scale, Δ = difference of mean log PPL). ``log_scale`` is kept for the callers' signature: the
    metric decides (:func:`results.rows.aggregate.is_ppl`)."""
    return row.compare(other, metric)


def _at_level(claim: Claim, line: ClaimComparison, level: float) -> ClaimComparison:
    """The line with its MDE and seeds-needed at ``level``, the level its verdict uses."""
    comparison, mde, needed = line.comparison, None, None
    if comparison.tested and comparison.sd and comparison.sd > 0:
        n = min(comparison.n_a, comparison.n_b)
        mde = min_detectable(comparison.sd, n, level, paired=comparison.paired)
        if claim.paper_effect:
            needed = seeds_needed(claim.paper_effect, comparison.sd, level, paired=comparison.paired)
    return replace(line, mde=mde, seeds_needed=needed)


def _line(
    claim: Claim, other: Row, comparison: Comparison, alpha: float, p_holm: float | None = None
) -> ClaimComparison:
    mde = needed = None
    if comparison.tested and comparison.sd and comparison.sd > 0:
        n = min(comparison.n_a, comparison.n_b)
        mde = min_detectable(comparison.sd, n, alpha, paired=comparison.paired)
        if claim.paper_effect:
            needed = seeds_needed(claim.paper_effect, comparison.sd, alpha, paired=comparison.paired)
    verdict = pairwise_verdict(comparison, claim, alpha)[0]
    return ClaimComparison(other, comparison, verdict, p_holm, mde, needed)


def _evaluate_row(claim: Claim, block: str, row: Row, others: list[Row], metric: str, alpha: float) -> list[Evaluation]:
    """The evaluations of ``claim`` for the claimed ``row`` against ``others`` in ``metric``
    (verdicts provisional until :func:`decide` has adjusted the family's p-values)."""

    def untested(reason: str) -> Evaluation:
        return Evaluation(claim, block, metric, row, NOT_TESTED, reason)

    if metric not in row.stats:
        return [untested(f"`{row.label}` did not log `{metric}`")]
    if not others:
        return [untested(f"no {claim.against.text} in this block")]
    log_scale = claim.log_scale and metric.endswith("ppl")
    unlogged = [o for o in others if metric not in o.stats]
    if claim.kind == "pairwise":
        evaluations = []
        for other in others:
            comparison = compare_rows(row, other, metric, log_scale)
            if comparison is None:
                evaluations.append(untested(f"`{other.label}` did not log `{metric}`"))
                continue
            line = _line(claim, other, comparison, alpha)
            evaluations.append(Evaluation(claim, block, metric, row, line.verdict, "", [line], p=comparison.p))
        return evaluations
    if unlogged:
        return [untested(", ".join(f"`{o.label}`" for o in unlogged) + f" did not log `{metric}`")]
    comparisons = []
    for other in others:  # every row logged the metric (checked above): a comparison each
        comparison = compare_rows(row, other, metric, log_scale)
        assert comparison is not None
        comparisons.append(comparison)
    p_values = {i: c.p for i, c in enumerate(comparisons) if c.p is not None}
    adjusted = dict(zip(p_values, holm(list(p_values.values())), strict=True))
    lines = [
        _line(claim, other, c, alpha, adjusted.get(i))
        for i, (other, c) in enumerate(zip(others, comparisons, strict=True))
    ]
    return [Evaluation(claim, block, metric, row, NOT_TESTED, "", lines, p=_best_of_p(lines, claim.expect))]


FAMILIES = {"primary": holm, "secondary": benjamini_hochberg}  # each family's adjustment of its p-values


def family_members(evaluations: Sequence[Evaluation], family: str) -> list[Evaluation]:
    """The evaluations whose p enters ``family``'s adjustment, in the order it adjusts them."""
    return [e for e in evaluations if e.family == family and e.p is not None]


def decide(evaluations: list[Evaluation], alpha: float = ALPHA) -> None:
    """Adjust the p-values of the tested evaluations across their family (Holm over the primary
    claims, Benjamini-Hochberg over the secondary ones and every ``also`` metric), then give each
    its verdict on the adjusted p."""
    for family, adjust in FAMILIES.items():
        members = family_members(evaluations, family)
        for evaluation, p in zip(members, adjust([float(e.p) for e in members]), strict=True):  # type: ignore[arg-type]
            evaluation.p_adjusted = p
            evaluation.level = alpha / len(members) if family == "primary" else alpha
    for e in evaluations:
        if not e.lines:
            continue
        e.lines = [_at_level(e.claim, x, e.level) for x in e.lines]
        if e.claim.kind == "pairwise":
            e.verdict, e.lean, e.reason = pairwise_verdict(e.lines[0].comparison, e.claim, alpha, e.p_adjusted, e.level)
        else:
            others = [x.other for x in e.lines]
            missing = _missing(e.claim, others)
            e.verdict, e.lean, e.reason = best_of_verdict(e.lines, e.claim.expect, alpha, e.p_adjusted, missing)


def evaluate(results: Results, claims: ClaimSet | None = None) -> list[Evaluation]:
    """Every claim in every block that has a row it selects (one evaluation per claimed row,
    metric and, for pairwise claims, compared row), with verdicts after the error-rate control of
    :func:`decide`; a claim no block can test gets one "not tested" evaluation."""
    claims = claims or load_claims()
    evaluations: list[Evaluation] = []
    for claim in claims.claims:
        found = []
        for block in results.blocks:
            for row in block.rows:
                if not claim.row.selects(row):
                    continue
                others = [r for r in block.rows if r is not row and r.comparable(row) and claim.against.selects(r, row)]
                for metric, supplementary in _metrics(claim, results, [row, *others]):
                    for evaluation in _evaluate_row(claim, block.name, row, others, metric, claims.alpha):
                        evaluation.supplementary = supplementary
                        found.append(evaluation)
        if not found:
            metric = "val_ppl" if claim.metric == PPL else claim.metric
            found.append(Evaluation(claim, "", metric, None, NOT_TESTED, f"no {claim.row.text} in these runs"))
        evaluations += found
    decide(evaluations, claims.alpha)
    return evaluations
