"""The design's decisions are the verdicts: a ``seeds=auto`` grid reported by the test that chose its seeds.

A ``seeds=auto`` grid (results/commands/seeds_auto.py) adds seeds in stages and stops each primary claim by
the group-sequential design of results/stats/sequential.py. Its report must say what that design
decided, not what a fixed-sample test run afterwards on data whose size the design chose would say
(that test's error rate is not the one its header promises). :func:`apply_design` replaces the
verdict of each primary pairwise evaluation the design covers by the design's decision at the look
where it stopped (*holds* / *contradicted* / *stopped for futility* / *undecided at the cap*), with
the stage, n and the repeated confidence interval; the fixed-n verdict stays beside it as a labelled
secondary view (``Evaluation.fixed_verdict``).

The design is read from the grid's ``seeds_auto.log`` (the ``mesh-sweep ... seeds=auto`` output
run.sh keeps beside the report): the command line gives ``seeds.*`` (stage, cap, alpha, spending,
futility), the header line the primary claims it decided (so the family size m is the one the
design used). :func:`read_confirmatory` reads ``confirmatory.yaml`` from the reproduction's folder:
which report is the confirmatory test of which claims; every other report shows them as
replications.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from results.verdicts.claims import Evaluation
from results.verdicts.sequential import FUTILITY_STOP, DesignRecord


def design_lines(record: DesignRecord, link: str, evaluations: Sequence[Evaluation] = ()) -> list[str]:
    """The design in words, for the methods of report.md and the header of claims.md; with the
    ``evaluations`` it decided, every look of each and which rule took each decision."""
    design = record.design
    bounds = ", ".join(
        f"n = {n}: |t| > {'inf' if not math.isfinite(b) else f'{b:.2f}'}"
        for n, b in zip(design.looks, design.boundaries, strict=True)
    )
    futility = (
        "one-sided, non-binding futility at the interim looks (a claim stops when the one-sided "
        f"{100 * (1 - design.share):.4g}% bound on the paper's side excludes the paper's effect)"
        if design.futility
        else "no futility stop"
    )
    return [
        f"* **The design that chose the seeds** (`seeds=auto`, results/stats/sequential.py; the stages and their "
        f"decisions are in {link}): a group-sequential paired t-test over seeds, looks at n = "
        f"{', '.join(map(str, design.looks))} seeds per arm (stages of {design.stage}, cap {design.n_max}); "
        f"α = {design.alpha:g} Bonferroni over the {_family_words(record)} "
        f"({', '.join(f'`{c}`' for c in record.claims)}; {design.share:.4g} each); "
        f"{design.spending.replace('_', '-')} alpha spending (Lan-DeMets); two-sided efficacy bounds "
        f"{bounds} (holds or contradicted by the sign); {futility}. The interval is the repeated confidence "
        "interval (RCI; Jennison & Turnbull 1989, JRSS B 51:305, and 2000, ch. 9): mean ± bound × se at the "
        f"look where the claim stopped, {100 * (1 - design.share):.4g}% coverage whatever the stopping. These "
        "decisions are the verdicts of the primary claims; the fixed-n analysis (Holm over the final seeds) is "
        "kept beside them as a secondary view, whose error rate after sequential stopping is not the header's. "
        f"A futility stop (*{FUTILITY_STOP}*) is a one-look bound, not the RCI: its line gives how often the "
        "design stops so when the paper's effect is true (simulated at the claim's SD), and *the paper's effect "
        "ruled out* is said only where an RCI excludes it. The bounds assume normal per-seed differences "
        "(docs/seeds.md: the design's error under bimodal seeds, and the sign-flip check).",
        *([f"* **The record**: {record.note}"] if record.note else []),
        *rule_lines(record, evaluations),
        *looks_table(record, evaluations),
    ]


def _family_words(record: DesignRecord) -> str:
    if record.family and record.family != len(record.claims):
        return f"{record.family} primary comparisons this report decides together ({len(record.claims)} claims, each per arm)"
    return f"{len(record.claims)} primary claims it decided"


def _decided(evaluations: Sequence[Evaluation]) -> list[Evaluation]:
    return [e for e in evaluations if e.sequential is not None]


def _name(e: Evaluation) -> str:
    return f"`{e.claim.id}`" + (f" ({e.row.label})" if e.row is not None and len(e.row.label) < 90 else "")


def rule_lines(record: DesignRecord, evaluations: Sequence[Evaluation]) -> list[str]:
    """Which rule took each decision: the design as it stands (results/stats/sequential.py) re-takes every
    decision on the runs; where the driver's own record or the split the grids ran with says otherwise,
    the line says so."""
    decided = _decided(evaluations)
    if not decided:
        return []
    lines = []
    logged = {claim: (n, word) for claim, n, word in record.logged}
    differ = []
    for e in decided:
        v = e.sequential
        if e.claim.id in logged and logged[e.claim.id] != (v.n, v.verdict):  # the driver logs v.verdict
            n, word = logged[e.claim.id]
            differ.append(f"{_name(e)}: the driver logged *{word}* at n = {n}; here *{v.word}* at n = {v.n}")
    if logged and differ:
        lines.append(
            "* **Decisions re-taken under a later rule**: every decision here is the design's rule as it stands "
            "(results/stats/sequential.py) on these runs; the grid's driver ran under the rule of its time, and "
            f"its log differs on {len(differ)} of them: " + "; ".join(differ) + "."
        )
    elif logged:
        lines.append("* **Decisions**: each is the one the grid's driver logged when it ran.")
    else:
        lines.append(
            "* **Decisions**: re-taken here on these runs by the design's rule as it stands (the drivers' own "
            "output is not kept)."
        )
    as_run = record.design_as_run
    again = [(e, e.sequential.as_run) for e in decided if e.sequential.as_run is not None]
    if as_run is not None and again:
        lines.append(
            f"* **Under the split the grids ran with** (α over {as_run.claims}, {as_run.share:.4g} each, which "
            "let them stop at these looks): "
            + "; ".join(f"{_name(e)}: *{v.word}* at n = {v.n}" for e, v in again)
            + ". The family this report decides together spends less per comparison: where the two differ, its "
            "decision is the one in the lines below."
        )
    return lines


def looks_table(record: DesignRecord, evaluations: Sequence[Evaluation]) -> list[str]:
    """Every look each decided comparison's runs reach: t against the bound and the decision taken alone."""
    decided = _decided(evaluations)
    if not decided:
        return []
    design = record.design
    lines = [
        "",
        "  The looks (t against the look's bound; the decision that look alone would take; the design stops at "
        "the first that is not *continue*):",
        "",
        "  | comparison | "
        + " | ".join(f"n = {n} (±{b:.2f})" for n, b in zip(design.looks, design.boundaries, strict=True))
        + " |",
        "  |---|" + "---|" * len(design.looks),
    ]
    for e in decided:
        cells = [f"{'—' if x.statistic is None else f'{x.statistic:+.2f}'}: {x.decision}" for x in e.sequential.looks]
        cells += [""] * (len(design.looks) - len(cells))
        lines.append(f"  | {_name(e)} | " + " | ".join(cells) + " |")
    return lines
