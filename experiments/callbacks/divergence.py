"""A run whose loss stops being a number has diverged: it stops at that step, FAILED, and no
checkpoint of non-finite weights replaces the last good one."""

from __future__ import annotations

import math
from typing import Any

import lightning.pytorch as pl
import torch

LIKELY_CAUSE = "the learning rate (optim.lr) is likely too high, or the precision too low (trainer.precision)"


class Diverged(RuntimeError):
    """A non-finite training or validation loss (or weights) at ``step``; the message is one line
    starting ``diverged at step N``."""

    one_line = True  # a grid prints its message, not its traceback

    def __init__(self, step: int, what: str, value: float | None = None) -> None:
        shown = f" is {value}" if value is not None else " are not finite"
        super().__init__(f"diverged at step {step}: {what}{shown}; {LIKELY_CAUSE}")
        self.step = step


def finite_weights(module: torch.nn.Module) -> bool:
    return all(bool(torch.isfinite(p).all()) for p in module.parameters())


class StopOnNonFinite(pl.Callback):
    """Raises :class:`Diverged` at the first optimizer step whose training loss, or the first
    validation whose loss, is NaN or infinite."""

    def on_train_batch_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule, outputs: Any, *args: Any) -> None:
        loss = outputs.get("loss") if isinstance(outputs, dict) else outputs
        if isinstance(loss, torch.Tensor) and not bool(torch.isfinite(loss.detach()).all()):
            raise Diverged(trainer.global_step, "the training loss", float(loss.detach().float().mean()))

    def on_validation_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if trainer.sanity_checking:
            return
        for name, value in trainer.callback_metrics.items():
            if name.startswith("val/") and name.endswith("/loss") and not math.isfinite(float(value)):
                raise Diverged(trainer.global_step, f"the validation loss {name}", float(value))
