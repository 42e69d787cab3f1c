"""The words of the depth study's declared rule (sweeps/conf/sweep/depth.yaml), from intervals.

A curve's shape past the training K, from the t interval of the per-seed d = log PPL(K') - log
PPL(K): "improves" when the whole interval is below 0, "worsens" when above, "flat" when it lies
inside +-:data:`FLAT` (1% PPL either way), else "inconclusive". A paired difference of two arms (d
of one minus d of the other, seed by seed) is read the same way: "lower", "higher", "equal",
"inconclusive".
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import pandas as pd

from results.rows.depth import DepthArm
from results.stats.shape import MeanInterval, t_interval, value_at

FLAT = 0.01  # log PPL: within 1% either way
IMPROVES, WORSENS, FLAT_WORD, INCONCLUSIVE = "improves", "worsens", "flat", "inconclusive"
EXTRAPOLATES = (IMPROVES, FLAT_WORD)  # the declared meaning of "extrapolates"


def shape(interval: MeanInterval) -> str:
    """The declared verdict on d(K') = log PPL(K') - log PPL(K): the first that holds of improves,
    worsens, flat, else inconclusive (also for fewer than two seeds)."""
    if interval.n < 2 or not math.isfinite(interval.low):
        return INCONCLUSIVE
    if interval.high < 0:
        return IMPROVES
    if interval.low > 0:
        return WORSENS
    if interval.low >= -FLAT and interval.high <= FLAT:
        return FLAT_WORD
    return INCONCLUSIVE


def difference(interval: MeanInterval) -> str:
    """A paired difference of two arms' d, in the same words as :func:`shape`: lower, higher, equal
    (within +-FLAT), inconclusive."""
    return {IMPROVES: "lower", WORSENS: "higher", FLAT_WORD: "equal"}.get(shape(interval), INCONCLUSIVE)


# --- the declared rule applied to a study's arms ----------------------------------------------------

EXIT_FRACTIONS = (0.25, 0.5, 0.75)  # of the full loops: where each exit curve is read


@dataclass
class ArmShape:
    """One arm's curve past its training K: d(K') per seed and the declared verdict, for each K'
    asked (4 and 8 in the depth study: 2K and 4K at K = 2)."""

    arm: DepthArm
    d: dict[int, MeanInterval] = field(default_factory=dict)
    verdict: dict[int, str] = field(default_factory=dict)


@dataclass
class PairedShape:
    """Two arms' d(K') paired by seed (``first`` minus ``second``) and its word."""

    first: DepthArm
    second: DepthArm
    loops: int
    interval: MeanInterval
    word: str


@dataclass
class ExitPoint:
    """An exit curve read at a fraction of the full loops: each seed's PPL there (NaN: not reached)."""

    arm: DepthArm
    criterion: str
    fraction: float
    loops: float  # the mean core steps per token read at
    ppl: list[float]
    full_ppl: list[float]  # each seed's PPL with no exit (eps = 0)


@dataclass
class DepthFindings:
    shapes: list[ArmShape]
    sampled_vs_fixed: list[PairedShape]  # per scheme (and rule): d(sampled) - d(fixed)
    rules: list[PairedShape]  # per fixed-K per-step row: d(cycle) - d(last)
    exits: list[ExitPoint]


def per_seed_d(arm: DepthArm, loops: int) -> pd.Series:
    """log PPL(K') - log PPL(K) per seed: each model against itself at its training K."""
    return arm.at(loops) - arm.at(arm.trained_loops)


def paired(first: DepthArm, second: DepthArm, loops: int) -> PairedShape:
    """d(K') of ``first`` minus ``second``'s, on the seeds both have."""
    a, b = per_seed_d(first, loops), per_seed_d(second, loops)
    common = [s for s in a.index if s in b.index]
    interval = t_interval([a[s] - b[s] for s in common])
    return PairedShape(first, second, loops, interval, difference(interval))


def decide_depth(arms: list[DepthArm], past: tuple[int, ...] = (4, 8)) -> DepthFindings:
    """The declared rule on every arm: the shape at each K' of ``past`` (read where the arm has it),
    sampled against fixed training per scheme and rule, the rules of each fixed-K per-step row against
    each other, and the exit curves at 25/50/75% of their full loops."""
    shapes = []
    for arm in arms:
        shape_of = ArmShape(arm)
        for k in past:
            if k in arm.loss and arm.trained_loops in arm.loss:
                shape_of.d[k] = t_interval(list(per_seed_d(arm, k)))
                shape_of.verdict[k] = shape(shape_of.d[k])
        shapes.append(shape_of)
    first_past = past[0]
    fixed = {(a.scheme, a.rule): a for a in arms if not a.sampled}
    sampled_vs_fixed = [
        paired(a, fixed[(a.scheme, a.rule)], first_past) for a in arms if a.sampled and (a.scheme, a.rule) in fixed
    ]
    rules = []
    for arm in arms:
        if not arm.sampled and arm.rule == "cycle":
            last = [b for b in arms if b.row is arm.row and b.rule == "last"]
            rules += [paired(arm, last[0], first_past)] if last else []
    exits = []
    for arm in (a for a in arms if not a.exit.empty):
        for criterion, lines in arm.exit.groupby("criterion", sort=True):
            full = int(lines["loops"].max())
            for fraction in EXIT_FRACTIONS:
                target = fraction * full
                ppl, at_zero = [], []
                for seed in arm.seeds:
                    mine = lines[lines["seed"] == seed].sort_values("eps")
                    ppl.append(value_at(list(mine["loops_used"]), list(mine["ppl"]), target))
                    zero = mine[mine["eps"] == 0]["ppl"]
                    at_zero.append(float(zero.iloc[0]) if len(zero) else float("nan"))
                exits.append(ExitPoint(arm, str(criterion), fraction, target, ppl, at_zero))
    return DepthFindings(shapes, sampled_vs_fixed, rules, exits)


__all__ = [
    "EXTRAPOLATES",
    "FLAT",
    "difference",
    "shape",
    "ArmShape",
    "DepthFindings",
    "ExitPoint",
    "PairedShape",
    "decide_depth",
    "paired",
    "per_seed_d",
]
