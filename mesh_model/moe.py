"""The mixture-of-experts feed-forward of a GPT-NeoX block (OLMoE style) and its router losses.

Per token x (a row of the block's post-attention LayerNorm output):

* **Router**: logits z = W_r x (Linear(D -> E), no bias, as OLMoE's gate), p = softmax(z) over
  all E experts, in fp32.
* **Token choice, top-k, dropless**: the k experts with the largest p; every token reaches all
  k of them (no capacity limit, nothing dropped).
* **Gate weights**: the chosen experts' probabilities as they are, *not* renormalised over the k
  (OLMoE's ``norm_topk_prob=False``): a token's gates sum to at most 1.
* **Experts**: each is the dense block's GELU MLP, Linear(D -> H) + bias, GELU, Linear(H -> D) +
  bias; the output is y = sum_j p[e_j] * expert_{e_j}(x). No shared expert.

Speed: the T*k (token, expert) assignments are sorted by expert and the token rows gathered in
that order, so each projection is one grouped matmul over E contiguous groups
(``torch._grouped_mm``, where the device and dtype have it: CPU fp32/bf16 in recent torch, CUDA
bf16 on SM80+) or, elsewhere, a loop over the experts' slices. The rows go back to (token, slot)
order with one ``index_copy`` (deterministic, unlike a scatter-add) and are summed over the k
slots, each weighted by its gate.
Nothing is masked over all E experts. Every shape on the grouped path is static (no host sync),
so ``torch.compile`` traces it into one graph; the loop fallback reads the group sizes on the
host (``tolist``), a graph break under compile.

Router losses, per router call (one MoE block applied once):

* **load balancing** (Switch; OLMoE's megablocks form): E * sum_i f_i P_i, with f_i the share of
  the T*k assignments that went to expert i and P_i the mean router probability of expert i.
  Perfect balance (f_i = P_i = 1/E) gives its minimum, 1. (Hugging Face's OLMoE counts f_i per
  token rather than per assignment, which is k times this.)
* **router z-loss**: the mean over tokens of logsumexp(z)^2.

:func:`combine` averages each over every router call of a forward pass; see its docstring.
"""

from __future__ import annotations

import functools
import itertools
from collections.abc import Sequence
from dataclasses import dataclass
from typing import NamedTuple

import torch
import torch.nn.functional as F
from torch import Tensor, nn


class RouterCall(NamedTuple):
    """What one router call reports. ``balance`` and ``z`` are the unweighted losses (with
    gradients); ``load`` (E,) is the share of assignments per expert (detached, sums to 1).
    ``entropy`` (mean over tokens of the router distribution's entropy, nats) and ``chosen``
    (T, k), the chosen experts, are only filled when routing statistics were asked for."""

    balance: Tensor
    z: Tensor
    load: Tensor
    entropy: Tensor | None = None
    chosen: Tensor | None = None


@dataclass
class BlockRouting:
    """Routing statistics of one MoE block over its calls in a forward pass, in call order: a
    shared core's block has K calls (one per loop iteration), any other block one.

    ``load`` (calls, E): share of the top-k assignments per expert, each row sums to 1.
    ``entropy`` (calls,): mean over tokens of the router's entropy, in [0, log E].
    ``jaccard`` (calls - 1,): mean over tokens of |S_t & S_t+1| / |S_t | S_t+1| between the
    chosen-expert sets of consecutive calls, in [0, 1] (empty for a block called once).
    """

    block: int
    load: Tensor
    entropy: Tensor
    jaccard: Tensor


@functools.cache
def _grouped_mm_probe(device_type: str, dtype: torch.dtype) -> bool:
    """Whether ``torch._grouped_mm`` runs forward and backward on this device and dtype."""
    if not hasattr(torch, "_grouped_mm"):
        return False
    try:
        with torch.inference_mode(False), torch.enable_grad():
            a = torch.ones(16, 8, device=device_type, dtype=dtype, requires_grad=True)
            b = torch.ones(2, 8, 8, device=device_type, dtype=dtype, requires_grad=True)
            ends = torch.tensor([8, 16], device=device_type, dtype=torch.int32)
            out = torch._grouped_mm(a, b.transpose(-2, -1), offs=ends)
            out.backward(torch.ones_like(out))
        return device_type == "meta" or bool(out[0, 0].item() == 8)
    except Exception:  # any failure means: not here, use the loop
        return False


def _constant_to_compile(fn):
    """``torch.compiler.assume_constant_result`` without importing ``torch._dynamo`` (about 3 s of
    CPU) when this module is imported, which every CLI that checks a config does: the mark is the
    attribute dynamo reads when it traces ``fn``. tests/test_moe.py holds it to the one torch sets,
    and a compiled MoE loop to one graph."""
    fn._dynamo_marked_constant = True
    return fn


@_constant_to_compile
def grouped_mm_available(device_type: str, dtype: torch.dtype, compiling: bool = False) -> bool:
    """Probed once per (device type, dtype) and cached; a constant to ``torch.compile``. CUDA is
    probed in bf16 only, the dtype its kernels are documented for. ``compiling`` also asks for
    the meta kernel that tracing runs, which (torch 2.13) takes bf16 only: a compiled fp32 model
    falls back to the loop, whose host sync breaks the graph (bf16 autocast keeps one graph)."""
    if device_type == "cuda" and dtype != torch.bfloat16:
        return False
    return _grouped_mm_probe(device_type, dtype) and (not compiling or _grouped_mm_probe("meta", dtype))


class ExpertLinear(nn.Module):
    """E Linear(in -> out) layers stacked: ``weight`` (E, out, in) and ``bias`` (E, out), so that
    ``weight[e]`` is expert e's ``nn.Linear.weight``. A token applies ``active`` of the E."""

    def __init__(self, experts: int, in_features: int, out_features: int, active: int) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.empty(experts, out_features, in_features))
        self.bias = nn.Parameter(torch.empty(experts, out_features))
        self.active = active

    def forward(self, x: Tensor, ends: Tensor, row_expert: Tensor) -> Tensor:
        """``x`` (rows, in) grouped by expert; ``ends`` (E,) int32 cumulative group sizes;
        ``row_expert`` (rows,) the expert of each row. Returns (rows, out)."""
        dtype = _compute_dtype(x)
        aligned = all(n * dtype.itemsize % 16 == 0 for n in self.weight.shape[1:])  # the kernels' stride rule
        if aligned and grouped_mm_available(x.device.type, dtype, torch.compiler.is_compiling()):
            weight, bias = self.weight.to(dtype), self.bias.to(dtype)
            return torch._grouped_mm(x.to(dtype), weight.transpose(-2, -1), offs=ends) + bias.index_select(
                0, row_expert
            )
        sizes = torch.diff(ends, prepend=ends.new_zeros(1)).tolist()  # host sync: the fallback path
        parts = [F.linear(part, self.weight[e], self.bias[e]) for e, part in enumerate(x.split(sizes))]
        return torch.cat(parts)


def _compute_dtype(x: Tensor) -> torch.dtype:
    """The dtype a Linear would compute in here: autocast's when it is on, else the input's."""
    device = x.device.type
    return torch.get_autocast_dtype(device) if torch.is_autocast_enabled(device) else x.dtype


class MoE(nn.Module):
    """The MoE feed-forward: ``router``, then ``experts`` GELU MLPs of width ``d_hidden``, the
    ``top_k`` best per token. Parameter names mirror the dense MLP's (``dense_h_to_4h``,
    ``dense_4h_to_h``) with a leading expert axis."""

    def __init__(self, d_model: int, d_hidden: int, experts: int, top_k: int) -> None:
        super().__init__()
        self.experts, self.top_k = experts, top_k
        self.router = nn.Linear(d_model, experts, bias=False)
        self.dense_h_to_4h = ExpertLinear(experts, d_model, d_hidden, top_k)
        self.dense_4h_to_h = ExpertLinear(experts, d_hidden, d_model, top_k)

    def forward(self, x: Tensor, stats: bool = False) -> tuple[Tensor, RouterCall]:
        """``x`` (..., D) -> (output (..., D), this call's :class:`RouterCall`). ``stats`` also
        fills the call's entropy and chosen experts (computed without gradients)."""
        shape, k = x.shape, self.top_k
        x = x.reshape(-1, shape[-1])
        logits = self.router(x).float()
        probs = logits.softmax(-1)
        gates, chosen = probs.topk(k, dim=-1)  # (T, k): not renormalised (norm_topk_prob=False)
        flat = chosen.reshape(-1)  # assignment j*k+s: token j's s-th choice
        order = flat.argsort(stable=True)  # the assignments grouped by expert
        counts = torch.zeros(self.experts, dtype=torch.long, device=x.device).scatter_add_(
            0, flat, torch.ones_like(flat)
        )
        ends, row_expert = counts.cumsum(0).to(torch.int32), flat[order]
        hidden = F.gelu(self.dense_h_to_4h(x.index_select(0, order // k), ends, row_expert))
        rows = self.dense_4h_to_h(hidden, ends, row_expert)
        per_slot = torch.empty_like(rows).index_copy(0, order, rows).view(-1, k, shape[-1])
        y = (per_slot * gates.to(per_slot.dtype).unsqueeze(-1)).sum(1)
        return y.view(shape), _router_call(logits, probs, chosen, counts, stats)

    def active_matmul_weights(self) -> int:
        """Matmul weights one token applies: the whole router and ``top_k`` experts."""
        return self.router.weight.numel() + sum(
            m.active * m.weight[0].numel() for m in (self.dense_h_to_4h, self.dense_4h_to_h)
        )


def _router_call(logits: Tensor, probs: Tensor, chosen: Tensor, counts: Tensor, stats: bool) -> RouterCall:
    experts = probs.shape[-1]
    load = counts.to(probs.dtype) / chosen.numel()
    balance = experts * (load * probs.mean(0)).sum()
    z = torch.logsumexp(logits, -1).square().mean()
    if not stats:
        return RouterCall(balance, z, load)
    with torch.no_grad():
        entropy = torch.special.entr(probs).sum(-1).mean()
    return RouterCall(balance, z, load, entropy, chosen.detach())


def combine(calls: Sequence[RouterCall]) -> tuple[Tensor, Tensor]:
    """(load-balancing loss, z-loss) of a forward pass: each the **mean** over its router calls,
    every MoE block in every loop iteration counted once (a shared core's block K times).

    The mean keeps the losses' scale, and OLMoE's coefficients, independent of depth and loop
    count (megablocks, OLMoE's trainer, also divides by the number of MoE layers): perfect
    balance gives 1 however many calls there are. Each iteration's router gets 1/calls of the
    coefficient, as each layer of the compute-matched vanilla MoE model (same unrolled depth,
    same number of calls) does.
    """
    balance = torch.stack([c.balance for c in calls]).mean()
    z = torch.stack([c.z for c in calls]).mean()
    return balance, z


def jaccard(a: Tensor, b: Tensor) -> Tensor:
    """Mean over tokens of |A & B| / |A | B| for two (T, k) sets of distinct expert indices."""
    k = a.shape[-1]
    common = (a.unsqueeze(-1) == b.unsqueeze(-2)).sum((-2, -1)).float()
    return (common / (2 * k - common)).mean()


def block_routing(block: int, calls: Sequence[RouterCall]) -> BlockRouting:
    """One block's :class:`BlockRouting` from its calls (made with statistics) in call order."""
    if any(c.entropy is None or c.chosen is None for c in calls):
        raise ValueError("routing statistics need calls made with stats=True")
    jaccards = [jaccard(a.chosen, b.chosen) for a, b in itertools.pairwise(calls)]  # type: ignore[arg-type]
    load = torch.stack([c.load for c in calls])
    return BlockRouting(
        block=block,
        load=load,
        entropy=torch.stack([c.entropy for c in calls]),  # type: ignore[misc]
        jaccard=torch.stack(jaccards) if jaccards else load.new_zeros(0),
    )


__all__ = ["BlockRouting", "ExpertLinear", "MoE", "RouterCall", "block_routing", "combine", "grouped_mm_available"]
