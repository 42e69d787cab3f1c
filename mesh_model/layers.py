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
    """cos and sin tables of shape (seq_len, rotary_dims), NeoX's non-interleaved convention."""
    inv_freq = 1.0 / (base ** (torch.arange(0, rotary_dims, 2, dtype=torch.float32, device=device) / rotary_dims))
    positions = torch.arange(seq_len, dtype=torch.float32, device=device)
    freqs = torch.outer(positions, inv_freq)
    angles = torch.cat((freqs, freqs), dim=-1)
    return angles.cos(), angles.sin()


def _rotate_half(x: Tensor) -> Tensor:
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat((-x2, x1), dim=-1)


def apply_rotary(x: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
    """Rotate the first ``cos.shape[-1]`` dims of ``x`` (batch, heads, seq, head_dim); pass the rest."""
    dims = cos.shape[-1]
    rot, rest = x[..., :dims], x[..., dims:]
    rot = rot * cos.to(x.dtype) + _rotate_half(rot) * sin.to(x.dtype)
    return torch.cat((rot, rest), dim=-1)


class Attention(nn.Module):
    def __init__(self, d_model: int, n_heads: int) -> None:
        super().__init__()
        self.n_heads = n_heads
        self.head_dim = d_model // n_heads
        self.query_key_value = nn.Linear(d_model, 3 * d_model)
        self.dense = nn.Linear(d_model, d_model)

    def forward(self, x: Tensor, rope: tuple[Tensor, Tensor]) -> Tensor:
        batch, seq, d_model = x.shape
        qkv = self.query_key_value(x).view(batch, seq, self.n_heads, 3 * self.head_dim).transpose(1, 2)
        q, k, v = qkv.split(self.head_dim, dim=-1)
        cos, sin = rope
        q, k = apply_rotary(q, cos, sin), apply_rotary(k, cos, sin)
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
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
