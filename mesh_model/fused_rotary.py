"""The fast path of NeoX's rotary embedding in eager mode: one autograd Function.

Why it exists. The reference, :func:`mesh_model.layers.rotary_qkv`, slices q and k out of the
fused per-head ``[q|k|v]`` projection, rotates the narrow rotary slices and concatenates. Its
autograd allocates a zero-filled gradient for every slice and concatenates twice more in
backward. :class:`FusedRotaryQKV` instead runs three passes over whole contiguous rows each way:
the rotation is written as per-position tables that switch the products off outside the rotary
pairs, and backward applies the transposed rotation to the incoming gradient.

It is only the eager path: ``torch.compile`` runs the reference (Dynamo cannot trace the in-place
writes here, and fuses the plain ops itself); :func:`mesh_model.layers.rotate_qkv` makes that
choice. ``tests/test_fast_paths.py`` holds the two equal, forward and gradients.
"""

from __future__ import annotations

import torch
from torch import Tensor


def _tables(cos: Tensor, sin: Tensor, head_dim: int, dtype: torch.dtype) -> tuple[Tensor, Tensor, Tensor]:
    """Per-position tables over one head's [q|k|v] row (3 * head_dim wide), shape (L, 1, 3*head_dim):
    ``scale`` multiplies x_i, ``from_right`` multiplies x_{i+half}, ``from_left`` x_{i-half}."""
    seq, half = cos.shape[0], cos.shape[-1]
    scale = cos.new_ones(seq, 1, 3, head_dim, dtype=dtype)
    from_right = cos.new_zeros(seq, 1, 3, head_dim, dtype=dtype)
    from_left = cos.new_zeros(seq, 1, 3, head_dim, dtype=dtype)
    scale[..., :2, :half] = cos.unsqueeze(-2)
    scale[..., :2, half : 2 * half] = cos.unsqueeze(-2)
    from_right[..., :2, :half] = -sin.unsqueeze(-2)
    from_left[..., :2, half : 2 * half] = sin.unsqueeze(-2)
    return scale.flatten(-2), from_right.flatten(-2), from_left.flatten(-2)


def _rotate(x: Tensor, scale: Tensor, from_right: Tensor, from_left: Tensor, half: int) -> Tensor:
    """out_i = scale_i x_i + from_right_i x_{i+half} + from_left_i x_{i-half} along the last dim.

    The shifted products run over whole contiguous rows (the zero table entries switch them off
    outside the rotary pairs), which is several times faster than rotating the narrow rotary slices."""
    out = x * scale
    if half:
        out[..., :-half].addcmul_(x[..., half:], from_right[..., :-half])
        out[..., half:].addcmul_(x[..., :-half], from_left[..., half:])
    return out


class FusedRotaryQKV(torch.autograd.Function):
    """Rotate q and k of NeoX's fused projection in one pass each way.

    Input and output (batch, seq, heads, 3, head_dim), NeoX's per-head [q|k|v]; v passes through.
    """

    @staticmethod
    def forward(ctx, qkv: Tensor, cos: Tensor, sin: Tensor) -> Tensor:  # type: ignore[override]
        batch, seq, heads, _, head_dim = qkv.shape
        tables = _tables(cos, sin, head_dim, qkv.dtype)
        ctx.save_for_backward(*tables)
        ctx.half = cos.shape[-1]
        out = _rotate(qkv.reshape(batch, seq, heads, 3 * head_dim), *tables, ctx.half)
        return out.view(qkv.shape)

    @staticmethod
    def backward(ctx, grad: Tensor) -> tuple[Tensor, None, None]:  # type: ignore[override]
        scale, from_right, from_left = ctx.saved_tensors
        half = ctx.half
        shape = grad.shape
        g = grad.reshape(*shape[:3], -1)
        # the transpose of the rotation: what x_{i+half} fed into out_i flows back from out_i
        out = g * scale
        if half:
            out[..., half:].addcmul_(g[..., :-half], from_right[..., :-half])
            out[..., :-half].addcmul_(g[..., half:], from_left[..., half:])
        return out.view(shape), None, None


def fused_rotary_qkv(qkv: Tensor, cos: Tensor, sin: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    """(q, k, v) as :func:`mesh_model.layers.rotary_qkv` returns them, through the Function.
    ``unbind`` keeps one stacked gradient for the three, with no zero fills."""
    q, k, v = FusedRotaryQKV.apply(qkv, cos, sin).unbind(3)
    return q, k, v
