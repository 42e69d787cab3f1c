"""The claims decided once per report: the verdict engine run on the rows, the ``seeds=auto`` design's
decisions put in place of the fixed-n verdicts of the claims it decided, the confirmatory roles
marked, each paired verdict's test of Δ = 0 taken again by the sign-flip test
(:mod:`results.verdicts.sign_flip`), and (with the curves) each verdict followed along training.
Every renderer reads this one :class:`~results.verdicts.claims.Decided`; none of them evaluates
again."""

from __future__ import annotations

import math
from collections.abc import Sequence

import pandas as pd

from results.rows.aggregate import Results
from results.verdicts.claims import NOT_TESTED, ClaimSet, Decided, Evaluation
from results.verdicts.engine import evaluate
from results.verdicts.over_training import Trajectory, _key, common_steps, describe, results_at_step
from results.verdicts.schema import load_claims
from results.verdicts.sequential import DesignRecord, apply_design, apply_roles
from results.verdicts.sign_flip import check as check_sign_flip


def decide(
    results: Results,
    claims: ClaimSet | None = None,
    design: DesignRecord | None = None,
    declared: dict | None = None,
    folder_name: str = "",
    curves: pd.DataFrame | None = None,
) -> Decided:
    """Evaluate ``claims`` (the packaged file unless given) on ``results``; ``design``: the decisions
    that replace the primary verdicts; ``declared``: the confirmatory family and ``folder_name`` the
    report's folder (confirmatory there, replication elsewhere); ``curves``: the validation history,
    for the descriptive trajectories."""
    claims = claims or load_claims()
    evaluations = evaluate(results, claims)
    if design is not None:
        apply_design(evaluations, design)
    apply_roles(evaluations, declared, folder_name)
    check_sign_flip(evaluations, claims.alpha)
    trajectories: Sequence[Trajectory] = ()
    if curves is not None:
        trajectories = claims_over_training(results, curves, evaluations, claims)
    return Decided(claims, evaluations, list(trajectories), design, declared)


def claims_over_training(
    results: Results, curves: pd.DataFrame, final: Sequence[Evaluation], claims: ClaimSet | None = None
) -> list[Trajectory]:
    """For each evaluation of ``final`` (the claims on the final values), its verdict at every step of
    :func:`common_steps`, from :func:`results.verdicts.engine.evaluate` on :func:`results_at_step`. A step's
    evaluation is matched to the final one by claim, block, metric and claimed row, then in order (the
    compared rows come in the block's order at every step); one with no match keeps "not tested"."""
    claims = claims or load_claims()
    steps = common_steps(curves)
    tokens = curves.groupby("step")["tokens"].mean()
    verdicts: dict[int, list[str]] = {i: [] for i in range(len(final))}
    for step in steps:
        at_step = evaluate(results_at_step(results, curves, step), claims)
        by_key: dict[tuple, list[Evaluation]] = {}
        for evaluation in at_step:
            by_key.setdefault(_key(evaluation), []).append(evaluation)
        seen: dict[tuple, int] = {}
        for i, evaluation in enumerate(final):
            key = _key(evaluation)
            matches, k = by_key.get(key, []), seen.get(key, 0)
            seen[key] = k + 1
            verdicts[i].append(describe(matches[k]) if k < len(matches) else NOT_TESTED)
    return [
        Trajectory(e, tuple(steps), tuple(float(tokens.get(s, math.nan)) for s in steps), tuple(verdicts[i]))
        for i, e in enumerate(final)
    ]


__all__ = ["claims_over_training", "decide"]
