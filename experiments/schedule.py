"""The learning-rate schedule of the paper: linear warmup, then cosine decay to a floor."""

from __future__ import annotations

import math


def warmup_steps(max_steps: int, warmup_fraction: float, steps: int | None = None) -> int:
    """The warmup's length in optimizer steps: ``steps`` when given, else ``warmup_fraction`` of
    the run (at least 1)."""
    return steps if steps is not None else max(1, round(warmup_fraction * max_steps))


def lr_multiplier(
    step: int,
    max_steps: int,
    warmup_fraction: float = 0.01,
    min_lr_ratio: float = 0.1,
    warmup: int | None = None,
) -> float:
    """Factor on the peak LR at optimizer step ``step`` (0-based).

    Rises linearly to 1 at the end of warmup (``warmup`` steps, or ``warmup_fraction`` of
    ``max_steps``), then follows a half cosine down to ``min_lr_ratio`` at ``max_steps`` (and
    stays there).
    """
    warmup = warmup_steps(max_steps, warmup_fraction, warmup)
    if step < warmup:
        return (step + 1) / warmup
    progress = min(1.0, (step - warmup) / max(1, max_steps - warmup))
    return min_lr_ratio + (1.0 - min_lr_ratio) * 0.5 * (1.0 + math.cos(math.pi * progress))
