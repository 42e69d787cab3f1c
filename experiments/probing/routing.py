"""Routing probes of a mixture-of-experts run (beyond the paper): how each MoE block routes the
held-out tokens, loop iteration by loop iteration.

:func:`routing_report` runs the model (eval mode, no grad) with ``return_routing=True`` on the same
held-out batches the hidden-state probes read, in the same windows, and averages each statistic of
:class:`~mesh_model.moe.BlockRouting` over every token read (each window weighted by its tokens).
A block is named by its module (``prelude.0``, ``cores.0.1``, ``coda.0``); a core block's router is
called once per loop iteration, so its statistics are per iteration t = 1..K. A dense model has no
routing report (None) and logs none of these metrics.

Metrics (:meth:`RoutingReport.as_metrics`), ``<at>`` being ``<block>/iter<t>`` for a core block's
t-th call and ``<block>`` for a block called once (prelude, coda, every block of a vanilla layout):

* ``probe/moe_load_cv/<at>``: coefficient of variation of the expert load, population std / mean
  of the E experts' shares of the top-k assignments: 0 = perfectly balanced, sqrt(E/k - 1) = every
  token sent to the same k experts;
* ``probe/moe_load_max/<at>``, ``probe/moe_load_min/<at>``: the most and the least loaded expert's
  share x E (1 = its share under uniform routing; a min of 0 is an expert no token chose);
* ``probe/moe_entropy/<at>``: mean over tokens of the router distribution's entropy, in nats, in
  [0, log E] (log E: uniform over all experts);
* ``probe/moe_jaccard/<block>/iter<t>/iter<t+1>``: mean over tokens of |S_t & S_t+1| / |S_t | S_t+1|,
  S_t the token's chosen top-k experts at iteration t: 1 = the same experts at both iterations;
* ``probe/moe_load_cv/mean``, ``probe/moe_entropy/mean``: the mean over every router call of the
  pass (compare a vanilla MoE with a looped one of the same compute depth);
  ``probe/moe_load_cv/loop_mean``, ``probe/moe_entropy/loop_mean``: the mean over the core blocks'
  calls, and ``probe/moe_jaccard/loop_mean``: over the core blocks' consecutive iterations
  (looped layouts with MoE core blocks);
* ``probe/moe_jaccard/chance``: the expected Jaccard of two independent uniformly random top-k
  sets of the E experts, what routing unrelated from one iteration to the next reads (E = 8,
  k = 2: 5/28 = 0.179); like the CKA floors, a reference, not an offset.

``probes.json`` keeps the whole report under ``routing`` (:func:`routing_to_dict`): every call's
full load vector, entropy and Jaccard.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor, nn

from mesh_model.moe import BlockRouting
from mesh_model.probe_names import CORE_PREFIX, router_calls


def chance_jaccard(experts: int, top_k: int) -> float:
    """E|A & B| / |A | B| for independent uniformly random ``top_k``-subsets A, B of ``experts``:
    |A & B| is hypergeometric, P(i) = C(k, i) C(E - k, k - i) / C(E, k)."""
    total = math.comb(experts, top_k)
    return sum(
        math.comb(top_k, i) * math.comb(experts - top_k, top_k - i) / total * i / (2 * top_k - i)
        for i in range(top_k + 1)
    )


def load_stats(load: Tensor) -> dict[str, Tensor]:
    """(..., E) expert shares -> their coefficient of variation and max and min share x E, each (...)."""
    load = load.to(torch.float64)
    experts = load.shape[-1]
    mean = load.mean(-1)
    return {
        "cv": load.std(-1, correction=0) / mean,
        "max": load.amax(-1) * experts,
        "min": load.amin(-1) * experts,
    }


@dataclass
class RoutingReport:
    """Each MoE block's routing over the held-out tokens (token-weighted means), blocks in the order
    their routers first ran; ``tokens`` is the number of tokens each call routed."""

    experts: int
    top_k: int
    tokens: int
    blocks: dict[str, BlockRouting]

    def as_metrics(self) -> dict[str, float]:
        """The flat metric names of the module docstring."""
        metrics: dict[str, float] = {}
        every: dict[str, list[float]] = {"load_cv": [], "entropy": []}
        loop: dict[str, list[float]] = {"load_cv": [], "entropy": [], "jaccard": []}
        for block, routing in self.blocks.items():
            stats = load_stats(routing.load)
            names = router_calls(block, len(routing.entropy))
            for t, at in enumerate(names):
                values = {
                    "load_cv": stats["cv"][t].item(),
                    "load_max": stats["max"][t].item(),
                    "load_min": stats["min"][t].item(),
                    "entropy": routing.entropy[t].item(),
                }
                for kind, value in values.items():
                    metrics[f"probe/moe_{kind}/{at}"] = value
                for kind in every:
                    every[kind].append(values[kind])
                    if block.startswith(CORE_PREFIX):
                        loop[kind].append(values[kind])
            for t, value in enumerate(routing.jaccard.tolist(), 1):
                metrics[f"probe/moe_jaccard/{block}/iter{t}/iter{t + 1}"] = value
                if block.startswith(CORE_PREFIX):
                    loop["jaccard"].append(value)
        for kind, values in every.items():
            if values:
                metrics[f"probe/moe_{kind}/mean"] = sum(values) / len(values)
        if loop["jaccard"]:  # a looped layout: its core blocks ran more than once
            for kind, values in loop.items():
                metrics[f"probe/moe_{kind}/loop_mean"] = sum(values) / len(values)
        metrics["probe/moe_jaccard/chance"] = chance_jaccard(self.experts, self.top_k)
        return metrics


@torch.no_grad()
def routing_report(model: nn.Module, batches: Iterable[Tensor], window: int | None = None) -> RoutingReport | None:
    """The routing of ``model`` on each batch of input ids, read in windows of at most ``window``
    tokens as :func:`mesh_model.probes.probe_report` reads them; None for a dense model. The
    model's training mode is restored afterwards."""
    moe = getattr(getattr(model, "config", None), "moe", None)
    if moe is None:
        return None
    was_training = model.training
    model.eval()
    device = next(model.parameters()).device
    sums: dict[str, dict[str, Tensor]] = {}
    index: dict[str, int] = {}
    tokens = 0
    try:
        for input_ids in batches:
            for chunk in input_ids.to(device).split(window or input_ids.shape[1], 1):
                weight = chunk.numel()
                tokens += weight
                for block, routing in (model(chunk, return_routing=True).routing or {}).items():
                    index[block] = routing.block
                    parts = sums.setdefault(block, {})
                    for key in ("load", "entropy", "jaccard"):
                        value = getattr(routing, key).detach().to("cpu", torch.float64) * weight
                        parts[key] = parts[key] + value if key in parts else value
    finally:
        model.train(was_training)
    if not tokens:
        raise ValueError("routing_report needs at least one batch")
    blocks = {
        block: BlockRouting(index[block], parts["load"] / tokens, parts["entropy"] / tokens, parts["jaccard"] / tokens)
        for block, parts in sums.items()
    }
    return RoutingReport(experts=moe.experts, top_k=moe.top_k, tokens=tokens, blocks=blocks)


def routing_to_dict(report: RoutingReport) -> dict[str, Any]:
    """JSON-ready: the full load vectors, entropies and Jaccard overlaps of every block."""
    return {
        "experts": report.experts,
        "top_k": report.top_k,
        "tokens": report.tokens,
        "blocks": {
            block: {
                "block": routing.block,
                "load": routing.load.tolist(),
                "entropy": routing.entropy.tolist(),
                "jaccard": routing.jaccard.tolist(),
            }
            for block, routing in report.blocks.items()
        },
    }


def routing_from_dict(data: Mapping[str, Any]) -> RoutingReport:
    """The :class:`RoutingReport` that :func:`routing_to_dict` wrote."""

    def tensor(values: list) -> Tensor:
        return torch.tensor(values, dtype=torch.float64)

    return RoutingReport(
        experts=int(data["experts"]),
        top_k=int(data["top_k"]),
        tokens=int(data["tokens"]),
        blocks={
            block: BlockRouting(
                int(v["block"]),
                tensor(v["load"]).reshape(-1, int(data["experts"])),
                tensor(v["entropy"]),
                tensor(v["jaccard"]),
            )
            for block, v in data["blocks"].items()
        },
    )


__all__ = [
    "RoutingReport",
    "chance_jaccard",
    "load_stats",
    "routing_from_dict",
    "routing_report",
    "routing_to_dict",
]
