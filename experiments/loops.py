"""Training at sampled loop counts: the ``loops`` config group (``experiments/conf/loops/``).

Each optimizer step draws its loop count K_s from a declared distribution; validation, the probes
and ``mesh-eval`` run at the layout's K (the run's "training K" in every report):

* ``fixed``              K_s = K, the layout's (the default: every run before this existed).
* ``poisson_lognormal``  Huginn's (Geiping et al. 2025): rate ~ LogNormal(mu, sigma) with
                         mu = ln(mean - 1) - sigma^2 / 2, K_s = min(max, 1 + Poisson(rate)). Uncapped,
                         E[K_s] = ``mean``; its heavy tail is what the cap ``max`` cuts.
* ``uniform``            K_s uniform on {``min``, ..., ``max``}.

The draw is a pure function of (seed, optimizer step) (:func:`draw`: numpy's generator seeded by
the pair), never a stateful RNG: every micro-batch and every DDP rank of a step draw the same K_s,
and a resumed run draws what the uninterrupted one drew, bit for bit. ``backprop`` = k truncates
backprop to the last min(K_s, k) core steps (the earlier ones run without autograd).

The FLOP model, the cost estimate and ``flops_per_token`` use the exact expectations E[K_s] and
E[min(K_s, k)] (:meth:`LoopsConfig.expected`: closed form for ``uniform``, Gauss-Hermite quadrature
over the log-normal for ``poisson_lognormal``). A sampled run builds per-step parameters (MeSH's
routers, the static/dynamic coefficients) for ``max`` steps (``ModelConfig.max_loops``), unless
MeSH shares its routers (``model_overrides.mesh_routers=shared``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from mesh_model.errors import ConfigError

DISTRIBUTIONS = ("fixed", "poisson_lognormal", "uniform")
_STREAM = 0x100B5  # keeps the loop draws apart from any other use of (seed, step)
_NODES = 96  # Gauss-Hermite nodes: the expectations agree with 1e6-draw means to their noise


@dataclass
class LoopsConfig:
    """The loop count of each training step: fixed (the layout's K) or drawn from (seed, step) (experiments/loops.py)."""

    distribution: str = "fixed"
    mean: float | None = None  # poisson_lognormal: the uncapped E[K]
    sigma: float = 0.5  # poisson_lognormal: the log-normal's sigma (Huginn's 0.5)
    min: int = 1  # uniform: the smallest K
    max: int | None = None  # the cap (poisson_lognormal) or the largest K (uniform)
    backprop: int | None = None  # gradients through the last this many core steps (null: all)

    def validate(self) -> None:
        if self.distribution not in DISTRIBUTIONS:
            raise ConfigError("loops.distribution", self.distribution, f"use one of {', '.join(DISTRIBUTIONS)}")
        if self.backprop is not None and (not _is_int(self.backprop) or self.backprop < 1):
            raise ConfigError("loops.backprop", self.backprop, "a number of core steps >= 1 (null: all)")
        if self.distribution == "fixed":
            for name in ("mean", "max"):
                if getattr(self, name) is not None:
                    raise ConfigError(f"loops.{name}", getattr(self, name), "loops=fixed runs the layout's K: drop it")
            return
        cap = self.max
        if isinstance(cap, bool) or not isinstance(cap, int) or cap < 1:
            raise ConfigError("loops.max", cap, f"loops={self.distribution} needs its cap, an integer >= 1")
        if self.distribution == "uniform":
            if not _is_int(self.min) or not 1 <= self.min <= cap:
                raise ConfigError("loops.min", self.min, f"an integer from 1 to loops.max={cap}")
            return
        mean = self.mean
        if isinstance(mean, bool) or not isinstance(mean, (int, float)) or not 1 < mean < math.inf:
            raise ConfigError("loops.mean", mean, "poisson_lognormal needs its mean, a number > 1")
        if isinstance(self.sigma, bool) or not isinstance(self.sigma, (int, float)) or not 0 < self.sigma < 10:
            raise ConfigError("loops.sigma", self.sigma, "a number in (0, 10)")

    @property
    def sampled(self) -> bool:
        return self.distribution != "fixed"

    @property
    def cap(self) -> int | None:
        """The most loops a step can draw (None: fixed)."""
        return self.max if self.sampled else None

    def draw(self, loops: int, seed: int, step: int) -> int:
        """K_s of optimizer ``step`` of a run of ``seed`` whose layout has ``loops`` = K."""
        if not self.sampled:
            return loops
        assert self.max is not None
        rng = np.random.default_rng([_STREAM, seed, step])
        if self.distribution == "uniform":
            return int(rng.integers(self.min, self.max + 1))
        assert self.mean is not None
        mu = math.log(self.mean - 1) - self.sigma**2 / 2
        return int(min(self.max, 1 + rng.poisson(rng.lognormal(mu, self.sigma))))

    def grad_loops(self, drawn: int) -> int | None:
        """The core steps a step of ``drawn`` loops backpropagates through (None: all)."""
        return None if self.backprop is None or self.backprop >= drawn else self.backprop

    def expected(self, loops: int) -> tuple[float, float]:
        """(E[K_s], E[core steps backpropagated]) for a layout of K = ``loops``."""
        if not self.sampled:
            return float(loops), float(loops if self.backprop is None else min(loops, self.backprop))
        assert self.max is not None
        grad = self.max if self.backprop is None else min(self.max, self.backprop)
        return self._expected_min(self.max), self._expected_min(grad)

    def _expected_min(self, m: int) -> float:
        """E[min(K_s, m)] for m <= max."""
        if self.distribution == "uniform":
            values = np.arange(self.min, (self.max or 0) + 1)
            return float(np.minimum(values, m).mean())
        # K = 1 + N, N ~ Poisson(rate): E[min(K, m)] = 1 + sum_{j=1}^{m-1} P(N >= j), averaged over
        # the log-normal rate by Gauss-Hermite quadrature.
        assert self.mean is not None
        x, w = np.polynomial.hermite.hermgauss(_NODES)
        mu = math.log(self.mean - 1) - self.sigma**2 / 2
        rate = np.exp(mu + math.sqrt(2) * self.sigma * x)
        below = np.zeros_like(rate)  # P(N < j) as j grows
        term = np.exp(-rate)  # P(N = i)
        total = np.ones_like(rate)
        for i in range(m - 1):
            below = below + term
            total = total + (1 - below)
            term = term * rate / (i + 1)
        return float((w * total).sum() / math.sqrt(math.pi))


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


__all__ = ["DISTRIBUTIONS", "LoopsConfig"]
