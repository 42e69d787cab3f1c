"""MeSH's routers: how a step's write and read weights over the B slots come from the state, and
the choices the paper leaves open, as settings (:class:`RouterOptions`, the ``mesh_*`` fields of
:class:`~mesh_model.config.ModelConfig`).

The paper fixes a router as Linear(D -> B, with bias) + softmax over the slots, computed per token
from the state entering its step. It does not say how the routers start, at what learning rate
they train, whether their input is normalised, at what temperature the softmax runs, whether
anything keeps their logits small, or whether the coda reads anything beside the final read.
The defaults are this project's first reading, unchanged (bit for bit) by the settings existing:

* ``init`` ``uniform``: weights N(0, init_std), zero bias, so every slot starts at about 1/B.
  ``own_slot``: a base-like start, router i (0 = the transition, t+1 = core step t) writes to and
  reads from its own slot 1 + i mod (B-1) with softmax weight ``own_weight`` (the bias of that
  slot is ln(own_weight (B-1) / (1 - own_weight)), the others 0), so h(t+1) starts near f(h(t)).
* ``norm`` ``none``: the routers read the raw residual stream, whose norm grows along training.
  ``layernorm`` / ``rmsnorm`` normalise it per token first, without a learnable gain or shift: a
  gain before a linear map is a reparametrisation of its weights and a shift one of its bias, so
  the parameter count is unchanged.
* ``temperature`` 1: softmax(logits / T).
* ``z_coef`` 0: the router z-loss (ST-MoE's, as the MoE router has): the mean over every routing
  call and token of logsumexp(logits)^2, times ``z_coef``, added to the training loss.
* ``final_read`` ``read``: the coda gets the last step's read. ``residual`` (a deviation from the
  paper): the coda gets f(h(K-1)) + that read, so the last core iteration always reaches it.

The router LR is an optimizer setting (``optim.router_lr_scale``, experiments/config.py).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, fields

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from mesh_model.errors import ConfigError

ROUTER_INITS = ("uniform", "own_slot")
ROUTER_NORMS = ("none", "layernorm", "rmsnorm")
FINAL_READS = ("read", "residual")
NORM_EPS = 1e-5


@dataclass(frozen=True)
class RouterOptions:
    """MeSH's open choices (module docstring); the defaults are the model as it always was."""

    init: str = "uniform"
    own_weight: float = 0.9
    norm: str = "none"
    temperature: float = 1.0
    z_coef: float = 0.0
    final_read: str = "read"

    # ModelConfig field of each option, the name a ConfigError reports
    FIELDS = {
        "init": "mesh_router_init",
        "own_weight": "mesh_router_own_weight",
        "norm": "mesh_router_norm",
        "temperature": "mesh_router_temperature",
        "z_coef": "mesh_router_z_coef",
        "final_read": "mesh_final_read",
    }

    def __post_init__(self) -> None:
        for name, allowed in (("init", ROUTER_INITS), ("norm", ROUTER_NORMS), ("final_read", FINAL_READS)):
            if getattr(self, name) not in allowed:
                raise ConfigError(self.FIELDS[name], getattr(self, name), f"use one of {', '.join(allowed)}")
        if not _number(self.own_weight) or not 0 < self.own_weight < 1:
            raise ConfigError(self.FIELDS["own_weight"], self.own_weight, "a softmax weight in (0, 1), e.g. 0.9")
        if self.init != "own_slot" and self.own_weight != RouterOptions.own_weight:
            raise ConfigError(
                self.FIELDS["own_weight"], self.own_weight, "only mesh_router_init=own_slot uses it: set that too"
            )
        if not _number(self.temperature) or not 0 < self.temperature < math.inf:
            raise ConfigError(self.FIELDS["temperature"], self.temperature, "must be a finite number > 0")
        if not _number(self.z_coef) or not 0 <= self.z_coef < math.inf:
            raise ConfigError(self.FIELDS["z_coef"], self.z_coef, "must be a finite number >= 0 (0 switches it off)")

    @property
    def changed(self) -> dict[str, object]:
        """The options set away from their defaults, by ModelConfig field name."""
        return {
            self.FIELDS[f.name]: getattr(self, f.name)
            for f in fields(self)
            if getattr(self, f.name) != getattr(RouterOptions, f.name)
        }


def _number(value: object) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


DEFAULT_ROUTER = RouterOptions()


def own_slot(index: int, slots: int) -> int:
    """Router ``index``'s own slot under ``init=own_slot``: 1 + index mod (B-1); slot 0 (h_emb)
    only when B = 1."""
    return 1 + index % (slots - 1) if slots > 1 else 0


def own_slot_bias(own_weight: float, slots: int) -> float:
    """The bias that gives the own slot softmax weight ``own_weight`` when the other B-1 logits are 0."""
    return math.log(own_weight * (slots - 1) / (1 - own_weight)) if slots > 1 else 0.0


@dataclass
class Routing:
    """One step's routing, per token: write and read weights (N, L, B) in the state's dtype, and
    the fp32 logits (N, L, 2B) after the temperature, write's first."""

    write: Tensor
    read: Tensor
    logits: Tensor

    def z_loss(self) -> Tensor:
        """Mean over tokens of logsumexp^2, summed over the write and the read router."""
        write, read = self.logits.split(self.write.shape[-1], dim=-1)
        return (torch.logsumexp(write, -1).square() + torch.logsumexp(read, -1).square()).mean()


def route(write: nn.Linear, read: nn.Linear, h: Tensor, options: RouterOptions = DEFAULT_ROUTER) -> Routing:
    """Softmax write and read weights over the slots, softmax in fp32.

    Both routers in one matmul: they read the same h, and the (D -> B) products are too narrow
    to be anything but a pass over h, so one pass instead of two (forward and backward)."""
    if options.norm == "layernorm":
        h = F.layer_norm(h, h.shape[-1:], eps=NORM_EPS)
    elif options.norm == "rmsnorm":
        h = F.rms_norm(h, h.shape[-1:], eps=NORM_EPS)
    weight = torch.cat((write.weight, read.weight))
    bias = torch.cat((write.bias, read.bias))
    logits = F.linear(h, weight, bias).float()
    if options.temperature != 1.0:
        logits = logits / options.temperature
    w, r = logits.split(write.out_features, dim=-1)
    dtype = h.dtype
    return Routing(torch.softmax(w, dim=-1).to(dtype), torch.softmax(r, dim=-1).to(dtype), logits)


__all__ = [
    "DEFAULT_ROUTER",
    "FINAL_READS",
    "ROUTER_INITS",
    "ROUTER_NORMS",
    "RouterOptions",
    "Routing",
    "own_slot",
    "own_slot_bias",
    "route",
]
