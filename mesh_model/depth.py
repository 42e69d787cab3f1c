"""The loop count as an axis: running a looped model at K' core steps instead of the K it was
trained at, truncated backprop, and training-free per-token exit.

A looped layout (one core, ``P+CRK+Q``) can run its core any K' >= 1 times: the weights are shared.
What has per-step parameters (MeSH's routers, the ``static``/``dynamic`` coefficients) has them
for ``ModelConfig.parameter_loops`` steps (K, or ``max_loops`` when more were built for sampled
training, or one shared set under ``mesh_routers=shared``); a pass of K' steps picks, for each
step t, the trained step whose parameters it uses by a rule (``ModelConfig.loop_rule``, or
:attr:`Depth.rule` per call). With P parameter sets:

* ``last``   step t uses set t while t < min(P, K') - 1, and the last set (P - 1) from then on:
             past the trained count every extra step reuses the last core step's routers, and
             below it the last step still does, so the coda always reads through the routers
             that fed it in training (MeSH: the final read).
* ``cycle``  step t uses set t mod P: the trained steps repeated in order, as if the loop of K
             steps ran again; the final read is the read of set (K' - 1) mod P, the trained
             final read only when P divides K'.

At K' = P both rules are the identity, so a model evaluated at its own K computes what it always
did. MeSH keeps its B slots as trained whatever K' is. Schemes without per-step parameters
(base, residual, anchor, anchor*, their sums) ignore the rule.

Exit (:class:`ExitRule`): after each core step a token whose criterion falls below ``eps`` stops;
its state is frozen (the core still runs over the whole sequence, and later steps' attention sees
the exited token's keys and values recomputed from its frozen state h(t_exit)), and the coda gets
that frozen state. Criteria: ``state``, ||h(t+1) - h(t)|| / ||h(t)||; ``output``, KL(p(t+1) || p(t))
between the next-token distributions the coda and head give for h(t+1) and h(t). No score is
below 0, so at ``eps = 0`` no token exits and the pass is the full one, bit for bit.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import Tensor

from mesh_model.errors import ConfigError

LOOP_RULES = ("last", "cycle")
EXIT_CRITERIA = ("state", "output")
MESH_ROUTERS = ("per_step", "shared")


def check_loop_rule(rule: str, field: str = "loop_rule") -> str:
    if rule not in LOOP_RULES:
        raise ConfigError(field, rule, f"use one of {', '.join(LOOP_RULES)} (mesh_model/depth.py)")
    return rule


def step_parameters(t: int, loops: int, sets: int, rule: str) -> int:
    """The parameter set (0..sets-1) that step ``t`` of a pass of ``loops`` steps uses."""
    if rule == "cycle":
        return t % sets
    return t if t < min(sets, loops) - 1 else sets - 1


def _positive_int(field: str, value: object, allowed: str) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ConfigError(field, value, allowed)


@dataclass(frozen=True)
class ExitRule:
    """Per-token exit: ``criterion`` (``state`` or ``output``) below ``eps`` stops a token."""

    criterion: str = "state"
    eps: float = 0.0

    def __post_init__(self) -> None:
        if self.criterion not in EXIT_CRITERIA:
            raise ConfigError("exit", self.criterion, f"use one of {', '.join(EXIT_CRITERIA)}")
        if isinstance(self.eps, bool) or not isinstance(self.eps, (int, float)) or not 0 <= self.eps < float("inf"):
            raise ConfigError("exit eps", self.eps, "a finite number >= 0 (0: no token exits)")


@dataclass(frozen=True)
class Depth:
    """How one forward pass loops: ``loops`` core steps (None: the layout's K), parameter sets
    picked by ``rule`` (None: the model's ``loop_rule``), gradients through the last
    ``grad_loops`` steps only (None: all; the earlier ones run without autograd), per-token ``exit``."""

    loops: int | None = None
    rule: str | None = None
    grad_loops: int | None = None
    exit: ExitRule | None = None

    def __post_init__(self) -> None:
        if self.loops is not None:
            _positive_int("loops", self.loops, "a loop count >= 1")
        if self.rule is not None:
            check_loop_rule(self.rule)
        if self.grad_loops is not None:
            _positive_int("grad_loops", self.grad_loops, "a number of core steps >= 1 to backpropagate through")


def relative_change(new: Tensor, old: Tensor) -> Tensor:
    """||new - old|| / ||old|| per token (over the last dim), (N, L) in fp32."""
    return (new - old).float().norm(dim=-1) / old.float().norm(dim=-1).clamp_min(1e-30)


def kl_per_token(log_p: Tensor, log_q: Tensor) -> Tensor:
    """KL(p || q) per token from log-probabilities (N, L, V); never below 0 (rounding clamped)."""
    return (log_p.exp() * (log_p - log_q)).sum(-1).clamp_min(0.0)


class TokenExit:
    """The exit bookkeeping of one pass: which tokens still loop, and how many steps each ran.

    ``readout`` maps a state to the log-probabilities the coda and head give for it (the ``output``
    criterion's; unused by ``state``)."""

    def __init__(self, rule: ExitRule, h0: Tensor, readout: Callable[[Tensor], Tensor]) -> None:
        self.rule = rule
        self.readout = readout
        self.active = torch.ones(h0.shape[:-1], dtype=torch.bool, device=h0.device)
        self.used = torch.zeros(h0.shape[:-1], dtype=torch.float32, device=h0.device)
        self.previous = readout(h0) if rule.criterion == "output" else None

    def update(self, old: Tensor, new: Tensor) -> Tensor:
        """The state after a step: ``new`` for tokens still looping, ``old`` (frozen) for the rest;
        then the tokens whose criterion is below eps stop."""
        self.used += self.active
        h = torch.where(self.active.unsqueeze(-1), new, old)
        if self.rule.criterion == "state":
            score = relative_change(h, old)
        else:
            out = self.readout(h)
            assert self.previous is not None
            score = kl_per_token(out, self.previous)
            self.previous = out
        self.active = self.active & ~(score < self.rule.eps)
        return h


__all__ = [
    "EXIT_CRITERIA",
    "LOOP_RULES",
    "MESH_ROUTERS",
    "Depth",
    "ExitRule",
    "TokenExit",
    "check_loop_rule",
    "kl_per_token",
    "relative_change",
    "step_parameters",
]
