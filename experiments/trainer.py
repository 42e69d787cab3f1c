"""The Lightning side of a run: the module and the Trainer with its logger and callbacks."""

from __future__ import annotations

import sys
from collections.abc import Mapping
from typing import Any

import lightning.pytorch as pl
from lightning.pytorch.loggers import MLFlowLogger
from lightning.pytorch.plugins.environments import SLURMEnvironment

from experiments.callbacks.checkpointing import StepCheckpoint, StopOnStepBoundary
from experiments.callbacks.divergence import StopOnNonFinite
from experiments.callbacks.progress import PlainProgress
from experiments.console import is_terminal, progress_every_s, quiet_libraries
from experiments.lit_module import MeshLitModule
from experiments.plan import RunPlan
from experiments.probing.callback import probe_callbacks
from experiments.store.views import TOKENS_METRIC
from mesh_model import ModelConfig


def build_module(plan: RunPlan, model_config: ModelConfig, val_names: list[str]) -> MeshLitModule:
    return MeshLitModule(
        model_config=model_config.to_dict(),
        optim=plan.optim,
        peak_lr=plan.peak_lr,
        max_steps=plan.train.max_steps,
        val_names=val_names,
        compile=plan.train.compile,
        activation_checkpointing=plan.train.activation_checkpointing,
        init_seed=plan.train.seed,
        loops=plan.train.loops,
    )


def run_callbacks(plan: RunPlan, val_names: list[str]) -> list[pl.Callback]:
    """A stop at the first non-finite loss (before any checkpoint of that step; with
    ``allow_nonfinite`` a line and a tag instead), checkpoints every ``checkpoint_every`` steps
    (and ``last.ckpt``, and on SIGTERM), probes,
    search pruning, and plain progress lines when stderr is not a terminal (no progress bar
    then, see :func:`build_trainer`), every ``$MESH_PROGRESS_EVERY_S`` seconds (default 30)."""
    allowed = plan.train.allow_nonfinite
    callbacks: list[pl.Callback] = [
        StopOnNonFinite(stop=not allowed),
        StepCheckpoint(plan.checkpoint_dir, plan.train.checkpoint_every, check_finite=not allowed),
        *probe_callbacks(plan.train.probes, plan.run_dir),
    ]
    if plan.train.probes.stability:
        from experiments.callbacks.stability import StabilityMonitor

        callbacks.append(StabilityMonitor())
    if not is_terminal(sys.stderr):
        # A cell of a sweep says which run it is: the cells of a parallel grid share one log.
        name = f"mesh-train {plan.run_dir.name}" if plan.train.tracking.sweep else "mesh-train"
        callbacks.append(PlainProgress(progress_every_s(), name))
    search = plan.train.search
    if search.trial_id is not None:  # a trial of an Optuna search (sweeps/search.py)
        from experiments.callbacks.pruning import OptunaPruning

        callbacks.append(OptunaPruning(search, f"val/{val_names[0]}/loss"))
    # Owns SIGTERM: a stop at the end of a whole step, after its validation (see its docstring).
    callbacks.append(StopOnStepBoundary())
    return callbacks


def cluster_plugins() -> list:
    """Under SLURM, submitit owns requeue (see sweeps/launch/cell_job.py): Lightning's own SIGUSR1
    auto-requeue is switched off so a preempted job is requeued exactly once."""
    return [SLURMEnvironment(auto_requeue=False)] if SLURMEnvironment.detect() else []


class ResumedMLFlowLogger(MLFlowLogger):
    """MLFlowLogger that logs each step of a metric once and the tokens seen at every logged step.

    A run resumed from a checkpoint older than its last logged step redoes those steps (with the
    same numbers: the data order is restored): per metric, a step at or before the last one the
    MLflow run holds (``last_logged_steps`` at the start, then what this logger logged) is left out.

    With ``tokens_per_step`` (the global batch in tokens: sequences x length x accumulation x
    processes), every call that logs at step s also logs :data:`TOKENS_METRIC` = s x
    ``tokens_per_step``: the tokens the model had trained on when the values were measured
    (training at Lightning's 0-based step s, a validation after s steps), the x axis the UI's
    charts can use instead of the step (experiments/store/views.py)."""

    def __init__(
        self,
        *args: Any,
        last_logged_steps: Mapping[str, int] | None = None,
        tokens_per_step: int | None = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(*args, **kwargs)
        self.last_logged_steps = dict(last_logged_steps or {})
        self.tokens_per_step = tokens_per_step

    def log_metrics(self, metrics: Mapping[str, float], step: int | None = None) -> None:
        if step is None:
            super().log_metrics(metrics, step)
            return
        if self.tokens_per_step is not None:
            metrics = {**metrics, TOKENS_METRIC: float(step * self.tokens_per_step)}
        metrics = {k: v for k, v in metrics.items() if step > self.last_logged_steps.get(k, -1)}
        if not metrics:
            return
        super().log_metrics(metrics, step)
        self.last_logged_steps.update(dict.fromkeys(metrics, step))


def build_trainer(
    plan: RunPlan,
    run_id: str | None,
    callbacks: list[pl.Callback],
    last_logged_steps: Mapping[str, int] | None = None,
) -> pl.Trainer:
    """The Trainer of ``plan``, logging into MLflow run ``run_id`` (None on ranks other than 0:
    Lightning's MLFlowLogger is a no-op there); each metric from the step after the last one
    ``last_logged_steps`` says the run holds.

    Lightning's start-up lines (``GPU available``, the litlogger tip, the ``srun`` hint) show only
    at ``log_level`` info or debug (``-v``)."""
    quiet_libraries(plan.train.log_level)  # Lightning is imported now: its loggers can be set
    logger: Any = ResumedMLFlowLogger(
        experiment_name=plan.experiment,
        tracking_uri=plan.tracking_uri,
        run_id=run_id,
        last_logged_steps=last_logged_steps,
        tokens_per_step=plan.budget.tokens_per_step,
    )
    return pl.Trainer(
        plugins=cluster_plugins(),
        accelerator=plan.trainer.accelerator,
        devices=plan.trainer.devices,
        num_nodes=plan.trainer.num_nodes,
        strategy=plan.trainer.strategy,
        precision=plan.trainer.resolved_precision,
        deterministic=plan.trainer.deterministic,
        max_steps=plan.train.max_steps,
        accumulate_grad_batches=plan.trainer.accumulate_grad_batches,
        # Lightning counts validation intervals in batches: val_every optimizer steps' worth.
        val_check_interval=plan.train.val_every * plan.trainer.accumulate_grad_batches,
        check_val_every_n_epoch=None,
        log_every_n_steps=plan.train.log_every,
        gradient_clip_val=plan.optim.grad_clip,
        logger=logger,
        callbacks=callbacks,
        enable_progress_bar=is_terminal(sys.stderr),
        enable_model_summary=False,
        enable_checkpointing=False,  # StepCheckpoint writes the checkpoints
        use_distributed_sampler=False,  # the training sampler shards by rank itself (experiments/data/sampler.py)
        num_sanity_val_steps=0,
        default_root_dir=str(plan.run_dir),
    )
