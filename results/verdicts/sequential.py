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
import statistics
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from results.stats.sequential import CONTINUE, FUTILE, INCONCLUSIVE, REJECT, Design
from results.verdicts.claims import CONTRADICTED, HOLDS, Evaluation
from sweeps.grid import AutoSeeds

LOG = "seeds_auto.log"  # the seeds=auto output kept beside a report (results.runs.stages reads it)
FUTILITY_STOP = "stopped for futility"


UNDECIDED = "undecided at the cap"


RUNNING = "undecided, still running"


CONFIRMATORY_ROLE, REPLICATION_ROLE, SECOND_READING_ROLE = "confirmatory", "replication", "second reading"


Arm = tuple[str, ...]


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

    @property
    def word(self) -> str:
        """The verdict in the report's words."""
        return {FUTILE: FUTILITY_STOP, INCONCLUSIVE: UNDECIDED, CONTINUE: RUNNING}.get(self.verdict, self.verdict)

    @property
    def rci_text(self) -> str:
        return f"RCI [{self.rci_low:+.4f}, {self.rci_high:+.4f}]" if math.isfinite(self.rci_low) else "RCI (-inf, +inf)"

    @property
    def text(self) -> str:
        """``stopped for futility at stage 2 (n=6), RCI [-0.1270, +0.1850]``."""
        return f"{self.word} at stage {self.stage} (n={self.n}), {self.rci_text}"


@dataclass(frozen=True)
class DesignRecord:
    """The design a seeds=auto grid ran: its settings, its primary claims and the log they came from."""

    auto: AutoSeeds
    claims: tuple[str, ...]
    log: Path

    @property
    def design(self) -> Design:
        return design_of(self.auto, len(self.claims))


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


def verdict_at(design: Design, evaluation: Evaluation, arms: list[Arm] | None = None) -> Verdict:
    """The first decision other than ``continue`` over the looks the runs reach (or the last one),
    with its stage and repeated confidence interval."""
    pairs = paired_diffs(evaluation)
    claimed = evaluation.row.label if evaluation.row is not None else "?"
    label = f"{claimed} vs {evaluation.lines[0].other.label} ({evaluation.metric})"
    effect = evaluation.claim.paper_effect
    arms = arms or []
    result = Verdict(evaluation.claim.id, label, len(pairs), math.nan, None, math.inf, CONTINUE, CONTINUE, arms)
    for k, size in enumerate(design.looks):
        if len(pairs) < size:
            break
        diffs = [d for _, d in pairs[:size]]
        mean, sd = statistics.fmean(diffs), statistics.stdev(diffs)
        decision = design.decide(diffs, effect)
        statistic = mean / (sd / math.sqrt(size)) if sd > 0 else None
        low, high = design.rci(diffs)
        result = Verdict(
            evaluation.claim.id,
            label,
            size,
            mean,
            statistic,
            design.boundaries[k],
            decision,
            "",
            arms,
            k + 1,
            low,
            high,
        )
        if decision != CONTINUE:
            break
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
        verdict = verdict_at(design, e)
        if verdict.stage == 0:  # the runs reach no look
            continue
        e.fixed_verdict = e.verdict_text + (f" ({e.reason})" if e.reason and e.reason not in e.verdict_text else "")
        e.verdict, e.lean, e.reason = verdict.word, "", ""
        e.sequential = verdict
        decided.append(verdict)
    return decided


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
