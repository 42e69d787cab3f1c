"""The verdict engine: the paper's claims (``paper_claims.yaml``, read and checked by
:mod:`results.verdicts.schema`) tested on the runs read. :func:`evaluate` tests every claim in every
block where its rows are present (:mod:`results.stats.comparison`) and gives each evaluation a verdict
(``claims.md``: :mod:`results.render.claims_md`). The verdicts and the "best of" rule are documented in
the data file's header.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from scipy.stats import t as student_t

from results.rows.aggregate import Row
from results.rows.paper import canonical_scheme
from results.stats.comparison import (
    ALPHA,
    Comparison,
    equivalent,
)
from results.verdicts.schema import Claim, ClaimSet

HOLDS = "holds"


EQUIVALENT = "equivalent"


INCONCLUSIVE = "inconclusive"


CONTRADICTED = "contradicted"


NOT_TESTED = "not tested"


RULED_OUT = "paper's effect ruled out"


VERDICTS = (HOLDS, EQUIVALENT, RULED_OUT, INCONCLUSIVE, CONTRADICTED, NOT_TESTED)


LEANS_WITH = "leans the paper's way"


LEANS_AGAINST = "leans against"


FRAGILE_N = 3  # fewer seeds than this: the verdict says "fragile"


@dataclass(frozen=True)
class ClaimComparison:
    """One comparison: the claimed row against ``other`` (diff = claimed - other; for ``ppl`` claims
    the difference of mean log PPL, i.e. of mean val loss, so exp(diff) - 1 is the relative change)."""

    other: Row
    comparison: Comparison
    verdict: str  # of this comparison alone, at alpha on its raw p
    p_holm: float | None = None  # best_of: p adjusted across the claim's comparisons
    mde: float | None = None  # the |Δ| detectable with 80% power at this n and SD
    seeds_needed: int | None = None  # seeds per row for the paper's effect at 80% power, this SD


@dataclass
class Evaluation:
    """One claim in one block, for one claimed row and one metric."""

    claim: Claim
    block: str
    metric: str
    row: Row | None
    verdict: str
    reason: str = ""  # why not tested, or how the verdict was reached
    lines: list[ClaimComparison] = field(default_factory=list)
    supplementary: bool = False  # a metric of the claim's ``also``
    p: float | None = None  # the p that enters the error-rate family (best_of: see _best_of_p)
    p_adjusted: float | None = None  # Holm across the primary family, BH across the secondary
    lean: str = ""  # inconclusive: which way the mean leans
    level: float = ALPHA  # the per-test level the verdict uses: alpha / m in the primary family, else alpha
    fixed_verdict: str = ""  # under a sequential design: the fixed-n verdict, shown as a secondary view
    role: str = ""  # "confirmatory" | "replication" | "second reading" where a reproduction declares its family
    sequential: Any = None  # results.verdicts.sequential.Verdict: the design's decision, when it made this verdict
    sign_flip: Any = None  # results.verdicts.sign_flip.Check: the same test of Δ = 0 without normality

    @property
    def family(self) -> str:
        return "primary" if self.claim.priority == "primary" and not self.supplementary else "secondary"

    @property
    def fragile(self) -> bool:
        tested = [x for x in self.lines if x.comparison.tested]
        return self.verdict != NOT_TESTED and any(min(x.comparison.n_a, x.comparison.n_b) < FRAGILE_N for x in tested)

    @property
    def verdict_text(self) -> str:
        """``inconclusive, leans the paper's way (n=2, fragile)``; ``paper's effect ruled out (one-sided
        98.75% bound -0.0141 vs paper -0.036)``; ``equivalent (TOST at 0.0125, ±0.01)``."""
        prefix = f"{self.role}: " if self.role in ("replication", "second reading") else ""
        if self.sequential is not None:
            return prefix + self.sequential.text
        text = prefix + self.verdict + (f", {self.lean}" if self.lean else "")
        if self.verdict in (RULED_OUT, EQUIVALENT) and self.reason:
            text += f" ({self.reason})"
        if self.reason.startswith("not slight"):
            text += " (not slight)"
        if self.fragile:
            n = min(min(x.comparison.n_a, x.comparison.n_b) for x in self.lines if x.comparison.tested)
            text += f" (n={n}, fragile)"
        return text


def _agrees(comparison: Comparison, expect: str) -> bool:
    return comparison.diff < 0 if expect == "lower" else comparison.diff > 0


def _lean(comparison: Comparison, expect: str) -> str:
    return LEANS_WITH if _agrees(comparison, expect) else LEANS_AGAINST


def one_sided_bound(comparison: Comparison, effect: float, level: float) -> float | None:
    """The one-sided 1 - level confidence bound of Δ on the side of the paper's ``effect`` (the
    lower bound when the paper's effect is negative)."""
    if comparison.se is None or comparison.df is None:
        return None
    half = float(student_t.ppf(1.0 - level, comparison.df)) * comparison.se
    return comparison.diff - half if effect < 0 else comparison.diff + half


def ruled_out(comparison: Comparison, effect: float | None, level: float) -> str:
    """The reason text when the one-sided 1 - level bound excludes the paper's ``effect``, else ""."""
    if not effect:
        return ""
    bound = one_sided_bound(comparison, effect, level)
    if bound is None or not (bound > effect if effect < 0 else bound < effect):
        return ""
    return f"one-sided {100 * (1 - level):.4g}% bound {bound:+.4f} vs paper {effect:+.3f}"


def pairwise_verdict(
    comparison: Comparison,
    claim: Claim,
    alpha: float = ALPHA,
    p_adjusted: float | None = None,
    level: float | None = None,
) -> tuple[str, str, str]:
    """(verdict, lean, reason) of one two-sided test read in the claim's direction; ``p_adjusted``
    (default the raw p) below ``alpha`` decides significance; equivalence (TOST) and "the paper's
    effect ruled out" (one-sided bound) are tested at ``level`` (default alpha), the level the
    family uses for one test."""
    if comparison.p is None:
        return NOT_TESTED, "", comparison.reason
    level = alpha if level is None else level
    p = comparison.p if p_adjusted is None else p_adjusted
    agrees = _agrees(comparison, claim.expect)
    margin = claim.slight_margin if claim.within_margin else claim.equivalence_margin
    if p < alpha and not agrees:
        return CONTRADICTED, "", ""
    if p < alpha and claim.within_margin and margin is not None:
        bound = comparison.ci_high if claim.expect == "higher" else -(comparison.ci_low or 0.0)
        if bound is not None and bound < margin:
            return HOLDS, "", f"significant and inside the ±{margin:g} margin"
        if abs(comparison.diff) > margin:
            return CONTRADICTED, "", f"not slight: Δ beyond the ±{margin:g} margin"
        return INCONCLUSIVE, LEANS_WITH, f"significant, but the 95% CI reaches past the ±{margin:g} margin"
    if p < alpha:
        return HOLDS, "", ""
    if margin is not None and equivalent(comparison, margin, level):
        return EQUIVALENT, "", f"TOST at {level:.4g}: the {100 * (1 - 2 * level):.4g}% CI inside ±{margin:g}"
    excluded = ruled_out(comparison, claim.paper_effect, level)
    if excluded:
        return RULED_OUT, "", excluded
    return INCONCLUSIVE, _lean(comparison, claim.expect), ""


def _missing(claim: Claim, others: list[Row]) -> list[str]:
    """The schemes a best_of claim names that no compared row has (incomplete comparison set)."""
    if claim.against.schemes == ("same",):
        return []
    present = {canonical_scheme(o.scheme) for o in others}
    return [s for s in claim.against.schemes if s not in present]


def _best_of_p(lines: list[ClaimComparison], expect: str) -> float | None:
    """Every comparison the paper's way: the intersection-union p (the largest raw p); otherwise the
    smallest Holm p of a row with a better mean (the candidate contradiction)."""
    if any(not x.comparison.tested for x in lines):
        return None
    against = [x.p_holm for x in lines if not _agrees(x.comparison, expect) and x.p_holm is not None]
    if against:
        return min(against)
    return max(x.comparison.p for x in lines if x.comparison.p is not None)


def best_of_verdict(
    lines: list[ClaimComparison],
    expect: str,
    alpha: float = ALPHA,
    p_adjusted: float | None = None,
    missing: Sequence[str] = (),
) -> tuple[str, str, str]:
    """(verdict, lean, reason) of "the row beats every other" (an intersection-union test): holds when
    every comparison goes the paper's way and the largest p, adjusted across the family, is below
    alpha; contradicted when a row with a better mean is significant after Holm's correction across the
    claim's comparisons (and the family's); capped at inconclusive when rows the claim names are missing."""
    p = _best_of_p(lines, expect)
    adjusted = p if p_adjusted is None else p_adjusted
    better = [x for x in lines if not _agrees(x.comparison, expect)]
    if adjusted is not None and better and adjusted < alpha:
        names = ", ".join(
            f"`{x.other.label}`" for x in better if x.p_holm is not None and p is not None and x.p_holm <= p
        )
        return CONTRADICTED, "", f"significantly better after Holm's correction: {names}"
    untested = [x for x in lines if not x.comparison.tested]
    if untested:
        names = ", ".join(f"`{x.other.label}` ({x.comparison.reason})" for x in untested)
        return NOT_TESTED, "", f"no test against {names}"
    held = sum(x.verdict == HOLDS for x in lines)
    summary = f"{held} of {len(lines)} comparisons significant in the paper's direction"
    if missing:
        summary += "; cannot hold the full claim: no " + ", ".join(missing) + " row"
    lean = LEANS_AGAINST if better else LEANS_WITH
    if better:
        return INCONCLUSIVE, lean, f"not the best mean of the {len(lines) + 1} rows present; {summary}"
    ranked = f"best of the {len(lines) + 1} rows present" if missing else "best mean"
    if adjusted is not None and adjusted < alpha:
        return (INCONCLUSIVE, lean, f"{ranked}; {summary}") if missing else (HOLDS, "", summary)
    return INCONCLUSIVE, lean, f"{ranked}; {summary}"


@dataclass
class Decided:
    """What the claims came to on one set of rows."""

    claims: ClaimSet
    evaluations: list[Evaluation]
    trajectories: list[Any] = field(default_factory=list)  # over_training.Trajectory; empty without curves
    design: Any = None  # sequential.DesignRecord: the seeds=auto design whose decisions are the verdicts
    declared: dict | None = None  # the confirmatory family (confirmatory.yaml)
