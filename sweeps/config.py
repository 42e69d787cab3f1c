"""How a grid runs, kept apart from what each run computes.

``launcher=`` says where cells execute (and on which partition/account); ``resources=`` says what
each cell asks for (CPUs, GPUs, memory, time). Neither enters a run's config hash, so the same
cell run locally or on SLURM is the same run.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from hydra.core.config_store import ConfigStore

LAUNCHER_KINDS = ("local", "parallel", "submitit_local", "slurm")


@dataclass
class LauncherConfig:
    """``kind``: local (sequential, in this process), parallel (``workers`` processes on this
    machine), submitit_local (submitit's local executor: SLURM's code path without SLURM), slurm."""

    kind: str = "local"
    workers: int = 2
    partition: str | None = None
    account: str | None = None
    qos: str | None = None
    max_parallel: int = 64  # SLURM array parallelism
    setup: list[str] = field(default_factory=list)  # shell lines run before each SLURM job
    additional_parameters: dict[str, str] = field(default_factory=dict)  # any other #SBATCH flag


@dataclass
class ResourcesConfig:
    """What one cell asks for. ``gpus_per_node`` > 1 or ``nodes`` > 1 makes each cell a DDP job."""

    cpus_per_task: int = 2
    gpus_per_node: int = 0
    nodes: int = 1
    mem_gb: int = 16
    time_min: int = 60


@dataclass
class LaunchConfig:
    defaults: list = field(default_factory=lambda: ["_self_", {"launcher": "local"}, {"resources": "cpu"}])
    launcher: LauncherConfig = field(default_factory=LauncherConfig)
    resources: ResourcesConfig = field(default_factory=ResourcesConfig)
    # seeds=3 repeats each cell with seeds 0,1,2; seeds=[0,5] with those seeds.
    seeds: list[int] = field(default_factory=list)


LAUNCHERS = {
    "local": LauncherConfig(kind="local"),
    "parallel": LauncherConfig(kind="parallel", workers=2),
    "submitit_local": LauncherConfig(kind="submitit_local", workers=2),
    "slurm": LauncherConfig(kind="slurm"),
}
RESOURCES = {
    "cpu": ResourcesConfig(cpus_per_task=2, gpus_per_node=0, mem_gb=8, time_min=60),
    "gpu1": ResourcesConfig(cpus_per_task=8, gpus_per_node=1, mem_gb=64, time_min=24 * 60),
    "gpu4": ResourcesConfig(cpus_per_task=8, gpus_per_node=4, mem_gb=256, time_min=48 * 60),
    "gpu8x2": ResourcesConfig(cpus_per_task=8, gpus_per_node=8, nodes=2, mem_gb=480, time_min=72 * 60),
}


def register_launch_configs() -> None:
    store = ConfigStore.instance()
    store.store(name="launch", node=LaunchConfig)
    for name, node in LAUNCHERS.items():
        store.store(group="launcher", name=name, node=node)
    for name, node in RESOURCES.items():
        store.store(group="resources", name=name, node=node)
