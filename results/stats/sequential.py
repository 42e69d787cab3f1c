"""A group-sequential design over seeds: add seeds in stages, stop each primary claim as soon as
its paired t statistic crosses a boundary, and keep the family-wise error at ``alpha``.

The design (Lan & DeMets 1983, "Discrete sequential boundaries for clinical trials", Biometrika
70:659; Jennison & Turnbull 2000, "Group Sequential Methods with Applications to Clinical Trials",
ch. 7 (alpha spending) and ch. 5 (the t statistic)):

* the family: Bonferroni over the ``m`` primary claims, each gets ``alpha / m`` (Holm's step-down
  is not used across looks: with a sequential boundary its gain is small and its proof longer);
* within a claim: the two-sided paired t-test is looked at after each stage, n_k = k·stage seeds
  per arm up to ``n_max``; the claim's share is spent over the information fractions
  t_k = n_k / n_max by a Lan-DeMets spending function, O'Brien-Fleming type
  a(t) = 2 - 2·Φ(z_{1-a/2} / √t) (default) or Pocock type a(t) = a·ln(1 + (e - 1)·t);
* the boundaries c_k for |T_k| (T_k = mean / (sd / √n_k), df n_k - 1) are calibrated by
  simulation: under the null, T_k does not depend on the SD, so ``paths`` seeded standard-normal
  paths give P(first |T_j| > c_j at look k) = a(t_k) - a(t_{k-1}) look by look. An increment
  worth fewer than :data:`MIN_CROSSINGS` paths gives c_k = inf (no stop at that look; conservative).
  The decisions' bounds use :data:`CALIBRATION_PATHS` (4M): a calibration sample's noise moves the
  error the bounds spend by about sqrt(share / paths), 0.00018 per claim at 400k (the 0.01267 a
  6M-path check found for 0.0125), 0.00006 at 4M; searches over caps (``sequential_seeds_needed``)
  use :data:`PLANNING_PATHS`, a plan's precision;
* efficacy in both directions: |T_k| > c_k rejects, and the sign says *holds* (the paper's
  direction) or *contradicted* (against it);
* futility, one-sided and non-binding (it can only lower the type-I error, and the bounds are
  calibrated without it): at an interim look, a claim stops *futile* only when the one-sided
  1 - share confidence bound on the paper's side excludes the paper's effect (paper effect -0.036:
  mean - t_{1-share, n-1}·se > -0.036). Evidence stronger than the paper's effect never stops a
  claim for futility, so the power is non-decreasing in the true effect in the paper's direction
  (``benchmarks/sequential_design.py``). Off with ``futility=False``;
* the interval reported at the look where a claim stops (or at the cap) is the repeated
  confidence interval (Jennison & Turnbull 1989, JRSS B 51:305; 2000, ch. 9): mean ± c_k·se with
  the efficacy bound of that look, which covers the true difference with probability 1 - share
  simultaneously at every look, whenever the design stops (an infinite bound gives (-inf, +inf)).

Decisions per claim per look: ``reject`` (the sign says holds or contradicted), ``continue``,
``futile``, or ``inconclusive`` at the cap.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from functools import lru_cache

import numpy as np
from scipy.stats import norm
from scipy.stats import t as student_t

from mesh_model import ConfigError
from sweeps.grid import SPENDING, check_seed_stages

CALIBRATION_PATHS = 4_000_000
PLANNING_PATHS = 400_000
CALIBRATION_SEED = 20_260_101
MIN_CROSSINGS = 10  # a look whose alpha increment is worth fewer calibration paths gets no bound (inf)
_CHUNK = 250_000  # calibration paths drawn at a time (their |T| kept as float32: 16 bytes a path a look)
# nats: SD of per-seed differences assumed when no finished runs say otherwise. At least the largest SD
# of a primary claim's paired differences in the committed tiny grids (results/cpu-reproduction/*/runs.csv,
# paired on common seeds: 0.0515, MeSH vs anchor in one-pass/schemes on 6 common seeds; tests/test_sequential.py checks it).
PRIOR_SD = 0.055
PRIOR_SD_SOURCE = (
    "prior SD 0.055 (at least the largest in the committed tiny grids, 0.0515: MeSH vs anchor, one-pass schemes)"
)

REJECT, CONTINUE, FUTILE, INCONCLUSIVE = "reject", "continue", "futile", "inconclusive"


def spent(fraction: float, alpha: float, spending: str = "obrien_fleming") -> float:
    """The two-sided alpha spent by information fraction ``fraction`` (Lan-DeMets)."""
    if fraction <= 0:
        return 0.0
    fraction = min(fraction, 1.0)
    if spending == "pocock":
        return alpha * math.log(1.0 + (math.e - 1.0) * fraction)
    return float(2.0 - 2.0 * norm.cdf(norm.ppf(1.0 - alpha / 2.0) / math.sqrt(fraction)))


@dataclass(frozen=True)
class Design:
    """``stage`` seeds per arm per look, up to ``n_max``; ``alpha`` over ``claims`` primary claims."""

    stage: int = 3
    n_max: int = 12
    alpha: float = 0.05
    claims: int = 1
    spending: str = "obrien_fleming"
    futility: bool = True
    calibration_paths: int = CALIBRATION_PATHS

    def __post_init__(self) -> None:
        check_seed_stages(self.stage, self.n_max, self.alpha)
        if self.claims < 1:
            raise ConfigError("seeds=auto", "no primary claim", "a grid whose runs test a primary claim")
        if self.spending not in SPENDING:
            raise ConfigError("seeds.spending", self.spending, " or ".join(SPENDING))

    @property
    def share(self) -> float:
        """Each claim's alpha (Bonferroni over the primary claims)."""
        return self.alpha / self.claims

    @property
    def looks(self) -> list[int]:
        """Seeds per arm at each look: stage, 2·stage, ..., and n_max last."""
        sizes = list(range(self.stage, self.n_max, self.stage))
        return [*sizes, self.n_max]

    @property
    def boundaries(self) -> list[float]:
        return list(_boundaries(tuple(self.looks), self.share, self.spending, self.calibration_paths))

    def look_index(self, n: int) -> int:
        """The look a claim with ``n`` seeds per arm is at (the last one that many seeds reach)."""
        reached = [k for k, size in enumerate(self.looks) if size <= n]
        if not reached:
            raise ValueError(f"{n} seeds per arm reach no look of {self.looks}")
        return reached[-1]

    def decide(self, diffs: Sequence[float], effect: float | None = None) -> str:
        """The decision on one claim's per-seed paired differences (claimed - other) at its look."""
        n = len(diffs)
        k = self.look_index(n)
        values = np.asarray(diffs, dtype=float)
        mean, sd = float(values.mean()), float(values.std(ddof=1))
        last = k == len(self.looks) - 1
        if not sd > 0:
            return INCONCLUSIVE if last else CONTINUE
        statistic = mean / (sd / math.sqrt(n))
        if abs(statistic) > self.boundaries[k]:
            return REJECT
        if last:
            return INCONCLUSIVE
        if self.futility and effect and _futile(mean, sd, n, effect, self.share):
            return FUTILE
        return CONTINUE

    def rci(self, diffs: Sequence[float]) -> tuple[float, float]:
        """The repeated confidence interval at the look ``len(diffs)`` reaches: mean ± c_k·se."""
        values = np.asarray(diffs, dtype=float)
        n = len(values)
        bound = self.boundaries[self.look_index(n)]
        mean, sd = float(values.mean()), float(values.std(ddof=1))
        half = bound * sd / math.sqrt(n) if math.isfinite(bound) else math.inf
        return mean - half, mean + half

    def power(
        self, effect: float, sd: float, paths: int = 200_000, seed: int = 1, paper_effect: float | None = None
    ) -> float:
        """P(reject in the direction of ``effect``) for one claim whose true difference is ``effect``
        (simulated, futility against ``paper_effect``, by default ``effect`` itself, included)."""
        diffs = np.random.default_rng(seed).normal(effect, sd, size=(paths, self.n_max))
        futile_at = effect if paper_effect is None else paper_effect
        return float(np.mean(decide_paths(self, diffs, futile_at) == np.sign(effect)))


SEQUENTIAL_SEARCH = 3  # caps are searched up to this many times the design's own cap


def sequential_seeds_needed(
    design: Design, effect: float, sd: float, fixed_n: int, target: float = 0.8, paths: int = 50_000
) -> int | None:
    """The smallest cap (a whole number of stages, from ``fixed_n`` up) at which the seeds=auto
    design of ``design``'s stage, alpha and claims reaches ``target`` power for ``effect`` at ``sd``
    (simulated, :meth:`Design.power`, its bounds calibrated for that cap): what "seeds needed" means
    for a grid that runs the sequential design, never below the fixed-n count, since the design
    spends alpha over its looks and stops some paths for futility. Found by bisection over caps
    (power grows with the cap); None when no cap up to :data:`SEQUENTIAL_SEARCH` times the design's
    own cap reaches it (each cap's calibration is a simulation: the search stays that short)."""
    stage = design.stage

    def reaches(cap: int) -> bool:
        trial = Design(stage, cap, design.alpha, design.claims, design.spending, design.futility, PLANNING_PATHS)
        return trial.power(effect, sd, paths=paths) >= target

    low = max(2 * stage, -(-fixed_n // stage) * stage)
    high = SEQUENTIAL_SEARCH * design.n_max - (SEQUENTIAL_SEARCH * design.n_max) % stage
    if low > high or not reaches(high):
        return None
    while low < high:
        middle = low + ((high - low) // stage // 2) * stage
        if reaches(middle):
            high = middle
        else:
            low = middle + stage
    return high


def futility_bound(mean: float, sd: float, n: int, effect: float, share: float) -> float:
    """The one-sided 1 - share confidence bound on the paper's side of the mean (the lower bound
    when the paper's effect is negative, the upper when positive)."""
    half = float(student_t.ppf(1.0 - share, n - 1)) * sd / math.sqrt(n)
    return mean - half if effect < 0 else mean + half


def _futile(mean: float, sd: float, n: int, effect: float, share: float) -> bool:
    """The paper's effect lies beyond the one-sided bound (on the paper's side, never the other)."""
    bound = futility_bound(mean, sd, n, effect, share)
    return bound > effect if effect < 0 else bound < effect


def running_t(diffs: np.ndarray, looks: Sequence[int]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(T, mean, sd) at each look for each row of ``diffs`` (paths x seeds): arrays paths x looks."""
    means = np.stack([diffs[:, :n].mean(axis=1) for n in looks], axis=1)
    sds = np.stack([diffs[:, :n].std(axis=1, ddof=1) for n in looks], axis=1)
    roots = np.sqrt(np.asarray(looks, dtype=float))
    with np.errstate(divide="ignore", invalid="ignore"):
        statistics = np.where(sds > 0, means / (sds / roots), 0.0)
    return statistics, means, sds


@lru_cache(maxsize=64)
def _boundaries(
    looks: tuple[int, ...], share: float, spending: str, paths: int = CALIBRATION_PATHS
) -> tuple[float, ...]:
    return calibrate(looks, share, spending, paths)


def calibrate(
    looks: Sequence[int], share: float, spending: str, paths: int, seed: int = CALIBRATION_SEED
) -> tuple[float, ...]:
    """The efficacy bounds c_k that spend ``share`` over ``looks`` by ``spending``, from ``paths``
    seeded standard-normal paths (drawn in chunks; each look's bound is the |T| the increment's
    number of surviving paths exceed, midway to the next)."""
    looks = list(looks)
    rng = np.random.default_rng(seed)
    statistics = np.empty((paths, len(looks)), dtype=np.float32)
    for start in range(0, paths, _CHUNK):
        size = min(_CHUNK, paths - start)
        statistics[start : start + size] = np.abs(running_t(rng.standard_normal((size, looks[-1])), looks)[0])
    alive = np.ones(paths, dtype=bool)
    bounds = []
    for k, n in enumerate(looks):
        increment = spent(n / looks[-1], share, spending) - (
            spent(looks[k - 1] / looks[-1], share, spending) if k else 0
        )
        crossings = int(math.floor(increment * paths))
        if crossings < MIN_CROSSINGS:
            bounds.append(math.inf)
            continue
        survivors = statistics[alive, k]
        if crossings >= survivors.size:
            bounds.append(0.0)
            alive[:] = False
            continue
        top = np.sort(np.partition(survivors, survivors.size - crossings - 1)[survivors.size - crossings - 1 :])[::-1]
        bound = 0.5 * (float(top[crossings - 1]) + float(top[crossings]))  # P(|T| > bound) is the increment
        bounds.append(bound)
        alive &= statistics[:, k] <= bound
    return tuple(bounds)


def decide_paths(
    design: Design, diffs: np.ndarray, effect: float | None = None, two_sided_futility: bool = False
) -> np.ndarray:
    """Each path's outcome (paths x n_max differences): +1 / -1 rejected with that sign, 0 not.
    ``two_sided_futility``: the rule before issue 37 (futile when the two-sided 1 - share interval
    excludes the effect on either side), kept only for benchmarks/sequential_design.py to compare."""
    return path_outcomes(design, diffs, effect, two_sided_futility)[0]


def futile_stop_chance(
    design: Design, truth: float, sd: float, paper_effect: float, paths: int = 200_000, seed: int = 2
) -> float:
    """P(the design stops a claim for futility) when its true mean difference is ``truth`` with
    per-seed SD ``sd``, futility judged against ``paper_effect`` (simulated, seeded). At ``truth`` =
    ``paper_effect`` it is how often a futility stop happens although the paper's effect is real: the
    futility bound is a one-look bound, so this is about ``share`` per interim look, not 0."""
    diffs = np.random.default_rng(seed).normal(truth, sd, size=(paths, design.n_max))
    return float(np.mean(path_outcomes(design, diffs, paper_effect)[1]))


def path_outcomes(
    design: Design, diffs: np.ndarray, effect: float | None = None, two_sided_futility: bool = False
) -> tuple[np.ndarray, np.ndarray]:
    """(outcome, futile) per path: the sign a path was rejected with (0: not), and whether it stopped
    for futility at an interim look (efficacy is looked at first at each look, as :meth:`Design.decide`)."""
    statistics, means, sds = running_t(diffs, design.looks)
    bounds = np.asarray(design.boundaries)
    outcome = np.zeros(diffs.shape[0], dtype=int)
    stopped_futile = np.zeros(diffs.shape[0], dtype=bool)
    open_ = np.ones(diffs.shape[0], dtype=bool)
    for k, n in enumerate(design.looks):
        crossed = open_ & (np.abs(statistics[:, k]) > bounds[k])
        outcome[crossed] = np.sign(statistics[crossed, k]).astype(int)
        open_ &= ~crossed
        if design.futility and effect and k < len(design.looks) - 1:
            if two_sided_futility:
                half = student_t.ppf(1.0 - design.share / 2.0, n - 1) * sds[:, k] / math.sqrt(n)
                futile = (means[:, k] - half > effect) | (means[:, k] + half < effect)
            else:
                half = student_t.ppf(1.0 - design.share, n - 1) * sds[:, k] / math.sqrt(n)
                futile = (means[:, k] - half > effect) if effect < 0 else (means[:, k] + half < effect)
            stopped_futile |= open_ & futile
            open_ &= ~futile
    return outcome, stopped_futile


def naive_paths(diffs: np.ndarray, looks: Sequence[int], alpha: float) -> np.ndarray:
    """Reject when any look's plain two-sided t-test at ``alpha`` does (no spending): True / False."""
    statistics = np.abs(running_t(diffs, looks)[0])
    critical = np.asarray([student_t.ppf(1.0 - alpha / 2.0, n - 1) for n in looks])
    return (statistics > critical).any(axis=1)


def family_paths(design: Design, diffs: np.ndarray, effect: float | None = None) -> np.ndarray:
    """Each claim's outcome on paths x claims x n_max differences (claims may correlate): paths x claims."""
    return np.stack([decide_paths(design, diffs[:, j, :], effect) for j in range(diffs.shape[1])], axis=1)


def null_grids(cov: np.ndarray, paths: int, n_max: int, seed: int = 0) -> np.ndarray:
    """Paths x claims x n_max per-seed differences under the null, seeds independent, claims
    correlated within a seed by ``cov`` (claims x claims)."""
    rng = np.random.default_rng(seed)
    draws = rng.multivariate_normal(np.zeros(len(cov)), cov, size=(paths, n_max))  # paths x n x claims
    return np.transpose(draws, (0, 2, 1))


def shared_arm_cov(claims: int, sd: float) -> np.ndarray:
    """Claims that share one arm (MeSH - baseline_j, every arm SD sd/√2): correlation 1/2."""
    return np.full((claims, claims), sd**2 / 2.0) + np.eye(claims) * sd**2 / 2.0
