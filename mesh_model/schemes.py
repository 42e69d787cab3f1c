"""State passing between core applications: one small class per scheme, one interface.

The model runs every scheme the same way::

    state = scheme.begin(h_emb, h_prelude)          # h(0) and whatever the scheme keeps
    for t, core in enumerate(schedule):
        state = scheme.step(t, core(state.h), state)  # h(t+1) from f_core(h(t))
    h = scheme.end(state)                           # the state handed to the coda

Scheme names (``ModelConfig.scheme``):

* ``base``                  h(t+1) = f(h(t))
* fixed sums                terms joined by ``+`` from ``residual`` (h(t)), ``anchor`` (h(0)),
                            ``anchor_emb`` (h_emb, the paper's anchor*; ``anchor*`` is accepted),
                            each optionally weighted ``0.5*anchor``; ``core`` weights f itself
                            (default 1). ``residual+anchor`` means f + h(t) + h(0).
* ``static``                h(t+1) = a1 f + a2 h(0) + a3 h_emb, trainable scalars per step,
                            initialised to 1 (the ``anchor+anchor_emb`` sum).
* ``dynamic``               the same with per-token coefficients a = Linear_t(h(t)), weights
                            initialised to 0 and biases to 1, so it starts equal to ``static``.
* ``mesh``                  the B-slot memory buffer with per-step write and read routers.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

import torch
from torch import Tensor, nn

from mesh_model.errors import ConfigError

SUPPLEMENT_TERMS = ("residual", "anchor", "anchor_emb")
LEARNED_SCHEMES = ("static", "dynamic", "mesh")
SCHEME_FORMS = (
    "use base, mesh, static, dynamic, or a '+'-joined sum of residual, anchor, anchor_emb "
    "(optionally weighted, e.g. residual+anchor or 0.5*anchor+anchor_emb; 'core' weights f)"
)
_TERM = re.compile(r"^(?:(?P<coef>[-+]?(?:\d+\.?\d*|\.\d+)(?:[eE][-+]?\d+)?)\*)?(?P<name>[a-z_]+\*?)$")
_ALIASES = {"anchor*": "anchor_emb", "anchor_star": "anchor_emb", "f": "core"}


@dataclass(frozen=True)
class SchemeSpec:
    """A parsed scheme name. ``coefficients`` holds the fixed weights of a ``fixed`` sum."""

    kind: str  # base | fixed | static | dynamic | mesh
    coefficients: dict[str, float] = field(default_factory=dict)

    @property
    def canonical(self) -> str:
        if self.kind != "fixed":
            return self.kind
        terms = []
        for name in ("core", *SUPPLEMENT_TERMS):
            coef = self.coefficients.get(name)
            if coef is None or (name == "core" and coef == 1.0):
                continue
            terms.append(name if coef == 1.0 else f"{coef:g}*{name}")
        return "+".join(terms)

    @classmethod
    def parse(cls, text: str) -> SchemeSpec:
        name = str(text).strip().lower().replace(" ", "")
        if name in ("base", *LEARNED_SCHEMES):
            return cls(kind=name)
        coefficients: dict[str, float] = {}
        for term in name.split("+") if name else [""]:
            match = _TERM.match(term)
            if match is None:
                raise ConfigError("scheme", text, SCHEME_FORMS)
            term_name = _ALIASES.get(match.group("name"), match.group("name"))
            if term_name not in ("core", *SUPPLEMENT_TERMS) or term_name in coefficients:
                raise ConfigError("scheme", text, SCHEME_FORMS)
            coefficients[term_name] = float(match.group("coef")) if match.group("coef") else 1.0
        if not any(t in coefficients for t in SUPPLEMENT_TERMS) and coefficients.get("core", 1.0) == 1.0:
            return cls(kind="base")
        return cls(kind="fixed", coefficients=coefficients)


@dataclass
class LoopState:
    """What a scheme carries between steps. ``h`` is the current state h(t), shape (N, L, D)."""

    h: Tensor
    h_emb: Tensor
    h0: Tensor
    buffer: Tensor | None = None  # MeSH slots, shape (B, N, L, D)


class StatePassing(nn.Module):
    """Base class: h(0) is the prelude output, the coda gets h(K)."""

    def begin(self, h_emb: Tensor, h_prelude: Tensor) -> LoopState:
        return LoopState(h=h_prelude, h_emb=h_emb, h0=h_prelude)

    def step(self, t: int, core_out: Tensor, state: LoopState) -> LoopState:
        raise NotImplementedError

    def end(self, state: LoopState) -> Tensor:
        return state.h


class FixedSum(StatePassing):
    """h(t+1) = c_core f(h(t)) + c_res h(t) + c_anchor h(0) + c_emb h_emb; ``base`` has no terms."""

    def __init__(self, coefficients: dict[str, float]) -> None:
        super().__init__()
        self.core_coef = coefficients.get("core", 1.0)
        self.terms = tuple((name, coefficients[name]) for name in SUPPLEMENT_TERMS if name in coefficients)

    def step(self, t: int, core_out: Tensor, state: LoopState) -> LoopState:
        sources = {"residual": state.h, "anchor": state.h0, "anchor_emb": state.h_emb}
        h = core_out if self.core_coef == 1.0 else self.core_coef * core_out
        for name, coef in self.terms:
            h = h + (sources[name] if coef == 1.0 else coef * sources[name])
        state.h = h
        return state


class StaticCombination(StatePassing):
    """h(t+1) = a1 f + a2 h(0) + a3 h_emb with one trainable triple per step."""

    def __init__(self, loops: int) -> None:
        super().__init__()
        self.coefficients = nn.Parameter(torch.ones(loops, 3))

    def step(self, t: int, core_out: Tensor, state: LoopState) -> LoopState:
        a = self.coefficients[t]
        state.h = a[0] * core_out + a[1] * state.h0 + a[2] * state.h_emb
        return state


class DynamicCombination(StatePassing):
    """Per-token coefficients (a1, a2, a3) = Linear_t(h(t)); starts equal to ``static``."""

    def __init__(self, loops: int, d_model: int) -> None:
        super().__init__()
        self.coefficient_routers = nn.ModuleList(nn.Linear(d_model, 3) for _ in range(loops))
        self.reset_parameters()

    def reset_parameters(self) -> None:
        for router in self.coefficient_routers:
            nn.init.zeros_(router.weight)
            nn.init.ones_(router.bias)

    def step(self, t: int, core_out: Tensor, state: LoopState) -> LoopState:
        a = self.coefficient_routers[t](state.h).unsqueeze(-2)  # (N, L, 1, 3)
        stacked = torch.stack((core_out, state.h0, state.h_emb), dim=-1)  # (N, L, D, 3)
        state.h = (stacked * a).sum(-1)
        return state


class MeSH(StatePassing):
    """Memory-as-State-Highways: a B-slot buffer written and read through per-step routers.

    Router index 0 is the transition (prelude output -> h(0)); index t+1 belongs to core step t.
    Each router is Linear(D -> B) + softmax over slots, computed per token from the state that
    enters its step (h_prelude for the transition, h(t) for step t). Step t writes
    f(h(t)) into the buffer with the write weights and reads h(t+1) from the updated buffer with
    the read weights. The read of the last step is the final read that feeds the coda, so there
    are K+1 write and K+1 read routers: 2(K+1)(D*B + B) parameters, as in the paper.
    """

    def __init__(self, loops: int, d_model: int, slots: int, init_std: float) -> None:
        super().__init__()
        self.slots = slots
        self.init_std = init_std
        self.write_routers = nn.ModuleList(nn.Linear(d_model, slots) for _ in range(loops + 1))
        self.read_routers = nn.ModuleList(nn.Linear(d_model, slots) for _ in range(loops + 1))
        self.reset_parameters()

    def reset_parameters(self) -> None:
        """Small random weights, zero bias: near-uniform routing at init."""
        for router in (*self.write_routers, *self.read_routers):
            nn.init.normal_(router.weight, std=self.init_std)
            nn.init.zeros_(router.bias)

    @staticmethod
    def _weights(router: nn.Linear, h: Tensor) -> Tensor:
        """Softmax routing weights, shaped (B, N, L, 1) to broadcast over the buffer."""
        return torch.softmax(router(h).float(), dim=-1).to(h.dtype).movedim(-1, 0).unsqueeze(-1)

    def _write_read(self, index: int, h_in: Tensor, value: Tensor, buffer: Tensor) -> tuple[Tensor, Tensor]:
        buffer = buffer + self._weights(self.write_routers[index], h_in) * value
        h_out = (buffer * self._weights(self.read_routers[index], h_in)).sum(0)
        return h_out, buffer

    def begin(self, h_emb: Tensor, h_prelude: Tensor) -> LoopState:
        buffer = torch.cat((h_emb.unsqueeze(0), h_emb.new_zeros(self.slots - 1, *h_emb.shape)))
        h0, buffer = self._write_read(0, h_prelude, h_prelude, buffer)
        return LoopState(h=h0, h_emb=h_emb, h0=h0, buffer=buffer)

    def step(self, t: int, core_out: Tensor, state: LoopState) -> LoopState:
        assert state.buffer is not None
        state.h, state.buffer = self._write_read(t + 1, state.h, core_out, state.buffer)
        return state


def build_state_passing(spec: SchemeSpec, loops: int, d_model: int, slots: int | None, init_std: float) -> StatePassing:
    """The one place a scheme name becomes behaviour."""
    if spec.kind in ("base", "fixed"):
        return FixedSum(spec.coefficients)
    if spec.kind == "static":
        return StaticCombination(loops)
    if spec.kind == "dynamic":
        return DynamicCombination(loops, d_model)
    if spec.kind == "mesh":
        assert slots is not None
        return MeSH(loops, d_model, slots, init_std)
    raise ConfigError("scheme", spec.kind, SCHEME_FORMS)


def mesh_router_parameters(loops: int, d_model: int, slots: int) -> int:
    """The paper's closed form 2(K+1)(D*B + B)."""
    return 2 * (loops + 1) * (d_model * slots + slots)


__all__ = [
    "SCHEME_FORMS",
    "DynamicCombination",
    "FixedSum",
    "LoopState",
    "MeSH",
    "SchemeSpec",
    "StatePassing",
    "StaticCombination",
    "build_state_passing",
    "mesh_router_parameters",
]
