"""A cell of a grid (one run's overrides) and what became of it; :func:`run_cell` trains one.

Every launcher runs the same picklable :func:`run_cell`, which composes the cell's config and
calls :func:`experiments.train.train`. A cell that raises is reported as FAILED (its MLflow run is
already marked FAILED with the error by ``train``) and the grid goes on.
"""

from __future__ import annotations

import traceback
from dataclasses import dataclass


@dataclass
class Cell:
    index: int
    overrides: list[str]
    label: str = ""  # the grid coordinates, e.g. "scheme=mesh seed=1"


@dataclass
class CellOutcome:
    index: int
    overrides: list[str]
    status: str  # FINISHED | FAILED | SKIPPED | PRUNED
    label: str = ""
    val_loss: float | None = None
    run_id: str | None = None
    run_dir: str | None = None
    error: str | None = None

    @classmethod
    def from_result(cls, cell: Cell, status: str, result: dict) -> CellOutcome:
        """From what ``train`` returns (or wrote to ``result.json``)."""
        return cls(
            cell.index,
            cell.overrides,
            status,
            cell.label,
            val_loss=result["val_loss"],
            run_id=result["run_id"],
            run_dir=result["run_dir"],
        )

    @classmethod
    def failed(cls, cell: Cell, error: str) -> CellOutcome:
        return cls(cell.index, cell.overrides, "FAILED", cell.label, error=error)


def run_cell(cell: Cell, threads: int | None = None) -> CellOutcome:
    """Compose and train one cell; never raises for a failing run."""
    import torch

    from experiments.compose import compose_config
    from experiments.train import train

    if threads:
        torch.set_num_threads(threads)
    try:
        result = train(compose_config(cell.overrides))
    except Exception as error:  # the grid goes on; train() already marked the MLflow run FAILED
        if type(error).__name__ == "TrialPruned":  # an Optuna trial stopped early on purpose
            return CellOutcome(cell.index, cell.overrides, "PRUNED", cell.label, error=str(error))
        traceback.print_exc()
        return CellOutcome.failed(cell, f"{type(error).__name__}: {error}".splitlines()[0])
    return CellOutcome.from_result(cell, "FINISHED", result)
