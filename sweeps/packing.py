"""How many cells of a local grid run at once, and with how many torch threads each.

The rule (:func:`choose_packing`), validated by ``benchmarks/grid_throughput.py``:

* On a CPU, one cell per core. A small model's step does not scale across threads (its matmuls are
  small and the Python, autograd and optimizer work between them runs on one thread), while cells
  in separate processes share nothing: on 2 cores, two tiny cells side by side with one thread
  each finish the main job's grid in 0.78x the time of one cell at a time with two threads. Cores left
  over when there are fewer cells than cores go to the cells as threads.
* Memory caps the number of cells at once: each process needs its training step's estimate
  (:func:`mesh_model.accounting.estimate_step_memory`) plus what a worker process holds before
  it trains (:data:`PROCESS_BYTES`), and together they stay under :data:`MEMORY_FRACTION` of
  the RAM available now.
* A cell on a GPU (or several processes per cell, DDP) runs alone with the default threads: the
  cells would compete for one device.

Packing does not change what a cell computes: at the same thread count, a cell trained in its own
process ends bit-identical to the same cell trained in the mesh-sweep process (tests/test_packing.py).
Changing the thread count changes the order of some float reductions, so final losses then agree
to about 1e-7 relative, not bit for bit (``benchmarks/grid_throughput.py`` prints the largest gap).
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass

# What a worker process holds before its first step (Python, torch, Lightning, MLflow, the
# tokenized corpus): 0.53 GB measured on the tiny preset (peak RSS 0.77 GB, step estimate 0.24 GB).
PROCESS_BYTES = 768 * 1024**2
MEMORY_FRACTION = 0.8  # of the RAM available when the grid starts
GB = 1e9  # as mesh_model.accounting prints memory


@dataclass(frozen=True)
class CellNeeds:
    """What one cell asks of the machine."""

    memory_bytes: int  # its training step's estimate (one process)
    alone: bool = False  # on a GPU, or DDP: never packed with others


@dataclass(frozen=True)
class Packing:
    """``workers`` cells at once, ``threads`` torch threads each (None: torch's default)."""

    workers: int
    threads: int | None
    why: str
    per_cell_bytes: int = 0  # the largest cell's step estimate plus its process (0: not estimated)

    def describe(self, cells: int) -> str:
        threads = "default threads" if self.threads is None else f"{self.threads} thread(s) each"
        return f"{cells} cell(s), {self.workers} at a time with {threads} ({self.why})"


def usable_cores() -> int:
    """The cores a grid may fill: torch's thread count in this process (the physical cores, unless
    ``OMP_NUM_THREADS`` or ``torch.set_num_threads`` said fewer), capped by the CPU affinity a
    SLURM or cgroup allocation sets."""
    import torch

    allowed = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    return max(1, min(torch.get_num_threads(), allowed))


def choose_packing(
    needs: Sequence[CellNeeds],
    cores: int,
    available_bytes: int | None,
    workers: int | None = None,
    threads: int | None = None,
) -> Packing:
    """The packing of ``needs`` (one per cell to run) on ``cores`` cores with ``available_bytes``
    of RAM free (None: unknown, not limiting). ``workers`` and ``threads``, when given, are the
    user's and are kept as they are; the other is derived from them."""
    if not needs:
        return Packing(1, threads, "nothing to run")
    if any(n.alone for n in needs):
        return Packing(workers or 1, threads, "cells on an accelerator or DDP run one at a time")
    per_cell = max(n.memory_bytes for n in needs) + PROCESS_BYTES
    fit = len(needs) if available_bytes is None else max(1, int(available_bytes * MEMORY_FRACTION // per_cell))
    memory = f"about {per_cell / GB:.2f} GB per cell"
    if available_bytes is not None:
        memory += f" of {available_bytes / GB:.1f} GB available"
    if workers is None:
        by_threads = cores // threads if threads else cores
        workers = max(1, min(len(needs), by_threads, fit))
        limit = "memory" if fit < min(len(needs), by_threads) else "cores" if by_threads < len(needs) else "cells"
        why = f"{cores} core(s), {memory}; limited by {limit}"
    else:
        why = f"launcher.workers={workers}; {cores} core(s), {memory}"
    if threads is None:
        threads = max(1, cores // min(workers, len(needs)))
    return Packing(workers, threads, why, per_cell)


__all__ = ["CellNeeds", "MEMORY_FRACTION", "PROCESS_BYTES", "Packing", "choose_packing", "usable_cores"]
