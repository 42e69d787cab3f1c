"""What each loop input and the coda input is made of: exact per-token coefficients over the values
the loop has seen.

Every scheme builds h(t) linearly from the sources ``h_emb``, ``prelude`` (the prelude output) and
the core outputs ``f1`` .. ``fK`` (f_t = f(h(t-1))), with coefficients that may depend on the token
but not on the sources' values once the routing is known:

* a fixed sum c_core f + c_res h(t) + c_anchor h(0) + c_emb h_emb: constants (base: h(K) = 1 f_K);
* ``static``: the trained scalars of each step; ``dynamic``: a = Linear_t(h(t)) per token;
* MeSH: a read with weights r after writes w_0 .. w_i (w_0 wrote the prelude output, w_s the core
  output f_s) is r[0] h_emb + sum_s (r . w_s) v_s, since the buffer starts as [h_emb, 0, ..., 0]
  and only ever receives weighted writes; under ``final_read=residual`` h(K) adds 1 f_K.

So sum_s c_s(t) v_s reproduces h(t) to float rounding (:func:`reconstruct`, and the tests), and the
coefficients of h(K), the coda input, say how much of the last core iteration reaches the coda.
:func:`mesh_routings` gives MeSH's routing of the same pass, for its entropy and logit statistics.
"""

from __future__ import annotations

from collections.abc import Mapping

import torch
from torch import Tensor

from mesh_model.depth import step_parameters
from mesh_model.mesh_router import Routing
from mesh_model.model import MeshTransformer
from mesh_model.schemes import DynamicCombination, FixedSum, MeSH, StaticCombination


def source_names(loops: int) -> list[str]:
    """The sources a state is a combination of, in order: h_emb, prelude, f1 .. fK."""
    return ["h_emb", "prelude", *(f"f{t}" for t in range(1, loops + 1))]


def state_names(loops: int) -> list[str]:
    """h0 .. hK: the inputs of core iterations 1 .. K, then hK, the coda's input."""
    return [f"h{t}" for t in range(loops + 1)]


def mesh_routings(model: MeshTransformer, hidden_states: Mapping[str, Tensor]) -> list[Routing]:
    """MeSH's routing of one pass, router 0 (the transition, from the prelude output) to K (core
    step K, whose read is the final read), recomputed from the pass's hidden states."""
    scheme = model.state_passing
    if not isinstance(scheme, MeSH):
        raise TypeError(f"mesh_routings needs a MeSH model, not {type(scheme).__name__}")
    loops = len(model.core_schedule)
    inputs = [hidden_states["prelude"], *(hidden_states[f"h{t}"] for t in range(loops))]
    routers = [0, *(i + 1 for i in parameter_sets(model))]
    return [scheme.routing(i, h) for i, h in zip(routers, inputs, strict=True)]


def parameter_sets(model: MeshTransformer) -> list[int]:
    """The parameter set each of the pass's K core steps uses (mesh_model/depth.py): 0 .. K-1, unless
    parameters were built for more steps (``max_loops``) or shared (MeSH's ``mesh_routers=shared``)."""
    loops, config = len(model.core_schedule), model.config
    return [step_parameters(t, loops, config.parameter_loops, config.loop_rule) for t in range(loops)]


def state_coefficients(model: MeshTransformer, hidden_states: Mapping[str, Tensor]) -> dict[str, Tensor]:
    """``h0`` .. ``hK`` -> (N, L, K+2) float32 coefficients over :func:`source_names` (0 for a source
    not yet computed), from a forward pass's ``hidden_states`` (``return_hidden_states=True``)."""
    scheme = model.state_passing
    if scheme is None:
        raise TypeError("a vanilla layout has no loop states")
    loops = len(model.core_schedule)
    prelude = hidden_states["prelude"]
    shape, sources = (*prelude.shape[:-1], loops + 2), loops + 2
    if isinstance(scheme, MeSH):
        return _mesh(scheme, mesh_routings(model, hidden_states), shape)

    def unit(index: int) -> Tensor:
        c = prelude.new_zeros(shape, dtype=torch.float32)
        c[..., index] = 1.0
        return c

    h0 = unit(1)
    states, c = {"h0": h0}, h0
    for t, index in enumerate(parameter_sets(model)):
        core, res, anchor, emb = _step_weights(scheme, index, hidden_states[f"h{t}"])
        c = core * unit(2 + t) + res * c + anchor * h0 + emb * unit(0)
        states[f"h{t + 1}"] = c
    assert all(v.shape[-1] == sources for v in states.values())
    return states


def _step_weights(scheme: object, t: int, h: Tensor) -> tuple[Tensor | float, ...]:
    """(core, residual, anchor, anchor_emb) weights of step t, scalars or (N, L, 1) per token."""
    if isinstance(scheme, FixedSum):
        terms = dict(scheme.terms)
        return scheme.core_coef, terms.get("residual", 0.0), terms.get("anchor", 0.0), terms.get("anchor_emb", 0.0)
    if isinstance(scheme, StaticCombination):
        a = scheme.coefficients[t].float()
        return a[0], 0.0, a[1], a[2]
    if isinstance(scheme, DynamicCombination):
        a = scheme.coefficient_routers[t](h).float()
        return a[..., 0:1], 0.0, a[..., 1:2], a[..., 2:3]
    raise TypeError(f"no coefficients for {type(scheme).__name__}")


def _mesh(scheme: MeSH, routings: list[Routing], shape: tuple[int, ...]) -> dict[str, Tensor]:
    writes = torch.stack([r.write.float() for r in routings], dim=-2)
    reads = torch.stack([r.read.float() for r in routings], dim=-2)
    coefficients = mesh_coefficients(writes, reads, scheme.router.final_read)
    assert coefficients.shape[:-2] + coefficients.shape[-1:] == shape
    return {f"h{i}": c for i, c in enumerate(coefficients.unbind(-2))}


def mesh_coefficients(writes: Tensor, reads: Tensor, final_read: str = "read") -> Tensor:
    """MeSH's states h(0) .. h(K) as coefficients (..., K+1, K+2) over :func:`source_names`, from
    the write and read weights (..., K+1, B) of routers 0 (the transition) .. K (the final read).

    Read i is r_i[0] h_emb + sum_{s<=i} (r_i . w_s) v_s, so the block over (prelude, f1 .. fK) is
    the lower triangle of reads @ writes^T; under ``final_read=residual`` the last row adds 1 f_K.
    Differentiable in the weights (mesh_model.expressiveness fits routings through it)."""
    loops = reads.shape[-2] - 1
    c = torch.cat((reads[..., :1], (reads @ writes.mT).tril()), dim=-1)
    if loops > 0 and final_read == "residual":
        last = torch.zeros(c.shape[-2:], dtype=c.dtype, device=c.device)
        last[loops, loops + 1] = 1.0
        c = c + last
    return c


def reconstruct(
    coefficients: Tensor, hidden_states: Mapping[str, Tensor], core_outputs: Mapping[str, Tensor]
) -> Tensor:
    """sum_s c_s v_s over the sources: the state the coefficients describe, (N, L, D)."""
    values = [hidden_states["embedding"], hidden_states["prelude"], *core_outputs.values()]
    out = torch.zeros_like(values[0], dtype=torch.float32)
    for s, v in enumerate(values[: coefficients.shape[-1]]):
        out = out + coefficients[..., s : s + 1] * v.float()
    return out


__all__ = [
    "mesh_coefficients",
    "mesh_routings",
    "parameter_sets",
    "reconstruct",
    "source_names",
    "state_coefficients",
    "state_names",
]
