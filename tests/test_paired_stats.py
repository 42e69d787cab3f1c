"""The paired statistics of benchmarks/paired.py on synthetic timings: what a shared machine does
to a benchmark (a slower machine, a drift in time, noise), and what the paired median makes of it;
and benchmarks/gpu.py, which cannot run here, dry-run on CPU through the same statistics."""

from __future__ import annotations

import shlex
import statistics
import sys
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
from paired import PairedRatio, bootstrap_median_interval, interleave, paired_ratio, verdict  # noqa: E402

TRUE_RATIO = 0.9  # A takes 0.9x B's time


class DriftingMachine:
    """A fake clock whose speed falls linearly with elapsed time: ``slowdown`` x slower at the end."""

    def __init__(self, steps: int, slowdown: float) -> None:
        self.elapsed_steps, self.steps, self.slowdown = 0, steps, slowdown

    def measure(self, seconds: float):
        def run() -> float:
            factor = 1 + (self.slowdown - 1) * self.elapsed_steps / self.steps
            self.elapsed_steps += 1
            return seconds * factor

        return run


def test_a_constant_factor_on_both_sides_leaves_the_ratio_unchanged() -> None:
    rng = np.random.default_rng(0)
    b = rng.lognormal(0.0, 0.2, 25)
    a = TRUE_RATIO * b * rng.lognormal(0.0, 0.05, 25)
    plain = paired_ratio(list(a), list(b))
    slowed = paired_ratio(list(3.7 * a), list(3.7 * b))
    assert slowed.median == pytest.approx(plain.median)
    assert (slowed.low, slowed.high) == pytest.approx((plain.low, plain.high))
    assert (slowed.min, slowed.max) == pytest.approx((plain.min, plain.max))


def test_a_drift_in_time_biases_sequential_medians_not_the_paired_median() -> None:
    rounds = 30
    sequential = DriftingMachine(2 * rounds, slowdown=1.5)
    a_times = [sequential.measure(TRUE_RATIO)() for _ in range(rounds)]  # all of A, then all of B
    b_times = [sequential.measure(1.0)() for _ in range(rounds)]
    sequential_ratio = statistics.median(a_times) / statistics.median(b_times)

    paired = DriftingMachine(2 * rounds, slowdown=1.5)
    times = interleave({"a": paired.measure(TRUE_RATIO), "b": paired.measure(1.0)}, rounds, seed=0)
    ratio = paired_ratio(times["a"], times["b"])

    assert abs(sequential_ratio - TRUE_RATIO) > 0.15  # B ran in the slower half
    assert ratio.median == pytest.approx(TRUE_RATIO, rel=0.01)
    assert ratio.low <= TRUE_RATIO <= ratio.high


def test_interleave_runs_each_measure_once_per_round_in_a_seeded_random_order() -> None:
    log: list[str] = []

    def named(name: str):
        def run() -> float:
            log.append(name)
            return float(len(log))

        return run

    times = interleave({"a": named("a"), "b": named("b"), "c": named("c")}, rounds=20, seed=3, warmup=2)
    assert {name: len(t) for name, t in times.items()} == {"a": 20, "b": 20, "c": 20}
    orders = [tuple(log[i : i + 3]) for i in range(0, len(log), 3)]
    assert len(orders) == 22 and all(sorted(order) == ["a", "b", "c"] for order in orders)
    assert len({order[0] for order in orders}) == 3  # nobody always goes first
    assert times["a"][0] == log.index("a", 6) + 1  # the 2 warm-up rounds (6 runs) dropped
    first_log = list(log)
    log.clear()
    interleave({"a": named("a"), "b": named("b"), "c": named("c")}, rounds=20, seed=3, warmup=2)
    assert log == first_log


def test_the_bootstrap_interval_is_seeded() -> None:
    values = list(np.random.default_rng(1).lognormal(0.0, 0.3, 15))
    assert bootstrap_median_interval(values, seed=7) == bootstrap_median_interval(values, seed=7)
    assert paired_ratio(values, [1.0] * 15, seed=7) == paired_ratio(values, [1.0] * 15, seed=7)


def test_the_interval_contains_the_true_ratio_on_noisy_pairs() -> None:
    """Noisy pairs (each step +-20%, plus bursts that slow both steps of a pair): the 95% interval of
    20 pairs covers the true ratio in nearly every one of 100 synthetic benchmarks."""
    covered = 0
    for seed in range(100):
        rng = np.random.default_rng(seed)
        load = rng.choice([1.0, 2.5], size=20, p=[0.7, 0.3])  # another job's bursts, shared by the pair
        b = load * rng.lognormal(0.0, 0.2, 20)
        a = TRUE_RATIO * load * rng.lognormal(0.0, 0.2, 20)
        ratio = paired_ratio(list(a), list(b))
        covered += ratio.low <= TRUE_RATIO <= ratio.high
    assert covered >= 88


def test_min_le_interval_le_max_and_the_median_inside() -> None:
    for seed in range(20):
        rng = np.random.default_rng(seed)
        n = int(rng.integers(1, 30))
        ratio = paired_ratio(list(rng.lognormal(0.0, 0.5, n)), list(rng.lognormal(0.0, 0.5, n)))
        assert ratio.min <= ratio.low <= ratio.median <= ratio.high <= ratio.max
        assert ratio.pairs == n


def test_scaled_and_formatted() -> None:
    ratio = paired_ratio([1.0, 2.0, 3.0], [2.0, 2.0, 2.0])
    assert ratio.median == 1.0 and (ratio.min, ratio.max) == (0.5, 1.5)
    mfu = ratio.scaled(0.4)
    assert (mfu.median, mfu.min, mfu.max) == pytest.approx((0.4, 0.2, 0.6))
    assert mfu.format(1, percent=True).startswith("40.0% [")
    assert ratio.spread() == "0.500-1.500 (n=3)"


def test_unequal_sides_are_refused() -> None:
    with pytest.raises(ValueError, match="equally many pairs"):
        paired_ratio([1.0, 2.0], [1.0])


def test_a_target_is_judged_on_the_interval() -> None:
    ratio = PairedRatio(median=1.02, low=1.01, high=1.04, min=0.9, max=1.2, pairs=20)
    assert verdict(ratio, at_most=1.05) == "yes"
    assert verdict(ratio, at_most=1.03) == "within noise"
    assert verdict(ratio, at_most=1.00) == "no"
    assert verdict(ratio, at_least=1.00) == "yes"
    assert verdict(ratio, at_least=1.03) == "within noise"
    assert verdict(ratio, at_least=1.05) == "no"
    with pytest.raises(ValueError, match="give a target"):
        verdict(ratio)


def test_the_gpu_benchmark_dry_runs_on_cpu(capsys: pytest.CaptureFixture[str]) -> None:
    """benchmarks/gpu.py's CPU side (arguments, model pairs, statistics, the table) on a tiny model."""
    import gpu

    gpu.main(shlex.split("--device cpu --presets tiny --seq 32 --batch 1 --pairs 3 --warmup 1 --no-compile"))
    rows = [line for line in capsys.readouterr().out.splitlines() if line.startswith(("| ours/HF", "| mesh/base"))]
    assert len(rows) == 2
    assert all("(n=3)" in row and "<= " in row for row in rows)
