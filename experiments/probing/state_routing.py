"""How the loop passes state, over training: every loop input's and the coda input's coefficients
(:mod:`mesh_model.state_coefficients`) and MeSH's router statistics, logged at every validation
and at the end of training, in MLflow's ``routing`` section.

Measured on the first ``probes.num_batches`` batches of the main validation split in windows of
``data.seq_len`` tokens (the training length), eval mode, no grad: a forward pass each, cheap
next to a validation. Every looped scheme logs the coefficients, so fixed schemes (constant:
base's coda input is 1 f_K) sit in one figure with MeSH and ``dynamic`` (per token). A vanilla
layout logs nothing.

Metrics, means over every token read (``std``: the spread over tokens):

* ``routing/coef/<state>/<source>/mean`` and ``.../std``: the coefficient of source ``h_emb``,
  ``prelude`` or ``f1`` .. ``fK`` in state ``h0`` .. ``h<K-1>`` (core iteration t's input is
  h(t-1)) or ``coda`` (h(K), what the coda reads);
* MeSH, per router ``transition`` (prelude output -> h(0)) and ``loop1`` .. ``loop<K>`` (core
  step t; loop K's read is the final read) and kind ``write`` / ``read``:
  ``routing/<router>/<kind>/entropy`` the softmax's entropy over log B (1 = uniform, 0 = one
  slot), ``.../logit_std`` the standard deviation of the B logits of a token (after the
  temperature), and ``.../slot<b>`` the mean weight of slot b.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Iterable

import lightning.pytorch as pl
import torch
from torch import Tensor

from mesh_model.mesh_router import Routing
from mesh_model.model import MeshTransformer
from mesh_model.schemes import MeSH
from mesh_model.state_coefficients import mesh_routings, source_names, state_coefficients

PREFIX = "routing"


def state_name(t: int, loops: int) -> str:
    """``h<t>`` for a core iteration's input, ``coda`` for h(K)."""
    return "coda" if t == loops else f"h{t}"


def router_name(index: int) -> str:
    return "transition" if index == 0 else f"loop{index}"


def _router_sums(routing: Routing) -> dict[str, Tensor]:
    """Per kind: token sums of the normalised entropy, the logit std and each slot's weight."""
    slots = routing.write.shape[-1]
    out = {}
    for kind, logits in zip(("write", "read"), routing.logits.split(slots, dim=-1), strict=True):
        logp = torch.log_softmax(logits.double(), dim=-1)
        entropy = -(logp.exp() * logp).sum(-1) / math.log(slots) if slots > 1 else torch.zeros_like(logp[..., 0])
        out[f"{kind}/entropy"] = entropy.sum()
        out[f"{kind}/logit_std"] = logits.double().std(-1, correction=0).sum()
        for b, weight in enumerate(logp.exp().flatten(0, -2).sum(0)):
            out[f"{kind}/slot{b}"] = weight
    return out


@torch.no_grad()
def state_routing_metrics(model: MeshTransformer, batches: Iterable[Tensor], window: int) -> dict[str, float]:
    """The ``routing/*`` metrics (module docstring) of ``model`` on ``batches``, read in windows of
    ``window`` tokens; empty for a vanilla layout. Restores the model's training mode."""
    if model.state_passing is None:
        return {}
    loops = len(model.core_schedule)
    names = source_names(loops)
    sums: dict[str, Tensor] = defaultdict(lambda: torch.zeros((), dtype=torch.float64))
    tokens = 0
    was_training = model.training
    model.eval()
    try:
        device = next(model.parameters()).device
        for ids in (chunk for batch in batches for chunk in batch.to(device).split(window, 1)):
            out = model(ids, return_hidden_states=True, return_logits=False)
            assert out.hidden_states is not None
            for t, (_, c) in enumerate(state_coefficients(model, out.hidden_states).items()):
                state = state_name(t, loops)
                c = c.double().flatten(0, -2)
                for s, source in enumerate(names[: t + 2]):
                    sums[f"coef/{state}/{source}/sum"] += c[:, s].sum()
                    sums[f"coef/{state}/{source}/sq"] += c[:, s].square().sum()
            if isinstance(model.state_passing, MeSH):
                for index, routing in enumerate(mesh_routings(model, out.hidden_states)):
                    for key, value in _router_sums(routing).items():
                        sums[f"{router_name(index)}/{key}"] += value
            tokens += ids.numel()
    finally:
        model.train(was_training)
    return _means(sums, tokens)


def _means(sums: dict[str, Tensor], tokens: int) -> dict[str, float]:
    metrics = {}
    for key, total in sums.items():
        if key.endswith("/sq"):
            continue
        if key.endswith("/sum"):
            base = key.removesuffix("/sum")
            mean = total.item() / tokens
            var = max(sums[f"{base}/sq"].item() / tokens - mean * mean, 0.0)
            metrics[f"{PREFIX}/{base}/mean"] = mean
            metrics[f"{PREFIX}/{base}/std"] = math.sqrt(var)
        else:
            metrics[f"{PREFIX}/{key}"] = total.item() / tokens
    return metrics


class StateRoutingCallback(pl.Callback):
    """Logs :func:`state_routing_metrics` after every validation of the fit and at its end (when
    the last step did not validate), on global rank 0, at the optimizer step count."""

    def __init__(self, num_batches: int = 2) -> None:
        self.num_batches = num_batches
        self._batches: list[Tensor] | None = None
        self._logged_step: int | None = None

    def on_validation_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if not trainer.sanity_checking and trainer.state.fn == "fit":
            self._log(trainer, pl_module)

    def on_train_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self._log(trainer, pl_module)

    def _log(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        step = trainer.global_step
        if not trainer.is_global_zero or trainer.logger is None or self._logged_step == step:
            return
        model = getattr(pl_module, "model", pl_module)
        if getattr(model, "state_passing", None) is None:
            return
        from experiments.probing.batches import held_out_batches

        data = trainer.datamodule.cfg
        if self._batches is None:
            self._batches = held_out_batches(data, trainer.datamodule.data, self.num_batches, data.seq_len)
        trainer.logger.log_metrics(state_routing_metrics(model, self._batches, data.seq_len), step=step)
        self._logged_step = step


__all__ = ["PREFIX", "StateRoutingCallback", "router_name", "state_name", "state_routing_metrics"]
