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

from results.verdicts.sequential import DesignRecord


def design_lines(record: DesignRecord, link: str) -> list[str]:
    """The design in words, for the methods of report.md and the header of claims.md."""
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
        f"α = {design.alpha:g} Bonferroni over the {design.claims} primary claims it decided "
        f"({', '.join(f'`{c}`' for c in record.claims)}; {design.share:.4g} each); "
        f"{design.spending.replace('_', '-')} alpha spending (Lan-DeMets); two-sided efficacy bounds "
        f"{bounds} (holds or contradicted by the sign); {futility}. The interval is the repeated confidence "
        "interval (RCI; Jennison & Turnbull 1989, JRSS B 51:305, and 2000, ch. 9): mean ± bound × se at the "
        f"look where the claim stopped, {100 * (1 - design.share):.4g}% coverage whatever the stopping. These "
        "decisions are the verdicts of the primary claims; the fixed-n analysis (Holm over the final seeds) is "
        "kept beside them as a secondary view, whose error rate after sequential stopping is not the header's.",
    ]
