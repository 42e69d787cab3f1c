"""The GPT-NeoX (Pythia) block: parallel residual, partial rotary attention, GELU MLP (or the
mixture-of-experts feed-forward of :mod:`mesh_model.moe`).

Parameter names follow Hugging Face's GPTNeoX modules (``attention.query_key_value``,
``mlp.dense_h_to_4h``...), and the fused QKV projection keeps NeoX's per-head ``[q|k|v]``
layout, so Pythia weights load by name with no reshuffling.

The rotary embedding here (:func:`rotary_tables`, :func:`rotary_qkv`) is the reference, in plain
differentiable ops; eager mode runs a fused equivalent from :mod:`mesh_model.fused_rotary`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from mesh_model.fused_rotary import fused_rotary_qkv
from mesh_model.moe import MoE, RouterCall

if TYPE_CHECKING:
    from mesh_model.config import MoESpec


def rotary_tables(seq_len: int, rotary_dims: int, base: float, device: torch.device) -> tuple[Tensor, Tensor]:
    """cos and sin of NeoX's non-interleaved rotary embedding, shape (seq_len, 1, rotary_dims // 2).

    NeoX rotates pairs (i, i + rotary_dims/2); both members of a pair share one angle, so half a
    table is enough. The middle axis broadcasts over heads in the (batch, seq, heads, dim) layout.
    """
    inv_freq = 1.0 / (base ** (torch.arange(0, rotary_dims, 2, dtype=torch.float32, device=device) / rotary_dims))
    positions = torch.arange(seq_len, dtype=torch.float32, device=device)
    angles = torch.outer(positions, inv_freq).unsqueeze(1)
    return angles.cos(), angles.sin()


def rotary_qkv(qkv: Tensor, cos: Tensor, sin: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    """q, k, v from NeoX's fused projection, with q and k rotated: the reference rotary.

    ``qkv`` is (batch, seq, heads, 3, head_dim), NeoX's per-head [q|k|v]; each output is
    (batch, seq, heads, head_dim). The pair (x_i, x_{i+half}) of q and k at position p turns by
    p * theta_i; the dims past ``rotary_dims`` and all of v pass through unchanged.
    """
    half = cos.shape[-1]
    x = qkv[..., :2, :]  # q and k
    cos, sin = cos.to(qkv.dtype).unsqueeze(-2), sin.to(qkv.dtype).unsqueeze(-2)
    x1, x2, rest = x[..., :half], x[..., half : 2 * half], x[..., 2 * half :]
    qk = torch.cat((x1 * cos - x2 * sin, x2 * cos + x1 * sin, rest), dim=-1)
    return qk[..., 0, :], qk[..., 1, :], qkv[..., 2, :]


def rotary_qkv_for_mode(qkv: Tensor, cos: Tensor, sin: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    """The rotary that attention runs, the one place that picks it; both are equal up to float
    rounding. Eager mode takes the fused Function (:mod:`mesh_model.fused_rotary`: fewer passes,
    no zero-filled gradients); ``torch.compile`` traces the reference, since Dynamo cannot trace
    the Function's in-place writes (and fuses the plain ops itself)."""
    if torch.compiler.is_compiling():
        return rotary_qkv(qkv, cos, sin)
    return fused_rotary_qkv(qkv, cos, sin)


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
        q, k, v = rotary_qkv_for_mode(qkv, *rope)
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
    """x + attn(LN1(x)) + mlp(LN2(x)), with untied LayerNorms (GPT-NeoX parallel residual).
    With ``moe`` the MLP is the mixture of experts (:class:`mesh_model.moe.MoE`)."""

    def __init__(self, d_model: int, n_heads: int, d_hidden: int, eps: float, moe: MoESpec | None = None) -> None:
        super().__init__()
        self.input_layernorm = nn.LayerNorm(d_model, eps=eps)
        self.post_attention_layernorm = nn.LayerNorm(d_model, eps=eps)
        self.attention = Attention(d_model, n_heads)
        self.mlp: MLP | MoE = (
            MLP(d_model, d_hidden) if moe is None else MoE(d_model, moe.hidden, moe.experts, moe.top_k)
        )

    def output_projections(self) -> tuple[nn.Module, nn.Module]:
        """The projections that write into the residual stream (depth-scaled at init): Linears,
        and the experts' stacked down-projections in a MoE block."""
        return self.attention.dense, self.mlp.dense_4h_to_h

    def forward(self, x: Tensor, rope: tuple[Tensor, Tensor]) -> Tensor:
        return self.run(x, rope)[0]

    def run(self, x: Tensor, rope: tuple[Tensor, Tensor], stats: bool = False) -> tuple[Tensor, RouterCall | None]:
        """The block's output and, in a MoE block, its router call (``stats``: with statistics)."""
        attention = self.attention(self.input_layernorm(x), rope)
        if isinstance(self.mlp, MoE):
            mlp, call = self.mlp(self.post_attention_layernorm(x), stats)
            return x + attention + mlp, call
        return x + attention + self.mlp(self.post_attention_layernorm(x)), None


class Stack(nn.Sequential):
    """A run of blocks applied in order; the unit that a layout shares or repeats."""

    def forward(self, x: Tensor, rope: tuple[Tensor, Tensor]) -> Tensor:  # type: ignore[override]
        return self.run(x, rope)[0]

    def run(self, x: Tensor, rope: tuple[Tensor, Tensor], stats: bool = False) -> tuple[Tensor, tuple[RouterCall, ...]]:
        """The stack's output and the router calls of its MoE blocks, in block order. A dense
        block is called as a module, as before MoE existed (its hooks run)."""
        calls = []
        for block in self:
            if isinstance(block.mlp, MoE):
                x, call = block.run(x, rope, stats)
                calls.append(call)
            else:
                x = block(x, rope)
        return x, tuple(calls)
