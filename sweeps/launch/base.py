"""The launcher interface: where the cells of a grid run, and what each cell asks for.

Each launcher is a dataclass whose fields are its settings; ``launcher=<name>`` picks the file
``sweeps/conf/launcher/<name>.yaml``, which is typed by that class, so the composed config *is*
the launcher object (``OmegaConf.to_object``) and nothing dispatches on a name. The launchers
themselves live beside this module: :mod:`sweeps.launch.local` (this machine) and
:mod:`sweeps.launch.slurm` (submitit, locally or on SLURM).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, ClassVar

from mesh_model import ConfigError
from sweeps.cells import Cell, CellOutcome

if TYPE_CHECKING:
    from experiments.config import TrainerConfig
    from experiments.plan import MemoryLimit, RunPlan


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


class LaunchError(RuntimeError):
    """A launcher cannot start on this machine; the message is one line."""


OnStart = Callable[[Cell], None]


def no_start(cell: Cell) -> None:
    """The default ``on_start``: nobody listens."""


@dataclass
class Launcher:
    """The interface. ``launch`` yields one outcome per cell, in the order cells finish, and calls
    ``on_start(cell)`` when a cell starts (for a batch scheduler: when it is submitted)."""

    name: ClassVar[str]  # the option that selects it (``launcher=<name>``, sweeps/conf/launcher/<name>.yaml)

    def validate(self) -> None:
        """Refuse bad settings in one line (a ConfigError)."""

    def check(self, folder: Path, resources: ResourcesConfig) -> None:
        """Fail fast, before anything is logged, when this launcher cannot run here."""

    @property
    def detaches(self) -> bool:
        """Whether its cells run without this process (``mesh-sweep --detach``, :meth:`submit`)."""
        return False

    @property
    def concurrency(self) -> int:
        """How many cells run at once (an Optuna search asks for that many trials per round)."""
        return 1

    def cell_overrides(self, resources: ResourcesConfig) -> list[str]:
        """Overrides every cell needs to use what ``resources`` asks for."""
        return []

    def memory_limit(self, resources: ResourcesConfig) -> MemoryLimit | None:
        """What a cell's training step must fit in where the cell runs; None: this machine's
        memory, measured (every launcher that runs cells here)."""
        return None

    def check_trainer(self, trainer: TrainerConfig, resources: ResourcesConfig) -> None:
        """Refuse (one line) a cell whose trainer contradicts what ``resources`` asks for."""

    def prepare(self, plans: Sequence[RunPlan]) -> str | None:
        """Decide, before anything is logged, how the runs of ``plans`` will share this machine;
        returns a line saying so (None: nothing to say). Refuses (LaunchError) what cannot fit."""
        return None

    def launch(
        self, cells: Sequence[Cell], resources: ResourcesConfig, folder: Path, on_start: OnStart = no_start
    ) -> Iterator[CellOutcome]:
        """Run the cells; ``folder`` is ``<sweep dir>/submitit`` (submitit's files)."""
        raise NotImplementedError

    def submit(self, cells: Sequence[Cell], resources: ResourcesConfig, folder: Path) -> list[str]:
        """Hand the cells to a batch scheduler and return their job ids, in order, without waiting
        for them (only where :attr:`detaches`)."""
        raise LaunchError(f"launcher={self.name} runs its cells in this process or its children")
