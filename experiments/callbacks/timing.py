"""Where a run's wall time goes: training steps, data fetches between them, validation, set-up.

``RunTimer`` is a Lightning callback; ``train()`` logs its numbers to MLflow (``time/*``) and to
``result.json`` (``timing``), and ``benchmarks/sweep_overhead.py`` adds them up over a grid.
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass

import lightning.pytorch as pl


@dataclass
class RunTiming:
    setup_s: float = 0.0  # train() entry to the first training batch (data, model, MLflow, Lightning)
    steps_s: float = 0.0  # inside training batches: forward, backward, optimizer
    between_steps_s: float = 0.0  # between batches: data fetch, logging, checkpoints
    validation_s: float = 0.0
    end_s: float = 0.0  # after the last batch: probes, final validation and checkpoint, MLflow close
    total_s: float = 0.0
    # Optimizer steps trained in this process over steps_s + between_steps_s: a resumed run counts
    # only the steps after its checkpoint (its global step counts the earlier ones too).
    steps_per_s: float = 0.0

    def as_metrics(self) -> dict[str, float]:
        return {f"time/{key}": value for key, value in asdict(self).items()}


class RunTimer(pl.Callback):
    """Splits a run's wall time; ``started`` is the ``time.perf_counter()`` at train() entry."""

    def __init__(self, started: float) -> None:
        self.started = started
        self.timing = RunTiming()
        self._batch_start: float | None = None
        self._batch_end: float | None = None
        self._validation_start: float | None = None
        self._validation_since_batch = 0.0
        self._first_step: int | None = None
        self._last_step: int | None = None

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:
        now = time.perf_counter()
        if self._batch_end is None:
            self.timing.setup_s = now - self.started - self._validation_since_batch
        else:
            self.timing.between_steps_s += now - self._batch_end - self._validation_since_batch
        self._validation_since_batch = 0.0
        self._batch_start = now
        if self._first_step is None:
            self._first_step = trainer.global_step

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        now = time.perf_counter()
        if self._batch_start is not None:
            self.timing.steps_s += now - self._batch_start
        self._batch_end = now
        self._last_step = trainer.global_step

    def on_validation_start(self, trainer, pl_module) -> None:
        self._validation_start = time.perf_counter()

    def on_validation_end(self, trainer, pl_module) -> None:
        if self._validation_start is not None:
            elapsed = time.perf_counter() - self._validation_start
            self.timing.validation_s += elapsed
            self._validation_since_batch += elapsed
            self._validation_start = None

    @property
    def trained_any_step(self) -> bool:
        """Whether this process ran a training step (a run resumed at ``max_steps`` runs none)."""
        return self._first_step is not None

    def finish(self) -> RunTiming:
        """Close the account: ``end_s`` is whatever ran after the last batch besides validation."""
        t = self.timing
        t.total_s = time.perf_counter() - self.started
        t.end_s = max(0.0, t.total_s - t.setup_s - t.steps_s - t.between_steps_s - t.validation_s)
        trained = (self._last_step or 0) - (self._first_step or 0)
        training_s = t.steps_s + t.between_steps_s
        t.steps_per_s = trained / training_s if trained > 0 and training_s > 0 else 0.0
        return t
