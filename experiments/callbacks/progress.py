"""Plain progress lines for a run whose stderr is not a terminal (a SLURM log, ``nohup``), where
Lightning's progress bar is off (experiments/trainer.py). Console only: nothing here is logged to
MLflow or enters the run's config hash.

    2026-12-01 14:03:22 [mesh-train] step 500/2500 · loss 3.21 · 12.3 steps/s · ETA 3m10s
    2026-12-01 14:03:25 [mesh-train] step 500/2500 · val shakespeare loss 3.3012 · ppl 27.15
"""

from __future__ import annotations

import math
import sys
import time

import lightning.pytorch as pl

from experiments.console import duration, timestamp


class PlainProgress(pl.Callback):
    """A training line at most every ``every_s`` seconds of wall time (0: after every step) and a
    line per validation, on stderr, from global rank 0 only. ``name`` is the tag in brackets.

    Steps per second count the steps trained in this process (a resumed run's earlier steps are
    not), over the wall time since training started here, validation included: the ETA is then
    when the run ends, not when its last training step does."""

    def __init__(self, every_s: float = 30.0, name: str = "mesh-train") -> None:
        self.every_s = every_s
        self.name = name
        self._start: tuple[float, int] | None = None  # (time, step) when training started here
        self._last_line = 0.0

    def on_train_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self._start = (time.monotonic(), trainer.global_step)
        self._last_line = self._start[0]

    def on_train_batch_end(self, trainer: pl.Trainer, *args: object) -> None:
        now = time.monotonic()
        if not trainer.is_global_zero or self._start is None or now - self._last_line < self.every_s:
            return
        self._last_line = now
        step, total = trainer.global_step, trainer.max_steps
        parts = [f"step {step}/{total}"]
        loss = trainer.callback_metrics.get("train/loss")
        if loss is not None:
            parts.append(f"loss {float(loss):.4g}")
        started, first_step = self._start
        if step > first_step and now > started:
            rate = (step - first_step) / (now - started)
            parts += [f"{rate:.3g} steps/s", f"ETA {duration(max(0, total - step) / rate)}"]
        self._print(parts)

    def on_validation_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if not trainer.is_global_zero or trainer.sanity_checking:
            return
        parts = [f"step {trainer.global_step}/{trainer.max_steps}"]
        metrics = trainer.callback_metrics
        for key in sorted(metrics):
            if key.startswith("val/") and key.endswith("/loss"):
                name = key[len("val/") : -len("/loss")]
                loss = float(metrics[key])
                ppl = float(metrics.get(f"val/{name}/ppl", math.exp(min(loss, 50.0))))
                parts.append(f"val {name} loss {loss:.4f} · ppl {ppl:.2f}")
        if len(parts) > 1:
            self._print(parts)

    def _print(self, parts: list[str]) -> None:
        print(f"{timestamp()} [{self.name}] {' · '.join(parts)}", file=sys.stderr, flush=True)
