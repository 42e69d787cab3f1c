"""The loop map's stability, logged at every validation (mesh_model/stability.py).

On the first batch of the first validation set (held out), after each validation: ``stability/
change_ratio`` (||h(t+1) - h(t)|| / ||h(t) - h(t-1)|| at the end of a pass of 2K steps),
``stability/change_ratio_trained`` (the same within K, for K >= 2) and ``stability/spectral_radius``
(power iteration on the Jacobian of step K's map at h(K)). Below 1, more loops can converge.
Switched off with ``probes.stability=false``; a model without a looped core logs nothing.
"""

from __future__ import annotations

import lightning.pytorch as pl
import torch

from mesh_model.stability import loop_stability

ITERATIONS = 8  # power iterations: the estimate settles to 2-3 digits on the tiny preset


class StabilityMonitor(pl.Callback):
    def on_validation_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        model = pl_module.model
        if trainer.sanity_checking or not trainer.is_global_zero or trainer.logger is None:
            return
        if model.state_passing is None or not model.config.loopable:
            return
        loaders = trainer.val_dataloaders
        loader = loaders[0] if isinstance(loaders, list | tuple) else loaders
        if loader is None:
            return
        batch = next(iter(loader)).to(pl_module.device)
        training = model.training
        model.eval()
        try:
            with torch.no_grad():
                numbers = loop_stability(model, batch, ITERATIONS)
        finally:
            model.train(training)
        trainer.logger.log_metrics({f"stability/{k}": v for k, v in numbers.items()}, step=trainer.global_step)
