"""Compose configs with Hydra's compose API, from any process (tests, sweep workers, SLURM jobs)."""

from __future__ import annotations

from collections.abc import Sequence
from importlib import resources

from hydra import compose, initialize_config_module
from hydra.core.global_hydra import GlobalHydra
from omegaconf import DictConfig

from experiments.config import register_configs

CONFIG_MODULE = "experiments.conf"


def compose_config(
    overrides: Sequence[str] = (),
    config_name: str = "train",
    hydra_config: bool = False,
    config_module: str = CONFIG_MODULE,
) -> DictConfig:
    """The composed config; ``hydra_config`` keeps the ``hydra`` node (sweeper params...)."""
    register_configs()
    GlobalHydra.instance().clear()
    with initialize_config_module(config_module, version_base="1.3"):
        return compose(config_name, overrides=list(overrides), return_hydra_config=hydra_config)


def group_options(group: str, config_module: str = CONFIG_MODULE) -> list[str]:
    """The options of a config group: the YAML files in ``<config module>/<group>/`` (the typed
    schema they start from lives in the ConfigStore, not among them)."""
    folder = resources.files(config_module).joinpath(group)
    if not folder.is_dir():
        return []
    return sorted(p.name.removesuffix(".yaml") for p in folder.iterdir() if p.name.endswith(".yaml"))
