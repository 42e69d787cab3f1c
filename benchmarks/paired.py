"""Paired timing statistics: A and B measured in alternation, the ratio taken pair by pair.

On a shared machine the speed drifts as other jobs start and stop. Timing all of A's steps and
then all of B's and dividing their medians charges that drift to whichever ran in the slower
minute (one such run measured ours/HF 1.20 where interleaved steps gave 0.93). Here every round
runs each candidate once, in a fresh random order, so the two steps of a pair share the machine's
state of that moment; the ratio of each pair cancels whatever slows both, and the median of the
ratios, with a seeded bootstrap 95% interval, is the number to report.

On a small shared CPU machine even a pair is not enough with wall-clock time: when the machine
has more runnable threads than cores, a multi-threaded step waits at every barrier for a thread
that was descheduled (2-thread steps measured 3-20x their quiet time, single pairs 0.1x-10x).
The CPU benchmarks therefore time one thread by its CPU time (``CLOCKS["cpu"]``), which counts
the work done and not the time spent waiting for a core; ``wall`` is there for a quiet machine.
"""

from __future__ import annotations

import os
import random
import statistics
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

import numpy as np

Measure = Callable[[], float]  # does one unit of work (a step, a block of matmuls), returns its seconds
CLOCKS: dict[str, Callable[[], float]] = {"cpu": time.process_time, "wall": time.perf_counter}


def interleave(measures: Mapping[str, Measure], rounds: int, seed: int = 0, warmup: int = 0) -> dict[str, list[float]]:
    """Each measure's times, aligned by round: every round runs each measure once in a fresh
    random order (seeded), so no one always goes first; ``warmup`` rounds run first, dropped."""
    rng = random.Random(seed)
    names = list(measures)
    times: dict[str, list[float]] = {name: [] for name in names}
    for index in range(warmup + rounds):
        rng.shuffle(names)
        for name in names:
            seconds = measures[name]()
            if index >= warmup:
                times[name].append(seconds)
    return times


def bootstrap_median_interval(
    values: Sequence[float], confidence: float = 0.95, resamples: int = 4000, seed: int = 0
) -> tuple[float, float]:
    """Percentile bootstrap interval of the median: the same ``seed`` gives the same interval."""
    data = np.asarray(values, dtype=float)
    rng = np.random.default_rng(seed)
    medians = np.median(data[rng.integers(0, len(data), size=(resamples, len(data)))], axis=1)
    tail = (1 - confidence) / 2
    low, high = np.quantile(medians, [tail, 1 - tail])
    return float(low), float(high)


@dataclass(frozen=True)
class PairedRatio:
    """The median of per-pair ratios, its bootstrap interval (low, high) and the spread (min, max)."""

    median: float
    low: float
    high: float
    min: float
    max: float
    pairs: int

    def scaled(self, factor: float) -> PairedRatio:
        """The same statistic of ``factor`` x every ratio (factor > 0), e.g. a time ratio into MFU."""
        return PairedRatio(*(factor * v for v in (self.median, self.low, self.high, self.min, self.max)), self.pairs)

    def format(self, digits: int = 3, percent: bool = False) -> str:
        """``0.912 [0.897, 0.925]`` (median [95% interval]); ``percent`` prints 100x with a %."""
        scale, unit = (100.0, "%") if percent else (1.0, "")
        median, low, high = (f"{scale * v:.{digits}f}{unit}" for v in (self.median, self.low, self.high))
        return f"{median} [{low}, {high}]"

    def spread(self, digits: int = 3, percent: bool = False) -> str:
        scale, unit = (100.0, "%") if percent else (1.0, "")
        return f"{scale * self.min:.{digits}f}{unit}-{scale * self.max:.{digits}f}{unit} (n={self.pairs})"


def paired_ratio(
    numerators: Sequence[float], denominators: Sequence[float], confidence: float = 0.95, seed: int = 0
) -> PairedRatio:
    """Median of ``numerators[i] / denominators[i]`` over the pairs, with its seeded interval."""
    if len(numerators) != len(denominators) or not numerators:
        raise ValueError(f"need equally many pairs on both sides, got {len(numerators)} and {len(denominators)}")
    ratios = [a / b for a, b in zip(numerators, denominators, strict=True)]
    low, high = bootstrap_median_interval(ratios, confidence, seed=seed)
    return PairedRatio(statistics.median(ratios), low, high, min(ratios), max(ratios), len(ratios))


def load_average() -> str:
    """The machine's 1/5/15-minute load averages, printed beside a result: how shared it was."""
    return " ".join(f"{load:.1f}" for load in os.getloadavg())


def verdict(ratio: PairedRatio, at_most: float | None = None, at_least: float | None = None) -> str:
    """Whether a target is met, judged on the interval: "yes" when all of it meets the target,
    "no" when none of it does, "within noise" when it straddles the target."""
    if at_most is not None:
        return "yes" if ratio.high <= at_most else "no" if ratio.low > at_most else "within noise"
    if at_least is not None:
        return "yes" if ratio.low >= at_least else "no" if ratio.high < at_least else "within noise"
    raise ValueError("give a target: at_most or at_least")


__all__ = [
    "Measure",
    "PairedRatio",
    "bootstrap_median_interval",
    "interleave",
    "load_average",
    "paired_ratio",
    "verdict",
]
