"""The sign-flip check beside every paired verdict: the same decision taken again with a test that
does not assume normal per-seed differences (docs/seeds.md, "When the seeds are not normal").

A verdict's test of Δ = 0 is a paired t-test (fixed n) or the ``seeds=auto`` design's t bound.
:func:`check` runs the exact sign-flip permutation test (:mod:`results.stats.permutation`) on the
same per-seed differences and decides at the level that verdict used:

* **fixed n**: the sign-flip p takes the t-test's place in the same family (Holm over the primary
  claims, Benjamini-Hochberg over the secondary), the other members' p unchanged, and rejects when
  its adjusted p is below α, as the verdict's adjusted p does. A best-of claim's p is built from its
  comparisons' sign-flip p by the claim's own rule (Holm within the claim, then the
  intersection-union p or the candidate contradiction's).
* **the design's decision**: at the look where the design stopped (or the last one its runs reach),
  the bound c_k on |T| with n - 1 degrees of freedom is the two-sided level 2·P(T > c_k) for one
  test; the sign-flip test rejects when its p is at most that level.

Where the two disagree the report says so on its own line. With few seeds the sign-flip test
cannot reject at all (its smallest two-sided p is 2 / 2^n: 0.25 at n = 3), and a t rejection there
rests on normality alone: the line says so (``attainable``).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, replace

from scipy.stats import t as student_t

from results.stats.comparison import ALPHA, format_p, holm
from results.stats.permutation import SignFlip, sign_flip_test
from results.stats.sequential import REJECT
from results.verdicts.claims import Evaluation, _best_of_p
from results.verdicts.engine import FAMILIES, family_members
from results.verdicts.sequential import paired_diffs

FAMILY_NAMES = {"primary": "Holm", "secondary": "BH"}


@dataclass(frozen=True)
class Check:
    """One verdict's test of Δ = 0 by the t-test and by the sign-flip test, at the same level."""

    n: int  # pairs (the fewest among a best-of claim's comparisons)
    p: float  # the sign-flip p in the t-test's place (a best-of claim: by the claim's rule)
    adjusted: float | None  # fixed n: that p adjusted in the family (None under the design: p decides)
    t_rejects: bool
    rejects: bool
    can_reject: bool  # whether the smallest p these pairs allow would reject: False, nothing could
    needs: str  # "adjusted (Holm) < 0.05" | "p <= 0.00041, the level of stage 2's bound (n=6)"
    t_text: str  # what the t side decided, in words

    @property
    def disagree(self) -> bool:
        return self.t_rejects != self.rejects

    @property
    def outcome(self) -> str:
        """What the sign-flip test decided, in words: it rejects, it does not, or these pairs could not."""
        if self.rejects:
            return "rejects"
        return "does not reject" if self.can_reject else f"cannot reject with {self.n} pairs"

    @property
    def text(self) -> str:
        """The line a report prints where the two disagree."""
        if self.adjusted is not None:
            sign_flip = f"sign-flip p = {format_p(self.p)}, adjusted {format_p(self.adjusted)}"
        else:  # beside a look's level, which can be small: two significant digits of each
            sign_flip = f"sign-flip p = {self.p:.2g}"
        if self.rejects:
            return f"the sign-flip test {self.outcome} Δ = 0 ({sign_flip}; needs {self.needs}); {self.t_text}"
        if not self.can_reject:
            return (
                f"{self.t_text}; the sign-flip test {self.outcome} ({sign_flip}, the smallest "
                f"its pairs allow; needs {self.needs}): this rejection rests on normal per-seed differences"
            )
        return f"{self.t_text}; the sign-flip test {self.outcome} ({sign_flip}; needs {self.needs})"


def _line_tests(evaluation: Evaluation) -> list[SignFlip] | None:
    """The sign-flip test of each compared row's per-seed differences; None unless every one pairs."""
    if evaluation.row is None or not evaluation.lines:
        return None
    tests = []
    for line in evaluation.lines:
        if not line.comparison.tested or not line.comparison.paired:
            return None
        diffs = evaluation.row.paired_differences(line.other, evaluation.metric)
        if diffs is None:
            return None
        tests.append(sign_flip_test(diffs))
    return tests


def _claim_p(evaluation: Evaluation, p_values: Sequence[float]) -> float:
    """The p the claim enters its family with, its comparisons' p replaced by ``p_values``."""
    if evaluation.claim.kind != "best_of":
        return p_values[0]
    within = holm(list(p_values))
    lines = [
        replace(x, comparison=replace(x.comparison, p=p), p_holm=h)
        for x, p, h in zip(evaluation.lines, p_values, within, strict=True)
    ]
    p = _best_of_p(lines, evaluation.claim.expect)
    assert p is not None  # every comparison tested (checked by _line_tests)
    return p


def _in_family(evaluation: Evaluation, members: list[Evaluation], p: float) -> float:
    """``evaluation``'s adjusted p had its p been ``p``, the family's other members unchanged."""
    adjust = FAMILIES[evaluation.family]
    values = [p if e is evaluation else float(e.p) for e in members]  # type: ignore[arg-type]
    return adjust(values)[next(i for i, e in enumerate(members) if e is evaluation)]


def _fixed(evaluation: Evaluation, tests: list[SignFlip], members: list[Evaluation], alpha: float) -> Check:
    p = _claim_p(evaluation, [t.p_two_sided for t in tests])
    adjusted = _in_family(evaluation, members, p)
    floor = _in_family(evaluation, members, _claim_p(evaluation, [t.p_min for t in tests]))
    t_adjusted = float(evaluation.p_adjusted)  # type: ignore[arg-type]
    t_rejects = t_adjusted < alpha
    plural = evaluation.claim.kind == "best_of"  # its p is built from several t-tests
    subject = "the claim's t-tests" if plural else "the t-test"
    verb = ("reject" if plural else "rejects") if t_rejects else ("do not reject" if plural else "does not reject")
    t_text = f"{subject} {verb} Δ = 0 (adjusted p = {format_p(t_adjusted)})"
    needs = f"adjusted ({FAMILY_NAMES[evaluation.family]}) < {alpha:g}"
    n = min(t.n for t in tests)
    return Check(n, p, adjusted, t_rejects, adjusted < alpha, floor < alpha, needs, t_text)


def look_level(bound: float, n: int) -> float:
    """The two-sided level of one t-test whose |T| bound is ``bound`` with n - 1 degrees of freedom."""
    return 0.0 if not math.isfinite(bound) else float(2.0 * student_t.sf(bound, n - 1))


def _sequential(evaluation: Evaluation) -> Check | None:
    verdict = evaluation.sequential
    diffs = [d for _, d in paired_diffs(evaluation)[: verdict.n]]
    if len(diffs) < 2:
        return None
    test = sign_flip_test(diffs)
    level = look_level(verdict.bound, verdict.n)
    t_rejects = verdict.decision == REJECT
    statistic = "—" if verdict.statistic is None else f"{abs(verdict.statistic):.2f}"
    t_text = f"the design's t bound {'rejects' if t_rejects else 'does not reject'} Δ = 0 (|t| {statistic} vs {verdict.bound:.2f})"
    needs = f"p <= {level:.2g}, the level of stage {verdict.stage}'s bound (n={verdict.n})"
    return Check(
        test.n, test.p_two_sided, None, t_rejects, test.p_two_sided <= level, test.p_min <= level, needs, t_text
    )


def check(evaluations: Sequence[Evaluation], alpha: float = ALPHA) -> list[Check]:
    """Set ``sign_flip`` on every evaluation whose verdict rests on paired t-tests (fixed n, after
    :func:`results.verdicts.engine.decide`; the design's, after
    :func:`results.verdicts.sequential.apply_design`); returns the checks made, in order."""
    members = {family: family_members(evaluations, family) for family in FAMILIES}
    made = []
    for e in evaluations:
        tests = _line_tests(e)
        if tests is None:
            continue
        if e.sequential is not None:
            result = _sequential(e)
        elif e.p is not None and e.p_adjusted is not None:  # a member of its family (family_members)
            result = _fixed(e, tests, members[e.family], alpha)
        else:
            result = None
        e.sign_flip = result
        if result is not None:
            made.append(result)
    return made


__all__ = ["Check", "check", "look_level"]
