"""Compose configs with Hydra's compose API, from any process (tests, sweep workers, SLURM jobs)."""

from __future__ import annotations

from collections.abc import Sequence

from hydra import compose, initialize_config_module
from hydra.core.global_hydra import GlobalHydra
from omegaconf import DictConfig

from experiments.config import register_configs
from experiments.sweep_config import register_launch_configs
from sweeps import register_sweeps


def register_all() -> None:
    register_configs()
    register_launch_configs()
    register_sweeps()


def compose_config(overrides: Sequence[str] = (), config_name: str = "train", hydra_config: bool = False) -> DictConfig:
    """The composed config; ``hydra_config`` keeps the ``hydra`` node (sweeper params...)."""
    register_all()
    GlobalHydra.instance().clear()
    with initialize_config_module("experiments.conf", version_base="1.3"):
        return compose(config_name, overrides=list(overrides), return_hydra_config=hydra_config)
