"""Next-token cross-entropy straight from the last hidden state, without the full logits.

The (tokens, vocab) logits of a training batch are the largest activation of a small model and
the softmax over them is pure memory traffic. ``linear_cross_entropy`` walks the tokens in chunks:
for each chunk it forms the logits, the loss and, when gradients are wanted, the gradients of the
hidden states and of the output projection (softmax minus one-hot, the same three matmuls as
the unfused backward). Peak extra memory is one chunk of logits instead of all of them.

On CUDA the same fused loss has a faster kernel, Liger-Kernel's fused linear cross-entropy
(Triton, ``pip install liger-kernel``): the backend is picked per call by
:func:`loss_backend`, from the ``backend`` argument or ``$MESH_LOSS_BACKEND`` (auto, chunked,
liger; default auto).
"""

from __future__ import annotations

import functools
import os
from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import Tensor

from mesh_model.errors import ConfigError

IGNORE_INDEX = -100
# Logits per chunk: 4 MiB of fp32 on a CPU (cache-sized), 256 MiB on an accelerator (few launches).
CHUNK_ELEMENTS = {"cpu": 1 << 20}
ACCELERATOR_CHUNK_ELEMENTS = 1 << 26
MIN_CHUNK_ROWS = 128


def shifted_targets(labels: Tensor) -> Tensor:
    """Position i predicts labels[i+1]; the last position of every sequence predicts nothing."""
    pad = labels.new_full((labels.shape[0], 1), IGNORE_INDEX)
    return torch.cat((labels[:, 1:], pad), dim=1).reshape(-1)


def chunk_rows(vocab_size: int, device: torch.device | str = "cpu") -> int:
    elements = CHUNK_ELEMENTS.get(torch.device(device).type, ACCELERATOR_CHUNK_ELEMENTS)
    return max(MIN_CHUNK_ROWS, elements // vocab_size)


def _at_least_fp32(x: Tensor) -> Tensor:
    """Softmax statistics in fp32 under bf16/fp16 (and in fp64 when the inputs are fp64)."""
    return x.to(torch.promote_types(x.dtype, torch.float32))


class _LinearCrossEntropy(torch.autograd.Function):
    """Mean cross-entropy of ``hidden @ weight.T`` against ``targets``; gradients formed in forward."""

    @staticmethod
    def forward(ctx, hidden: Tensor, weight: Tensor, targets: Tensor) -> Tensor:  # type: ignore[override]
        valid = targets != IGNORE_INDEX
        safe_targets = targets.masked_fill(~valid, 0).unsqueeze(1)
        scale = valid.to(_at_least_fp32(hidden).dtype) / valid.sum().clamp(min=1)
        want_hidden, want_weight = ctx.needs_input_grad[0], ctx.needs_input_grad[1]
        grad_hidden = torch.empty_like(hidden) if want_hidden else None
        grad_weight = torch.zeros_like(_at_least_fp32(weight)) if want_weight else None
        loss = torch.zeros((), dtype=_at_least_fp32(hidden).dtype, device=hidden.device)
        rows = chunk_rows(weight.shape[0], weight.device)
        device_type = weight.device.type
        autocast = torch.is_autocast_enabled(device_type)
        matmul_dtype = torch.get_autocast_dtype(device_type) if autocast else weight.dtype
        for start in range(0, hidden.shape[0], rows):
            stop = min(start + rows, hidden.shape[0])
            h, chunk_scale = hidden[start:stop], scale[start:stop, None]
            logits = _at_least_fp32(h @ weight.t())
            target_logits = logits.gather(1, safe_targets[start:stop])
            if grad_hidden is None and grad_weight is None:
                lse = torch.logsumexp(logits, dim=-1, keepdim=True)
                loss += ((lse - target_logits) * chunk_scale).sum()
                continue
            # logsumexp and the softmax from one exp pass, in place of the logits: lse = m + log s
            # with s = sum exp(logits - m), the softmax exp(logits - m) / s.
            peak = logits.amax(dim=-1, keepdim=True)
            exps = logits.sub_(peak).exp_()
            total = exps.sum(dim=-1, keepdim=True)
            loss += ((peak + total.log() - target_logits) * chunk_scale).sum()
            probs = exps.mul_(chunk_scale / total)  # the softmax, scaled by each row's weight in the mean
            probs.scatter_add_(1, safe_targets[start:stop], -chunk_scale)  # minus the one-hot, scaled
            grad_logits = probs.to(matmul_dtype)  # one cast, used by both matmuls
            if grad_hidden is not None:
                grad_hidden[start:stop] = grad_logits @ weight
            if grad_weight is not None:
                grad_weight += grad_logits.t() @ h
        ctx.save_for_backward(grad_hidden, grad_weight)
        ctx.weight_dtype = weight.dtype
        return loss

    @staticmethod
    def backward(ctx, grad_loss: Tensor) -> tuple[Tensor | None, Tensor | None, None]:  # type: ignore[override]
        grad_hidden, grad_weight = ctx.saved_tensors
        hidden_grad = grad_hidden * grad_loss.to(grad_hidden.dtype) if grad_hidden is not None else None
        weight_grad = (grad_weight * grad_loss).to(ctx.weight_dtype) if grad_weight is not None else None
        return hidden_grad, weight_grad, None


BACKENDS = ("auto", "chunked", "liger")
BACKEND_ENV = "MESH_LOSS_BACKEND"


@functools.cache
def _liger_function() -> Callable[..., Tensor] | None:
    """Liger-Kernel's functional fused linear cross-entropy, or None where it is not installed."""
    try:
        from liger_kernel.transformers.functional import liger_fused_linear_cross_entropy
    except ImportError:
        return None
    return liger_fused_linear_cross_entropy


def loss_backend(device: torch.device | str, backend: str | None = None) -> str:
    """The backend that computes the loss of tensors on ``device``: ``backend``, else
    ``$MESH_LOSS_BACKEND``, else auto. Auto is liger on CUDA where liger-kernel imports, chunked
    otherwise, and chunked under ``torch.compile`` (Liger's ``.item()`` would break the graph,
    and inductor fuses the chunked loop itself). An explicit liger that cannot run is an error."""
    field = "backend" if backend is not None else BACKEND_ENV
    name = backend if backend is not None else os.environ.get(BACKEND_ENV) or "auto"
    if name not in BACKENDS:
        raise ConfigError(field, name, f"one of {', '.join(BACKENDS)}")
    on_cuda = torch.device(device).type == "cuda"
    if name == "auto":
        usable = on_cuda and not torch.compiler.is_compiling() and _liger_function() is not None
        return "liger" if usable else "chunked"
    if name == "liger" and not on_cuda:
        raise ConfigError(field, name, f"liger runs on CUDA tensors only (these are on {device}); use chunked or auto")
    if name == "liger" and _liger_function() is None:
        raise ConfigError(field, name, "liger needs the liger-kernel package (pip install liger-kernel); use chunked")
    return name


def _chunked(hidden: Tensor, weight: Tensor, targets: Tensor) -> Tensor:
    """The pure-torch loss: gradients formed in the forward when wanted, else the loss alone."""
    if torch.is_grad_enabled() and (hidden.requires_grad or weight.requires_grad):
        return _LinearCrossEntropy.apply(hidden, weight, targets)
    with torch.no_grad():
        total = torch.zeros((), dtype=_at_least_fp32(hidden).dtype, device=hidden.device)
        rows = chunk_rows(weight.shape[0], weight.device)
        for start in range(0, hidden.shape[0], rows):
            logits = _at_least_fp32(hidden[start : start + rows] @ weight.t())
            total += F.cross_entropy(logits, targets[start : start + rows], ignore_index=IGNORE_INDEX, reduction="sum")
        return total / (targets != IGNORE_INDEX).sum().clamp(min=1)


def _liger(hidden: Tensor, weight: Tensor, targets: Tensor) -> Tensor:
    """Liger's kernel with our semantics: mean over the non-ignored targets, fp32 softmax
    statistics (its kernel upcasts the bf16 logits), the weight's gradient summed in fp32."""
    liger = _liger_function()
    assert liger is not None, "loss_backend() checked the import"
    return liger(
        hidden.contiguous(),
        weight,
        targets.contiguous(),
        ignore_index=IGNORE_INDEX,
        reduction="mean",
        accum_dtype=torch.float32,
    )


_LOSSES: dict[str, Callable[[Tensor, Tensor, Tensor], Tensor]] = {"chunked": _chunked, "liger": _liger}


def linear_cross_entropy(hidden: Tensor, weight: Tensor, targets: Tensor, backend: str | None = None) -> Tensor:
    """Mean cross-entropy of the logits ``hidden @ weight.T`` (hidden (T, D), weight (V, D),
    targets (T,) with ``IGNORE_INDEX`` skipped), equal to ``F.cross_entropy`` on the full logits.
    ``backend`` (auto, chunked, liger) overrides ``$MESH_LOSS_BACKEND``; see :func:`loss_backend`."""
    return _LOSSES[loss_backend(hidden.device, backend)](hidden, weight, targets)


__all__ = ["BACKENDS", "BACKEND_ENV", "IGNORE_INDEX", "linear_cross_entropy", "loss_backend", "shifted_targets"]
