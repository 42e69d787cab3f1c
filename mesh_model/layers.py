"""The GPT-NeoX (Pythia) block: parallel residual, partial rotary attention, GELU MLP.

Parameter names follow Hugging Face's GPTNeoX modules (``attention.query_key_value``,
``mlp.dense_h_to_4h``...), and the fused QKV projection keeps NeoX's per-head ``[q|k|v]``
layout, so Pythia weights load by name with no reshuffling.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn


def rotary_tables(seq_len: int, rotary_dims: int, base: float, device: torch.device) -> tuple[Tensor, Tensor]:
    """cos and sin of NeoX's non-interleaved rotary embedding, shape (seq_len, 1, rotary_dims // 2).

    NeoX rotates pairs (i, i + rotary_dims/2); both members of a pair share one angle, so half a
    table is enough. The middle axis broadcasts over heads in the (batch, seq, heads, dim) layout.
    """
    inv_freq = 1.0 / (base ** (torch.arange(0, rotary_dims, 2, dtype=torch.float32, device=device) / rotary_dims))
    positions = torch.arange(seq_len, dtype=torch.float32, device=device)
    angles = torch.outer(positions, inv_freq).unsqueeze(1)
    return angles.cos(), angles.sin()


def rotary_qkv_functional(qkv: Tensor, cos: Tensor, sin: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    """``RotaryQKV`` in plain differentiable ops: what ``torch.compile`` traces and fuses (Dynamo
    does not take the in-place writes of the eager Function)."""
    half = cos.shape[-1]
    x = qkv[..., :2, :]
    cos, sin = cos.to(qkv.dtype).unsqueeze(-2), sin.to(qkv.dtype).unsqueeze(-2)
    x1, x2, rest = x[..., :half], x[..., half : 2 * half], x[..., 2 * half :]
    qk = torch.cat((x1 * cos - x2 * sin, x2 * cos + x1 * sin, rest), dim=-1)
    return qk[..., 0, :], qk[..., 1, :], qkv[..., 2, :]


def _fused_tables(cos: Tensor, sin: Tensor, head_dim: int, dtype: torch.dtype) -> tuple[Tensor, Tensor, Tensor]:
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


class RotaryQKV(torch.autograd.Function):
    """Rotate q and k of NeoX's fused projection in one pass each way.

    Input and output (batch, seq, heads, 3, head_dim), NeoX's per-head [q|k|v]; v passes through.
    Written as a Function because autograd of the slice/cat formulation allocates zero-filled
    gradients for every slice and concatenates twice; here backward applies the transposed
    rotation to the incoming gradient in the same three row-wide passes.
    """

    @staticmethod
    def forward(ctx, qkv: Tensor, cos: Tensor, sin: Tensor) -> Tensor:  # type: ignore[override]
        batch, seq, heads, _, head_dim = qkv.shape
        tables = _fused_tables(cos, sin, head_dim, qkv.dtype)
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


class Attention(nn.Module):
    def __init__(self, d_model: int, n_heads: int) -> None:
        super().__init__()
        self.n_heads = n_heads
        self.head_dim = d_model // n_heads
        self.query_key_value = nn.Linear(d_model, 3 * d_model)
        self.dense = nn.Linear(d_model, d_model)

    def forward(self, x: Tensor, rope: tuple[Tensor, Tensor]) -> Tensor:
        batch, seq, d_model = x.shape
        qkv = self.query_key_value(x).view(batch, seq, self.n_heads, 3, self.head_dim)
        if torch.compiler.is_compiling():
            q, k, v = rotary_qkv_functional(qkv, *rope)
        else:
            q, k, v = RotaryQKV.apply(qkv, *rope).unbind(3)  # unbind: one stacked gradient, no zero fills
        # (batch, seq, heads, dim) storage seen as (batch, heads, seq, dim): SDPA's kernels take
        # strided inputs, and the output transposes back to (batch, seq, d_model) without a copy.
        y = F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), is_causal=True)
        return self.dense(y.transpose(1, 2).reshape(batch, seq, d_model))


class MLP(nn.Module):
    def __init__(self, d_model: int, d_hidden: int) -> None:
        super().__init__()
        self.dense_h_to_4h = nn.Linear(d_model, d_hidden)
        self.dense_4h_to_h = nn.Linear(d_hidden, d_model)

    def forward(self, x: Tensor) -> Tensor:
        return self.dense_4h_to_h(F.gelu(self.dense_h_to_4h(x)))


class Block(nn.Module):
    """x + attn(LN1(x)) + mlp(LN2(x)), with untied LayerNorms (GPT-NeoX parallel residual)."""

    def __init__(self, d_model: int, n_heads: int, d_hidden: int, eps: float) -> None:
        super().__init__()
        self.input_layernorm = nn.LayerNorm(d_model, eps=eps)
        self.post_attention_layernorm = nn.LayerNorm(d_model, eps=eps)
        self.attention = Attention(d_model, n_heads)
        self.mlp = MLP(d_model, d_hidden)

    def output_projections(self) -> tuple[nn.Linear, nn.Linear]:
        """The projections that write into the residual stream (depth-scaled at init)."""
        return self.attention.dense, self.mlp.dense_4h_to_h

    def forward(self, x: Tensor, rope: tuple[Tensor, Tensor]) -> Tensor:
        return x + self.attention(self.input_layernorm(x), rope) + self.mlp(self.post_attention_layernorm(x))


class Stack(nn.Sequential):
    """A run of blocks applied in order; the unit that a layout shares or repeats."""

    def forward(self, x: Tensor, rope: tuple[Tensor, Tensor]) -> Tensor:  # type: ignore[override]
        for block in self:
            x = block(x, rope)
        return x
