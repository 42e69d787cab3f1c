"""What a grid will cost, said before its cells are planned, and the confirmation a big grid needs.

Planning checks every distinct config (its memory, data and store) and names every cell's run;
a grid of thousands of cells takes seconds to plan. Before that, ``mesh-sweep`` prints the cell
count and the FLOP model's estimate (:func:`~experiments.plan.estimate_run`: CPU core-hours or
GPU-hours, and the checkpoints left on disk) from one composed config per distinct config; the
count comes first, at once, as the estimate needs torch (a few seconds to import). A
grid of more than :data:`LARGE_GRID` cells starts only once confirmed (a terminal asks; elsewhere
``--yes``).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TextIO

from experiments.budget import CPU_FLOPS, GPU_FLOPS
from experiments.compose import compose_config
from experiments.console import is_terminal
from sweeps.cells import Cell
from sweeps.grid import SweepError, config_of

LARGE_GRID = 200  # more cells than this start only once confirmed (a terminal's answer, or --yes)
SAMPLED_CONFIGS = 8  # a grid of more distinct configs is estimated from this many, evenly spread


Configs = dict[tuple[str, ...], list[Cell]]  # the cells of each distinct config (cells differing only in seed)


def distinct_configs(cells: Sequence[Cell]) -> Configs:
    """The grid's cells grouped by config (:func:`~sweeps.grid.config_of`), in grid order."""
    configs: Configs = {}
    for cell in cells:
        configs.setdefault(config_of(cell)[0], []).append(cell)
    return configs


def count_line(name: str, configs: Configs) -> str:
    """``schemes: 3000 cells (6 configs x 500 seeds)``: said at once, nothing composed per cell."""
    sizes = {len(group) for group in configs.values()}
    cells = sum(len(group) for group in configs.values())
    shape = f" ({len(configs)} configs x {sizes.pop()} seeds)" if len(sizes) == 1 and cells > len(configs) else ""
    return f"{name}: {cells} cells{shape}"


@dataclass(frozen=True)
class GridEstimate:
    """Every cell's :class:`RunCost` summed, per kind of device."""

    configs: int  # distinct configs
    sampled: int  # configs whose cost was computed; the others are taken at their mean
    cpu_hours: float
    gpu_hours: float
    disk_bytes: float

    def describe(self) -> str:
        """``estimate: 41.2 CPU-h (FLOP model, 2e10 FLOP/s per core), 12.3 GB of checkpoints``."""
        hours = []
        if self.cpu_hours or not self.gpu_hours:
            hours.append(f"{_number(self.cpu_hours)} CPU-h (FLOP model, {_rate(CPU_FLOPS)} FLOP/s per core)")
        if self.gpu_hours:
            hours.append(f"{_number(self.gpu_hours)} GPU-h (FLOP model, {_rate(GPU_FLOPS)} FLOP/s per GPU)")
        sample = f", from {self.sampled} of its {self.configs} configs" if self.sampled < self.configs else ""
        return f"estimate: {' + '.join(hours)}, {_size(self.disk_bytes)} of checkpoints{sample}"


def estimate_grid(configs: Configs) -> GridEstimate:
    """The cost of every cell from one composed config per distinct config (at most
    :data:`SAMPLED_CONFIGS` of them, evenly spread; the others at their mean): no cell is planned."""
    from experiments.plan import estimate_run  # torch, for the model's size: after the count is said

    keys = list(configs)
    sampled = keys[:: max(1, -(-len(keys) // SAMPLED_CONFIGS))]
    costs = {key: estimate_run(compose_config(configs[key][0].overrides)) for key in sampled}
    counts = {key: len(configs[key]) for key in keys}
    scale = sum(counts.values()) / sum(counts[key] for key in sampled)  # 1 when every config was computed
    cpu = sum(counts[k] * c.hours for k, c in costs.items() if not c.on_gpu) * scale
    gpu = sum(counts[k] * c.hours for k, c in costs.items() if c.on_gpu) * scale
    disk = sum(counts[k] * c.disk_bytes for k, c in costs.items()) * scale
    return GridEstimate(len(keys), len(sampled), cpu, gpu, disk)


def confirmed(count: int, yes: bool, stdin: TextIO, out: TextIO) -> bool:
    """Whether a grid of ``count`` cells may start: at most :data:`LARGE_GRID` cells, or ``yes``,
    or the answer ``y`` on a terminal. Elsewhere (a script, a batch job) a larger grid without
    ``yes`` is refused in one line (:class:`SweepError`) saying to add ``--yes``."""
    if count <= LARGE_GRID or yes:
        return True
    if not is_terminal(stdin):
        raise SweepError(
            f"{count} cells is more than {LARGE_GRID}: add --yes to start them (--dry-run lists them, starts nothing)"
        )
    print(f"start {count} cells? [y/N] ", end="", file=out, flush=True)
    return stdin.readline().strip().lower() in ("y", "yes")


def _number(hours: float) -> str:
    return f"{hours:.3g}" if hours < 1000 else f"{hours:,.0f}"


def _rate(flops: float) -> str:
    return f"{flops:.0e}".replace("e+", "e")  # 2e10


def _size(count: float) -> str:
    for size, unit in ((1e12, "TB"), (1e9, "GB"), (1e6, "MB"), (1e3, "kB")):
        if count >= size:
            return f"{count / size:.1f} {unit}"
    return f"{count:.0f} B"
