"""Seeded initialisation that pairs: one random stream per tensor, named by the tensor's role.

A comparison of two schemes at the same seed is only paired if both start from the same shared
weights. Drawing every tensor from one global generator in build order breaks that: MeSH's routers
(or ``dynamic``'s coefficients, a vanilla model's extra layers, MoE routers) consume draws and shift
every tensor initialised after them. Here each tensor draws from its own generator, seeded by
``(seed, key)``: the key names the tensor's role, not its position in the build, so

* every tensor two variants share (embeddings, the i-th distinct block, final norm, head) starts
  bit-identical whatever the scheme, B or MoE routers — block keys are the distinct-block index in
  build order (prelude, cores, coda), so a vanilla model's first layers start as the looped
  model's distinct blocks;
* a scheme's own parameters (``scheme/...``) draw from streams of their own, derived from the seed;
* values are drawn on the CPU in float32 and copied, so they do not depend on the device.
"""

from __future__ import annotations

import hashlib

import torch
from torch import Tensor

SEED_BITS = 63  # a torch.Generator seed is a non-negative 64-bit integer


def tensor_seed(seed: int, key: str) -> int:
    """The seed of ``key``'s stream: a hash of both, so streams of different keys are unrelated."""
    digest = hashlib.sha256(f"{seed}\x00{key}".encode()).digest()
    return int.from_bytes(digest[:8], "little") >> (64 - SEED_BITS)


class SeededInit:
    """Normal draws for named tensors from one seed (see the module docstring)."""

    def __init__(self, seed: int) -> None:
        self.seed = int(seed)

    @classmethod
    def from_global_rng(cls) -> SeededInit:
        """A seed drawn from torch's global generator: after ``torch.manual_seed(s)`` (or Lightning's
        ``seed_everything(s)``) the same for every model built first, whatever its scheme."""
        return cls(int(torch.randint(0, 2**SEED_BITS - 1, (), dtype=torch.int64, device="cpu")))

    @torch.no_grad()
    def normal_(self, tensor: Tensor, std: float, key: str) -> Tensor:
        """Fill ``tensor`` with Normal(0, std) from ``key``'s stream (nothing to draw on ``meta``)."""
        if tensor.is_meta:
            return tensor
        generator = torch.Generator().manual_seed(tensor_seed(self.seed, key))
        values = torch.randn(tensor.shape, generator=generator, dtype=torch.float32)
        return tensor.copy_(values.mul_(std))


__all__ = ["SeededInit", "tensor_seed"]
