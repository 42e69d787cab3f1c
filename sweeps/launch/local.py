"""The launchers that run cells on this machine: one after another in this process (``local``),
packed to fit the machine (``auto``, the default), or in worker processes (``parallel``)."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, ClassVar

from mesh_model import ConfigError
from sweeps.cells import Cell, CellOutcome, run_cell, stop_note
from sweeps.launch.base import Launcher, LaunchError, OnStart, ResourcesConfig, no_start
from sweeps.launch.pool import run_in_processes
from sweeps.packing import GB, CellNeeds, Packing, choose_packing, usable_cores

if TYPE_CHECKING:
    from experiments.plan import RunPlan


@dataclass
class LocalLauncher(Launcher):
    """Sequentially, in this process: imports and the tokenized corpus are paid for once."""

    name: ClassVar[str] = "local"

    def launch(
        self, cells: Sequence[Cell], resources: ResourcesConfig, folder: Path, on_start: OnStart = no_start
    ) -> Iterator[CellOutcome]:
        yield from self.launch_with_threads(cells, None, on_start)

    def launch_with_threads(
        self, cells: Sequence[Cell], threads: int | None, on_start: OnStart = no_start
    ) -> Iterator[CellOutcome]:
        """Each cell in turn, with ``threads`` torch threads (None: leave the process's setting)."""
        for cell in cells:
            on_start(cell)
            try:
                outcome = run_cell(cell, threads)
            except (KeyboardInterrupt, SystemExit) as stop:  # Ctrl-C: this cell stops, none other starts
                yield CellOutcome.interrupted(cell, stop_note(stop))
                raise
            yield outcome


@dataclass
class PackedLauncher(Launcher):
    """The local default: as many cells at once, with as many torch threads each, as finish the
    grid soonest on this machine without running out of memory (:mod:`sweeps.packing`).
    ``workers`` and ``threads`` override the choice. One cell at a time runs in this process
    (imports and corpus paid once); more run in processes of their own (:func:`run_in_processes`)."""

    name: ClassVar[str] = "auto"
    workers: int | None = None
    threads: int | None = None

    def __post_init__(self) -> None:
        self._packing: Packing | None = None

    def validate(self) -> None:
        for name in ("workers", "threads"):
            value = getattr(self, name)
            if value is not None and (not isinstance(value, int) or isinstance(value, bool) or value < 1):
                raise ConfigError(f"launcher.{name}", value, "must be an integer >= 1, or null to choose")

    @property
    def concurrency(self) -> int:
        if self._packing is not None:
            return self._packing.workers
        return self.workers or usable_cores()

    @property
    def in_processes(self) -> bool:
        """Whether cells run in processes of their own even one at a time."""
        return False

    def prepare(self, plans: Sequence[RunPlan]) -> str | None:
        from experiments.hardware import available_memory

        found = available_memory("cpu")
        available = found[0] if found else None
        needs = [CellNeeds(plan.memory.total, plan.alone) for plan in plans]
        packing = choose_packing(needs, usable_cores(), available, self.workers, self.threads)
        need = min(packing.workers, len(needs)) * packing.per_cell_bytes  # 0 when not estimated
        if available is not None and need > available:
            raise LaunchError(
                f"launcher.workers={packing.workers} is too many: {min(packing.workers, len(needs))} cells at once "
                f"need about {need / GB:.1f} GB but {available / GB:.1f} GB are available; "
                "lower launcher.workers, or leave it out to choose"
            )
        self._packing = packing
        return f"packing: {packing.describe(len(plans))}"

    def launch(
        self, cells: Sequence[Cell], resources: ResourcesConfig, folder: Path, on_start: OnStart = no_start
    ) -> Iterator[CellOutcome]:
        packing = self._packing or Packing(self.workers or 1, self.threads, "not prepared")
        if packing.workers == 1 and not self.in_processes:
            yield from LocalLauncher().launch_with_threads(cells, packing.threads, on_start)
        else:
            yield from run_in_processes(cells, packing.workers, packing.threads, on_start)


@dataclass
class ParallelLauncher(PackedLauncher):
    """``workers`` spawned worker processes share the machine, even when one
    (:func:`run_in_processes`): a worker that dies fails its own cell and no other. ``threads``
    defaults to the usable cores // workers."""

    name: ClassVar[str] = "parallel"
    workers: int | None = 2

    @property
    def in_processes(self) -> bool:
        return True
