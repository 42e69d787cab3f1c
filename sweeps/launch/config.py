"""How a grid runs, kept apart from what each run computes: the schema of ``sweeps/conf/launch.yaml``
and the registry of launchers.

``launcher=`` says where cells execute (sweeps/conf/launcher/: each option is a
:class:`~sweeps.launch.base.Launcher` class, typed by its own dataclass); ``resources=`` says what
each cell asks for (sweeps/conf/resources/: CPUs, GPUs, memory, time). Neither enters a run's
config hash, so the same cell run locally or on SLURM is the same run.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from hydra.core.config_store import ConfigStore
from omegaconf import MISSING

from mesh_model import ConfigError
from sweeps.launch.base import Launcher, ResourcesConfig
from sweeps.launch.local import LocalLauncher, PackedLauncher, ParallelLauncher
from sweeps.launch.slurm import SlurmLauncher, SubmititLocalLauncher

CONFIG_MODULE = "sweeps.conf"

# The options of sweeps/conf/launcher/, each typed by its class.
LAUNCHERS: dict[str, type[Launcher]] = {
    cls.name: cls for cls in (PackedLauncher, LocalLauncher, ParallelLauncher, SubmititLocalLauncher, SlurmLauncher)
}


@dataclass
class LaunchConfig:
    """The schema of ``sweeps/conf/launch.yaml``."""

    launcher: Any = MISSING  # one of the Launcher dataclasses of LAUNCHERS
    resources: ResourcesConfig = MISSING
    # seeds=3 repeats each cell with seeds 0,1,2; seeds=[0,5] with those seeds.
    seeds: list[int] = field(default_factory=list)

    def validate(self) -> None:
        assert isinstance(self.launcher, Launcher)
        self.launcher.validate()
        self.resources.validate()
        if any(seed < 0 for seed in self.seeds) or len(set(self.seeds)) < len(self.seeds):
            raise ConfigError(
                "seeds", list(self.seeds), "listed seeds are distinct integers >= 0 (seeds=3 means 0,1,2)"
            )


def register_launch_configs() -> None:
    """The schemas in Hydra's ConfigStore: ``launch_schema``, ``resources/schema`` and one
    ``launcher/<name>_schema`` per launcher class (idempotent)."""
    store = ConfigStore.instance()
    store.store(name="launch_schema", node=LaunchConfig)
    store.store(group="resources", name="schema", node=ResourcesConfig)
    for name, launcher in LAUNCHERS.items():
        store.store(group="launcher", name=f"{name}_schema", node=launcher)
