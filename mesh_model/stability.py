"""Is the loop map a contraction? Two cheap numbers that say whether more loops can converge.

* :func:`change_ratios`: ||h(t+1) - h(t)|| / ||h(t) - h(t-1)|| along a pass (Frobenius norms over
  the batch). Below 1 the steps shrink (a fixed point is being approached), above 1 they grow.
  For a linear map h -> A h it tends to A's spectral radius (the dominant |eigenvalue|).
* :func:`spectral_radius`: power iteration on the Jacobian of the loop map at a state, with
  Jacobian-vector products by central differences (J v ~ (F(h + e v) - F(h - e v)) / 2e, e = 1e-3
  ||h||: the fused rotary is an autograd.Function without forward-mode support, and a monitor
  needs no more digits), rho ~ geometric mean of ||J v_i|| over the last half of the iterations
  (Gelfand's formula: it converges for a complex dominant pair too).
  rho < 1: locally, more loops converge; rho > 1: perturbations grow.

:func:`loop_map` builds a model's map h(t) -> h(t+1) of one core step with everything else the step
reads (h_emb, h(0), MeSH's buffer) held at its value in the pass; :func:`loop_stability` gives a
model's two numbers on a held-out batch: the change ratios of a pass of 2K steps (the extra steps
under the model's ``loop_rule``) and the spectral radius of step K's map (the first step past the
trained count) at h(K).
"""

from __future__ import annotations

import copy
from collections.abc import Callable

import torch
from torch import Tensor

from mesh_model.depth import Depth, step_parameters
from mesh_model.layers import rotary_tables


def change_ratios(states: list[Tensor]) -> list[float]:
    """||h(t+1) - h(t)|| / ||h(t) - h(t-1)|| for t = 1 .. len(states) - 2."""
    steps = [(b - a).double().norm().item() for a, b in zip(states, states[1:], strict=False)]
    return [b / a if a > 0 else float("inf") for a, b in zip(steps, steps[1:], strict=False)]


@torch.no_grad()
def spectral_radius(fn: Callable[[Tensor], Tensor], h: Tensor, iterations: int = 20, seed: int = 0) -> float:
    """Power-iteration estimate of the spectral radius of fn's Jacobian at ``h``."""
    generator = torch.Generator(device="cpu").manual_seed(seed)
    v = torch.randn(h.shape, generator=generator, dtype=h.dtype).to(h.device)
    v = v / v.norm()
    step = 1e-3 * h.norm().item() or 1e-3
    logs = []
    for _ in range(iterations):
        jv = (fn(h + step * v) - fn(h - step * v)) / (2 * step)
        norm = jv.double().norm()
        if norm == 0:
            return 0.0
        logs.append(norm.log().item())
        v = jv / jv.norm()
    tail = logs[len(logs) // 2 :]
    return float(torch.tensor(tail, dtype=torch.float64).mean().exp())


@torch.no_grad()
def _states_before(model, input_ids: Tensor, t: int, rule: str, loops: int):
    """(the loop state entering step ``t`` of a pass of ``loops`` steps, the rotary tables)."""
    rope = rotary_tables(input_ids.shape[1], model.config.rotary_dims, model.config.rotary_base, input_ids.device)
    h_emb = model.embed_in(input_ids) * model.embedding_scale
    h, _ = model._run_stack("prelude", h_emb, rope, False)
    state = model.state_passing.begin(h_emb, h)
    sets = model.config.parameter_loops
    for s in range(t):
        core_out, _ = model._run_stack("cores.0", state.h, rope, False)
        state.final = False
        state = model.state_passing.step(step_parameters(s, loops, sets, rule), core_out, state)
    return state, rope


def loop_map(model, input_ids: Tensor, t: int, loops: int, rule: str | None = None):
    """(the map h -> h(t+1) of step ``t`` of a pass of ``loops`` steps, h(t)) on ``input_ids``."""
    rule = rule or model.config.loop_rule
    model.loop_schedule(loops)  # a layout that cannot loop again refuses here
    state, rope = _states_before(model, input_ids, t, rule, loops)
    index = step_parameters(t, loops, model.config.parameter_loops, rule)

    def step(h: Tensor) -> Tensor:
        entering = copy.copy(state)  # the lists MeSH appends to are copied, the tensors shared
        for name in ("written", "write_weights", "z_losses"):
            if hasattr(entering, name):
                setattr(entering, name, list(getattr(entering, name)))
        entering.h, entering.final = h, False
        core_out, _ = model._run_stack("cores.0", h, rope, False)
        return model.state_passing.step(index, core_out, entering).h

    return step, state.h


def loop_stability(model, input_ids: Tensor, iterations: int = 12) -> dict[str, float]:
    """``change_ratio`` (the last ratio of a pass of 2K steps), ``change_ratio_trained`` (the last
    ratio within K, K >= 2) and ``spectral_radius`` (step K's map at h(K)); a model in eval mode."""
    loops = model.config.loops
    with torch.no_grad():
        out = model(input_ids, return_hidden_states=True, return_logits=False, depth=Depth(loops=2 * loops))
    assert out.hidden_states is not None
    states = [out.hidden_states[f"h{t}"] for t in range(2 * loops + 1)]
    ratios = change_ratios(states)
    result = {"change_ratio": ratios[-1]}
    if loops >= 2:
        result["change_ratio_trained"] = ratios[loops - 2]
    fn, h = loop_map(model, input_ids, loops, 2 * loops)
    result["spectral_radius"] = spectral_radius(fn, h, iterations)
    return result


__all__ = ["change_ratios", "loop_map", "loop_stability", "spectral_radius"]
