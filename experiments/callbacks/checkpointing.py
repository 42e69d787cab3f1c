"""Checkpoints that survive ``kill -9``: written under a temporary name, then renamed into place."""

from __future__ import annotations

import os
import shutil
from pathlib import Path
from weakref import proxy

import lightning.pytorch as pl
from lightning.pytorch.callbacks import ModelCheckpoint


def atomic_save(trainer: pl.Trainer, path: str | Path, weights_only: bool = False) -> None:
    """``trainer.save_checkpoint`` to ``path`` such that readers only ever see a complete file."""
    path = str(path)
    partial = f"{path}.partial"
    trainer.save_checkpoint(partial, weights_only)
    if trainer.is_global_zero:
        if os.path.isdir(partial) and os.path.isdir(path):  # sharded (FSDP) checkpoints are folders
            shutil.rmtree(path)
        os.replace(partial, path)
    trainer.strategy.barrier("atomic_save")


class AtomicModelCheckpoint(ModelCheckpoint):
    """ModelCheckpoint whose every save (``last.ckpt`` included) is atomic.

    A plain save killed half-way leaves a truncated ``last.ckpt`` that the resume then fails on.
    """

    def _save_checkpoint(self, trainer: pl.Trainer, filepath: str) -> None:
        atomic_save(trainer, filepath, self.save_weights_only)
        self._last_global_step_saved = trainer.global_step
        self._last_checkpoint_saved = filepath
        if trainer.is_global_zero:
            for logger in trainer.loggers:
                logger.after_save_checkpoint(proxy(self))
