"""How a grid runs, kept apart from what each run computes.

``launcher=`` says where cells execute (sweeps/conf/launcher/: each option is a
:class:`~sweeps.launchers.Launcher` class, typed by its own dataclass); ``resources=`` says what
each cell asks for (sweeps/conf/resources/: CPUs, GPUs, memory, time). Neither enters a run's
config hash, so the same cell run locally or on SLURM is the same run.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from hydra.core.config_store import ConfigStore
from omegaconf import MISSING

from mesh_model import ConfigError
from sweeps.launchers import LAUNCHERS, Launcher

CONFIG_MODULE = "sweeps.conf"


@dataclass
class ResourcesConfig:
    """What one cell asks for. More than one task in all (``tasks_per_node`` x ``nodes``) makes
    each cell a DDP job: one process per task, ``cpus_per_task`` cores each; ``mem_gb`` is per node."""

    cpus_per_task: int = 2
    gpus_per_node: int = 0
    nodes: int = 1
    mem_gb: int = 16
    time_min: int = 60
    # Processes (DDP ranks) per node; null: one per GPU, 1 without GPUs.
    tasks_per_node: int | None = None

    @property
    def tasks(self) -> int:
        """Processes per node: ``tasks_per_node``, else one per GPU (1 without GPUs)."""
        return self.tasks_per_node or max(1, self.gpus_per_node)

    def validate(self) -> None:
        for name, low in (("cpus_per_task", 1), ("gpus_per_node", 0), ("nodes", 1), ("mem_gb", 1), ("time_min", 1)):
            value = getattr(self, name)
            if value < low:
                raise ConfigError(f"resources.{name}", value, f"must be >= {low}")
        tasks, gpus = self.tasks_per_node, self.gpus_per_node
        if tasks is not None and tasks < 1:
            raise ConfigError("resources.tasks_per_node", tasks, "must be >= 1, or null for one per GPU")
        if tasks is not None and gpus and tasks != gpus:
            raise ConfigError(
                "resources.tasks_per_node", tasks, f"must be gpus_per_node={gpus} (one task per GPU), or null"
            )


@dataclass
class LaunchConfig:
    """The schema of ``sweeps/conf/launch.yaml``."""

    launcher: Any = MISSING  # one of the Launcher dataclasses of sweeps/launchers.py
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
