"""The design's decisions are the verdicts: a ``seeds=auto`` grid reported by the test that chose its seeds.

A ``seeds=auto`` grid (results/commands/seeds_auto.py) adds seeds in stages and stops each primary claim by
the group-sequential design of results/stats/sequential.py. Its report must say what that design
decided, not what a fixed-sample test run afterwards on data whose size the design chose would say
(that test's error rate is not the one its header promises). :func:`apply_design` replaces the
verdict of each primary pairwise evaluation the design covers by the design's decision at the look
where it stopped (*holds* / *contradicted* / *stopped: unlikely to reach the paper's effect* /
*undecided at the cap*), with the stage, n and the repeated confidence interval (RCI), the interval of
record: "the paper's effect ruled out" is said only where the RCI excludes it. A futility stop is a
one-look bound (it is not the RCI), so its line gives how often the design stops so when the paper's
effect is true (simulated at the claim's own SD). The fixed-n verdict stays beside it as a labelled
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
import statistics
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from results.stats.sequential import CONTINUE, FUTILE, INCONCLUSIVE, REJECT, Design, futile_stop_chance
from results.verdicts.claims import CONTRADICTED, HOLDS, RULED_OUT, Evaluation
from sweeps.grid import AutoSeeds

LOG = "seeds_auto.log"  # the seeds=auto output kept beside a report (results.runs.stages reads it)
FUTILITY_STOP = "stopped: unlikely to reach the paper's effect"


UNDECIDED = "undecided at the cap"


RUNNING = "undecided so far (the design would add seeds)"


CONFIRMATORY_ROLE, REPLICATION_ROLE, SECOND_READING_ROLE = "confirmatory", "replication", "second reading"


Arm = tuple[str, ...]


@dataclass(frozen=True)
class Look:
    """One primary comparison at one look its runs reach."""

    n: int
    mean: float
    statistic: float | None
    bound: float
    decision: str


@dataclass
class Verdict:
    """One primary claim at the look where the design stopped it (or the last look its runs reach)."""

    claim: str
    rows: str
    n: int
    mean: float
    statistic: float | None
    bound: float
    decision: str  # reject | continue | futile | inconclusive
    verdict: str  # holds | contradicted | continue | futile | inconclusive
    arms: list[Arm] = field(default_factory=list)
    stage: int = 0
    rci_low: float = -math.inf
    rci_high: float = math.inf
    effect: float | None = None  # the paper's effect the claim is judged against (log scale for a PPL)
    futile_chance: float | None = None  # a futility stop: P(stopping so | the paper's effect is true)
    later: tuple[int, float, float] | None = None  # (n, RCI) at the last look the runs reach past the stop
    looks: list[Look] = field(default_factory=list)  # every look the runs reach, each decided alone
    as_run: Verdict | None = None  # the decision under the split the grids ran with, where it differs

    @property
    def word(self) -> str:
        """The verdict in the report's words."""
        return {FUTILE: FUTILITY_STOP, INCONCLUSIVE: UNDECIDED, CONTINUE: RUNNING}.get(self.verdict, self.verdict)

    @property
    def rci_text(self) -> str:
        return f"RCI [{self.rci_low:+.4f}, {self.rci_high:+.4f}]" if math.isfinite(self.rci_low) else "RCI (-inf, +inf)"

    @property
    def rci_reading(self) -> str:
        """What the interval of record excludes: "the paper's effect ruled out" only where it does."""
        return rci_reading(self.rci_low, self.rci_high, self.effect)

    @property
    def text(self) -> str:
        """``stopped: unlikely to reach the paper's effect at stage 2 (n=6), RCI [-0.1270, +0.1850]: excludes
        neither the paper's -0.036 nor 0; a stop so when the paper's effect is true: 3.0% (simulated)``."""
        text = f"{self.word} at stage {self.stage} (n={self.n}), {self.rci_text}"
        if self.effect is not None:
            text += f": {self.rci_reading}"
        if self.futile_chance is not None:
            text += f"; a stop so when the paper's effect is true: {100 * self.futile_chance:.1f}% (simulated)"
        if self.later is not None:  # the RCIs cover together at every look, so a later one is as valid
            n, low, high = self.later
            text += (
                f"; at n={n}, the last look its runs reach, RCI [{low:+.4f}, {high:+.4f}]: "
                f"{rci_reading(low, high, self.effect)}"
            )
        return text


def rci_reading(low: float, high: float, effect: float | None) -> str:
    """Which of 0 and the paper's ``effect`` the interval [low, high] excludes, in words; "ruled out"
    only where the whole interval lies on 0's side of the paper's effect."""
    out_zero = not low <= 0.0 <= high
    if effect is None:
        return "excludes 0" if out_zero else "includes 0"
    paper = f"the paper's {effect:+.3g}"
    ruled_out = low > effect if effect < 0 else high < effect
    beyond = high < effect if effect < 0 else low > effect  # an effect larger than the paper's
    if ruled_out:
        return f"excludes {paper}" + (" and 0" if out_zero else ", not 0") + ": the paper's effect ruled out"
    if beyond:
        return f"excludes 0 and {paper}: an effect larger than the paper's"
    if out_zero:
        return f"excludes 0, not {paper}"
    return f"excludes neither {paper} nor 0"


@dataclass(frozen=True)
class DesignRecord:
    """The design a seeds=auto grid ran: its settings, its primary claims and the log they came from."""

    auto: AutoSeeds
    claims: tuple[str, ...]
    log: Path
    family: int | None = None  # comparisons alpha is split over, where a report decides a claim per arm
    ran_family: int | None = None  # the split the grids ran with, where the record re-decides under another
    note: str = ""
    logged: tuple[tuple[str, int, str], ...] = ()  # (claim, n, decision) the grid's driver took when it ran

    @property
    def design(self) -> Design:
        return design_of(self.auto, self.family or len(self.claims))

    @property
    def design_as_run(self) -> Design | None:
        """The design its grids ran with, where the record re-decides their runs under another split."""
        return design_of(self.auto, self.ran_family) if self.ran_family else None


def looks_of(design: Design, evaluation: Evaluation) -> list[Look]:
    """The comparison at every look its runs reach, each decided alone (the design stops at the first
    decision other than continue: :func:`verdict_at`)."""
    pairs = paired_diffs(evaluation)
    looks = []
    for k, size in enumerate(design.looks):
        if len(pairs) < size:
            break
        diffs = [d for _, d in pairs[:size]]
        mean, sd = statistics.fmean(diffs), statistics.stdev(diffs)
        statistic = mean / (sd / math.sqrt(size)) if sd > 0 else None
        looks.append(
            Look(size, mean, statistic, design.boundaries[k], design.decide(diffs, evaluation.claim.paper_effect))
        )
    return looks


def design_of(auto: AutoSeeds, claims: int) -> Design:
    return Design(auto.stage, auto.max, auto.alpha, claims, auto.spending, auto.futility)


def paired_diffs(evaluation: Evaluation) -> list[tuple[int, float]]:
    """(seed, claimed - other) for each seed both rows ran, in seed order; PPL on the log scale."""
    other, row = evaluation.lines[0].other, evaluation.row
    if row is None:  # an evaluation without a claimed row compares nothing
        return []
    ours, theirs = row.stats.get(evaluation.metric), other.stats.get(evaluation.metric)
    if ours is None or theirs is None:
        return []
    a, b = dict(zip(ours.seeds, ours.values, strict=True)), dict(zip(theirs.seeds, theirs.values, strict=True))
    log = evaluation.claim.log_scale
    pairs = []
    for seed in sorted(set(a) & set(b), key=int):
        x, y = (math.log(a[seed]), math.log(b[seed])) if log else (a[seed], b[seed])
        pairs.append((int(seed), x - y))
    return pairs


def verdict_at(
    design: Design, evaluation: Evaluation, arms: list[Arm] | None = None, looks: list[Look] | None = None
) -> Verdict:
    """The first decision other than ``continue`` over the looks the runs reach (or the last one),
    with its stage and repeated confidence interval; ``looks``: :func:`looks_of` already computed."""
    pairs = paired_diffs(evaluation)
    claimed = evaluation.row.label if evaluation.row is not None else "?"
    label = f"{claimed} vs {evaluation.lines[0].other.label} ({evaluation.metric})"
    effect = evaluation.claim.paper_effect
    arms = arms or []
    looks = looks_of(design, evaluation) if looks is None else looks
    result = Verdict(evaluation.claim.id, label, len(pairs), math.nan, None, math.inf, CONTINUE, CONTINUE, arms)
    for k, look in enumerate(looks):
        diffs = [d for _, d in pairs[: look.n]]
        low, high = design.rci(diffs)
        result = Verdict(
            evaluation.claim.id, label, look.n, look.mean, look.statistic, look.bound, look.decision, "", arms,
            k + 1, low, high, effect,
        )  # fmt: skip
        if look.decision == FUTILE and effect is not None:
            result.futile_chance = futile_stop_chance(design, effect, statistics.stdev(diffs), effect)
        if look.decision != CONTINUE:
            break
    if result.decision != CONTINUE and looks and looks[-1].n > result.n:
        low, high = design.rci([d for _, d in pairs[: looks[-1].n]])
        result.later = (looks[-1].n, low, high)
    result.verdict = _verdict(result, evaluation.claim.expect)
    return result


def _verdict(result: Verdict, expect: str) -> str:
    if result.decision != REJECT:
        return result.decision
    return HOLDS if (result.mean < 0) == (expect == "lower") else CONTRADICTED


def apply_design(evaluations: Sequence[Evaluation], record: DesignRecord) -> list[Verdict]:
    """Make the design's decision the verdict of every primary pairwise evaluation of its claims; the
    fixed-n verdict is kept in ``fixed_verdict``. Returns the decisions, in the evaluations' order."""
    design = record.design
    decided = []
    for e in evaluations:
        if e.family != "primary" or e.claim.kind != "pairwise" or not e.lines or e.row is None:
            continue
        if record.claims and e.claim.id not in record.claims:
            continue
        looks = looks_of(design, e)
        verdict = verdict_at(design, e, looks=looks)
        if verdict.stage == 0:  # the runs reach no look
            continue
        verdict.looks = looks
        if record.design_as_run is not None:
            verdict.as_run = verdict_at(record.design_as_run, e)
        e.fixed_verdict = _fixed_view(e)
        e.verdict, e.lean, e.reason = verdict.word, "", ""
        e.sequential = verdict
        decided.append(verdict)
    return decided


def _fixed_view(e: Evaluation) -> str:
    """The fixed-n verdict as a secondary view: a fixed-n bound past the paper's effect is not called
    "ruled out" under a design whose interval of record is the RCI."""
    if e.verdict == RULED_OUT:
        return f"the paper's effect beyond the fixed-n bound ({e.reason})"
    return e.verdict_text + (f" ({e.reason})" if e.reason and e.reason not in e.verdict_text else "")


def apply_roles(evaluations: Sequence[Evaluation], declared: dict[str, Any] | None, folder_name: str) -> None:
    """Mark the evaluations of the declared confirmatory claims (``confirmatory.yaml``, read by
    :func:`results.runs.stages.read_confirmatory`) as confirmatory in the report folder it names,
    as second readings in the folders it lists as reading the same runs again, as replications
    elsewhere."""
    if declared is None:
        return
    role = CONFIRMATORY_ROLE if folder_name == declared["report"] else REPLICATION_ROLE
    if folder_name in declared.get("second_readings", []):
        role = SECOND_READING_ROLE
    for e in evaluations:
        if e.claim.id in declared["claims"] and not e.supplementary and e.lines:
            e.role = role
