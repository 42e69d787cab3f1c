"""A run whose loss stops being a number has diverged: it stops at that step, FAILED, and no
checkpoint of non-finite weights replaces the last good one; unless the researcher asks to train on
(``allow_nonfinite=true``)."""

from __future__ import annotations

import math
import sys
from typing import Any

import lightning.pytorch as pl
import torch
from lightning.pytorch.loggers import MLFlowLogger

NONFINITE_TAG = "nonfinite"  # a run that trained on past a non-finite loss (allow_nonfinite=true)
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
    validation whose loss, is NaN or infinite. With ``stop=False`` (``allow_nonfinite=true``) the
    run trains on: the first non-finite loss is said in one line instead, and tagged
    ``nonfinite`` on the MLflow run."""

    def __init__(self, stop: bool = True) -> None:
        self.stop = stop
        self._said = False

    def on_train_batch_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule, outputs: Any, *args: Any) -> None:
        loss = outputs.get("loss") if isinstance(outputs, dict) else outputs
        if isinstance(loss, torch.Tensor) and not bool(torch.isfinite(loss.detach()).all()):
            self._non_finite(trainer, "the training loss", float(loss.detach().float().mean()))

    def on_validation_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if trainer.sanity_checking:
            return
        for name, value in trainer.callback_metrics.items():
            if name.startswith("val/") and name.endswith("/loss") and not math.isfinite(float(value)):
                self._non_finite(trainer, f"the validation loss {name}", float(value))

    def _non_finite(self, trainer: pl.Trainer, what: str, value: float) -> None:
        if self.stop:
            raise Diverged(trainer.global_step, what, value)
        if self._said or not trainer.is_global_zero:
            return
        self._said = True
        line = f"{what} is {value} at step {trainer.global_step}; allow_nonfinite=true: training on"
        print(f"[mesh-train] {line}", file=sys.stderr, flush=True)
        if isinstance(trainer.logger, MLFlowLogger) and trainer.logger.run_id is not None:
            trainer.logger.experiment.set_tag(trainer.logger.run_id, NONFINITE_TAG, line)
