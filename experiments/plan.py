"""Everything decided and checked about a run before compute starts: :func:`plan_run`."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, OmegaConf

from experiments.config import OptimConfig, TrainConfig, TrainerConfig
from experiments.data.config import DataConfig
from experiments.identity import config_hash, model_config_for, run_key
from experiments.tracking import check_tracking_uri, resolve_tracking_uri
from mesh_model import PRESETS, ConfigError, ModelConfig


class InputError(ValueError):
    """Bad user input found before any compute; the message is one line."""


@dataclass
class RunPlan:
    """A checked run: its resolved config, model, store and identity."""

    config: dict[str, Any]
    model_config: ModelConfig
    data: DataConfig
    trainer: TrainerConfig
    optim: OptimConfig
    peak_lr: float
    tracking_uri: str
    config_hash: str
    run_dir: Path

    @property
    def result_file(self) -> Path:
        """Written when the run finishes; its presence means the run is done."""
        return self.run_dir / "result.json"

    @property
    def checkpoint_dir(self) -> Path:
        return self.run_dir / "checkpoints"

    @property
    def last_checkpoint(self) -> Path:
        return self.checkpoint_dir / "last.ckpt"

    @property
    def experiment(self) -> str:
        return self.config["tracking"]["experiment"]


def plan_run(cfg: DictConfig) -> RunPlan:
    """Validate every input (each dataclass's ``validate()``, once, and the model) and decide the
    run's identity; touches no model or data."""
    config = OmegaConf.to_container(cfg, resolve=True)
    assert isinstance(config, dict)
    train: TrainConfig = OmegaConf.to_object(cfg)  # type: ignore[assignment]
    try:
        train.validate()
    except ConfigError as error:
        raise InputError(str(error)) from None
    model_config = model_config_for(config)
    if train.data.seq_len > model_config.max_seq_len:
        raise InputError(
            f"data.seq_len={train.data.seq_len} is invalid: the model's max_seq_len is {model_config.max_seq_len} "
            f"(raise it with +model_overrides.max_seq_len=...)"
        )
    runs_dir = Path(train.runs_dir).expanduser().resolve()
    tracking_uri = resolve_tracking_uri(train.tracking.tracking_uri, runs_dir, os.environ)
    check_tracking_uri(tracking_uri)
    digest = config_hash(config, model_config)
    return RunPlan(
        config=config,
        model_config=model_config,
        data=train.data,
        trainer=train.trainer,
        optim=train.optim,
        peak_lr=train.optim.lr if train.optim.lr is not None else PRESETS[train.model].lr,
        tracking_uri=tracking_uri,
        config_hash=digest,
        run_dir=runs_dir / train.tracking.experiment / run_key(model_config, train.seed, digest),
    )
