"""Optuna pruning from inside a training process: the trial of a search (sweeps/search.py) reports
its validation loss after every validation, and stops when the study's pruner says so."""

from __future__ import annotations

import lightning.pytorch as pl
import optuna

from experiments.config import PRUNERS, SearchConfig
from mesh_model import ConfigError


def make_pruner(pruner: str, startup_trials: int) -> optuna.pruners.BasePruner:
    """Optuna keeps no pruner in its storage: the driver and every trial process build the same one."""
    if pruner == "median":
        return optuna.pruners.MedianPruner(n_startup_trials=startup_trials)
    if pruner == "none":
        return optuna.pruners.NopPruner()
    raise ConfigError("search.pruner", pruner, f"use {' or '.join(PRUNERS)}")


class OptunaPruning(pl.Callback):
    """Reports the main validation loss to the trial after every validation; prunes on request."""

    def __init__(self, search: SearchConfig, metric: str) -> None:
        self.metric = metric
        pruner = make_pruner(search.pruner, search.pruner_startup_trials)
        study = optuna.load_study(study_name=search.study_name, storage=search.storage, pruner=pruner)
        self.trial = optuna.trial.Trial(study, search.trial_id)

    def on_validation_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if trainer.sanity_checking or self.metric not in trainer.callback_metrics:
            return
        step = trainer.global_step
        self.trial.report(float(trainer.callback_metrics[self.metric]), step)
        if self.trial.should_prune():
            raise optuna.TrialPruned(f"trial {self.trial.number} pruned at step {step}")
