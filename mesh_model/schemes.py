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
* ``mesh``                  the B-slot memory buffer with per-step write and read routers, in
                            its memory-lean form or, with the build option
                            ``mesh_buffer="explicit"``, the paper's direct (B, N, L, D) buffer.

Every scheme's state is a ``LoopState`` (h, h_emb, h0); MeSH carries more in its own subclass.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
from torch import Tensor, nn

from mesh_model.errors import ConfigError
from mesh_model.init import SeededInit
from mesh_model.mesh_router import DEFAULT_ROUTER, RouterOptions, Routing, own_slot, own_slot_bias, route
from mesh_model.scheme_names import (  # re-exported: the names were defined here before
    SCHEME_FORMS,
    SUPPLEMENT_TERMS,
    UNKNOWN_SCHEME,
    SchemeSpec,
)


@dataclass
class LoopState:
    """What every scheme carries between steps: the current state ``h`` = h(t), shape (N, L, D),
    the embedding output h_emb and h(0). A scheme that keeps more subclasses it (``MeshState``).
    ``final`` is True during the pass's last core step (the model sets it): MeSH's
    ``final_read=residual`` acts there, whatever the loop count (mesh_model/depth.py)."""

    h: Tensor
    h_emb: Tensor
    h0: Tensor
    final: bool = False


class StatePassing(nn.Module):
    """Base class: h(0) is the prelude output, the coda gets h(K). No parameters of its own."""

    def reset_parameters(self, init: SeededInit | None = None) -> None:
        """Re-initialise the scheme's own parameters (after the model's generic init) from ``init``'s
        ``scheme/...`` streams (None: a seed from torch's global generator); none here."""

    def begin(self, h_emb: Tensor, h_prelude: Tensor) -> LoopState:
        return LoopState(h=h_prelude, h_emb=h_emb, h0=h_prelude)

    def step(self, t: int, core_out: Tensor, state: LoopState) -> LoopState:
        raise NotImplementedError

    def end(self, state: LoopState) -> Tensor:
        return state.h

    def z_loss(self, state: LoopState) -> Tensor | None:
        """A loss the scheme adds to training (MeSH's router z-loss); None: nothing."""
        return None


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

    def reset_parameters(self, init: SeededInit | None = None) -> None:
        with torch.no_grad():
            self.coefficients.fill_(1.0)

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

    def reset_parameters(self, init: SeededInit | None = None) -> None:
        for router in self.coefficient_routers:
            nn.init.zeros_(router.weight)
            nn.init.ones_(router.bias)

    def step(self, t: int, core_out: Tensor, state: LoopState) -> LoopState:
        a = self.coefficient_routers[t](state.h)  # (N, L, 3)
        h = core_out * a[..., 0:1]
        h = h.addcmul(state.h0, a[..., 1:2])
        state.h = h.addcmul(state.h_emb, a[..., 2:3])
        return state


@dataclass
class MeshState(LoopState):
    """MeSH's loop state: the values written so far (h_prelude, then every core output) and
    their per-token write weights (N, L, B); the slots themselves are never stored (see MeSH)."""

    written: list[Tensor] = field(default_factory=list)
    write_weights: list[Tensor] = field(default_factory=list)
    z_losses: list[Tensor] = field(default_factory=list)  # per routing call, when z_coef > 0


class MeSH(StatePassing):
    """Memory-as-State-Highways: a B-slot buffer written and read through per-step routers.

    Router index 0 is the transition (prelude output -> h(0)); index t+1 belongs to core step t.
    Each router is Linear(D -> B) + softmax over slots, computed per token from the state that
    enters its step (h_prelude for the transition, h(t) for step t). Step t writes
    f(h(t)) into the buffer with the write weights and reads h(t+1) from the updated buffer with
    the read weights. The read of the last step is the final read that feeds the coda, so there
    are K+1 write and K+1 read routers: 2(K+1)(D*B + B) parameters, as in the paper.

    Memory-lean form. The buffer starts as [h_emb, 0, ..., 0] and only ever receives weighted
    writes, so slot b after i writes is ``h_emb [b=0] + sum_s w_s[b] v_s``. A read with weights r
    is therefore ``r[0] h_emb + sum_s (r . w_s) v_s``: per-token coefficients that are dot
    products over B, applied to values autograd keeps alive anyway (h_prelude and the core
    outputs). No (B, N, L, D) tensor is built, stored for backward or copied per step.

    What it keeps instead grows with K squared: read i stacks all i write weights so far into an
    (N, L, i, B) tensor that autograd saves, so the K+1 reads keep (K+1)(K+2)/2 * B values per
    token (about K^3/2 with the default B = K+3; the explicit form keeps K * B * D). For the
    paper's K = 2 or 3 that is 30-60 values per token, nothing beside D; at K = 100, B = 103 it
    is 530k (2.1 MB in fp32) per token, more than the explicit buffer's K * B * D unless
    D > (K+2)/2. ``mesh_model.accounting.estimate_step_memory`` counts it as "MeSH coefficients".

    ``MeSHExplicitBuffer`` (``build_model(..., mesh_buffer="explicit")``) is the direct
    formulation; tests hold the two equal.
    """

    def __init__(
        self, loops: int, d_model: int, slots: int, init_std: float, router: RouterOptions = DEFAULT_ROUTER
    ) -> None:
        super().__init__()
        self.loops = loops
        self.slots = slots
        self.init_std = init_std
        self.router = router
        self.write_routers = nn.ModuleList(nn.Linear(d_model, slots) for _ in range(loops + 1))
        self.read_routers = nn.ModuleList(nn.Linear(d_model, slots) for _ in range(loops + 1))
        self.reset_parameters()

    def reset_parameters(self, init: SeededInit | None = None) -> None:
        """Small random weights; zero bias (near-uniform routing at init), or with
        ``init=own_slot`` a bias that puts ``own_weight`` on each router's own slot."""
        init = init or SeededInit.from_global_rng()
        for kind in ("write_routers", "read_routers"):
            for i, router in enumerate(getattr(self, kind)):
                init.normal_(router.weight, self.init_std, f"scheme/{kind}.{i}.weight")
                nn.init.zeros_(router.bias)
                if self.router.init == "own_slot":
                    with torch.no_grad():
                        router.bias[own_slot(i, self.slots)] = own_slot_bias(self.router.own_weight, self.slots)

    def routing(self, index: int, h_in: Tensor) -> Routing:
        """Router ``index``'s write and read weights for the state ``h_in`` entering its step."""
        return route(self.write_routers[index], self.read_routers[index], h_in, self.router)

    def z_loss(self, state: LoopState) -> Tensor | None:
        """The router z-loss of the pass (mean over routing calls), weighted by ``z_coef``; None
        when it is off."""
        if not self.router.z_coef or not isinstance(state, MeshState) or not state.z_losses:
            return None
        return self.router.z_coef * torch.stack(state.z_losses).mean()

    def _routed(self, index: int, h_in: Tensor, state: MeshState) -> tuple[Tensor, Tensor]:
        routing = self.routing(index, h_in)
        if self.router.z_coef:
            state.z_losses.append(routing.z_loss())
        return routing.write, routing.read

    def _final(self, value: Tensor, h: Tensor, state: LoopState) -> Tensor:
        """The read, plus the written core output on the pass's last step under ``final_read=residual``."""
        if state.final and self.router.final_read == "residual":
            return h + value
        return h

    def _write_read(self, index: int, h_in: Tensor, value: Tensor, state: MeshState) -> Tensor:
        write, read = self._routed(index, h_in, state)
        state.written.append(value)
        state.write_weights.append(write)
        # coefficient of every written value in this read: r . w_s, shape (N, L, S)
        coefficients = (torch.stack(state.write_weights, dim=-2) @ read.unsqueeze(-1)).squeeze(-1)
        h = state.h_emb * read[..., 0:1]
        for s, v in enumerate(state.written):
            h = h.addcmul(v, coefficients[..., s : s + 1])
        return self._final(value, h, state)

    def begin(self, h_emb: Tensor, h_prelude: Tensor) -> MeshState:
        state = MeshState(h=h_prelude, h_emb=h_emb, h0=h_prelude)
        state.h = state.h0 = self._write_read(0, h_prelude, h_prelude, state)
        return state

    def step(self, t: int, core_out: Tensor, state: MeshState) -> MeshState:  # type: ignore[override]
        state.h = self._write_read(t + 1, state.h, core_out, state)
        return state

    def buffer(self, state: MeshState) -> Tensor:
        """The B slots as the direct formulation holds them, (B, N, L, D), for inspection."""
        slots = torch.stack(
            [w.movedim(-1, 0).unsqueeze(-1) * v for w, v in zip(state.write_weights, state.written, strict=True)]
        )
        slots = slots.sum(0)
        slots[0] = slots[0] + state.h_emb
        return slots


@dataclass
class ExplicitBufferState(MeshState):
    """The explicit form's loop state: the (B, N, L, D) buffer itself."""

    buffer: Tensor | None = None


class MeSHExplicitBuffer(MeSH):
    """MeSH as the paper writes it: a (B, N, L, D) buffer updated and read at every step.

    Same parameters (and names) as the lean form, so a state dict loads into either. Built with
    ``mesh_buffer="explicit"``: the reference the lean form is tested against, and what
    ``benchmarks/step_time.py`` measures to show what the slots cost in activation memory.
    """

    def _write_read(  # type: ignore[override]
        self, index: int, h_in: Tensor, value: Tensor, state: ExplicitBufferState
    ) -> Tensor:
        write, read = self._routed(index, h_in, state)  # type: ignore[arg-type]
        state.buffer = state.buffer + write.movedim(-1, 0).unsqueeze(-1) * value
        return self._final(value, (state.buffer * read.movedim(-1, 0).unsqueeze(-1)).sum(0), state)

    def begin(self, h_emb: Tensor, h_prelude: Tensor) -> ExplicitBufferState:  # type: ignore[override]
        # the buffer starts as [h_emb, 0, ..., 0]
        empty = torch.cat((h_emb.unsqueeze(0), h_emb.new_zeros(self.slots - 1, *h_emb.shape)))
        state = ExplicitBufferState(h=h_prelude, h_emb=h_emb, h0=h_prelude, buffer=empty)
        state.h = state.h0 = self._write_read(0, h_prelude, h_prelude, state)
        return state

    def buffer(self, state: ExplicitBufferState) -> Tensor:  # type: ignore[override]
        return state.buffer


MESH_BUFFERS: dict[str, type[MeSH]] = {"lean": MeSH, "explicit": MeSHExplicitBuffer}
MESH_BUFFER_FORMS = "use lean (the memory-lean MeSH, default) or explicit (the paper's (B, N, L, D) buffer)"


def check_mesh_buffer(mesh_buffer: str) -> None:
    """A build option, not a config field: ``lean`` or ``explicit``, both the same function."""
    if mesh_buffer not in MESH_BUFFERS:
        raise ConfigError("mesh_buffer", mesh_buffer, MESH_BUFFER_FORMS)


def build_state_passing(
    spec: SchemeSpec,
    loops: int,
    d_model: int,
    slots: int | None,
    init_std: float,
    mesh_buffer: str = "lean",
    router: RouterOptions = DEFAULT_ROUTER,
) -> StatePassing:
    """The one place a scheme name becomes behaviour. ``loops`` is the number of core steps with
    parameters of their own (``ModelConfig.parameter_loops``); ``mesh_buffer`` picks MeSH's form,
    ``router`` its routers' open choices (:mod:`mesh_model.mesh_router`)."""
    check_mesh_buffer(mesh_buffer)
    if spec.kind in ("base", "fixed"):
        return FixedSum(spec.coefficients)
    if spec.kind == "static":
        return StaticCombination(loops)
    if spec.kind == "dynamic":
        return DynamicCombination(loops, d_model)
    if spec.kind == "mesh":
        assert slots is not None
        return MESH_BUFFERS[mesh_buffer](loops, d_model, slots, init_std, router)
    raise ConfigError("scheme", spec.kind, SCHEME_FORMS)


def mesh_router_parameters(loops: int, d_model: int, slots: int) -> int:
    """The paper's closed form 2(K+1)(D*B + B)."""
    return 2 * (loops + 1) * (d_model * slots + slots)


__all__ = [
    "MESH_BUFFERS",
    "SCHEME_FORMS",
    "UNKNOWN_SCHEME",
    "DynamicCombination",
    "ExplicitBufferState",
    "FixedSum",
    "LoopState",
    "MeSH",
    "MeSHExplicitBuffer",
    "MeshState",
    "SchemeSpec",
    "StatePassing",
    "StaticCombination",
    "build_state_passing",
    "check_mesh_buffer",
    "mesh_router_parameters",
]
