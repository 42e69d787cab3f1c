"""``probes.json`` and the probe figures of one report: written by the training callback and
``mesh-probe``, read back by ``mesh-results``. No Lightning here, so readers start fast."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from mesh_model.probe_plots import plot_report
from mesh_model.probes import ProbeReport

PROBE_DIR = "probes"
REPORT_FILE = "probes.json"


def _finite_or_none(value: float) -> float | None:
    return value if math.isfinite(value) else None  # strict JSON has no NaN


def _matrix(matrix: Tensor) -> list[list[float | None]]:
    return [[_finite_or_none(v) for v in row] for row in matrix.tolist()]


def report_to_dict(report: ProbeReport, **extra: Any) -> dict[str, Any]:
    """A JSON-ready dict of the report (NaN as null); ``extra`` keys (step, batches...) are added."""
    return {
        **extra,
        "samples": report.samples,
        "loops": report.loops,
        "top": report.top,
        "sigma_fraction": report.sigma_fraction,
        "debiased": report.debiased,
        "stages": report.stages,
        "updates": {block: {"mean": mean, "std": std} for block, (mean, std) in report.updates.items()},
        "cka_rbf": _matrix(report.cka_rbf),
        "cka_linear": _matrix(report.cka_linear),
        "spectra": {stage: [_finite_or_none(v) for v in values.tolist()] for stage, values in report.spectra.items()},
        "effective_ranks": report.effective_ranks,
        "metrics": {key: _finite_or_none(value) for key, value in report.as_metrics().items()},
    }


def _tensor(values: list) -> Tensor:
    def nan(v: Any) -> Any:  # null -> NaN, in nested lists
        return [nan(x) for x in v] if isinstance(v, list) else (math.nan if v is None else v)

    return torch.tensor(nan(values), dtype=torch.float64)


def report_from_dict(data: dict[str, Any]) -> ProbeReport:
    """The :class:`ProbeReport` that :func:`report_to_dict` wrote."""
    return ProbeReport(
        stages=list(data["stages"]),
        updates={block: (v["mean"], v["std"]) for block, v in data["updates"].items()},
        cka_rbf=_tensor(data["cka_rbf"]),
        cka_linear=_tensor(data["cka_linear"]),
        spectra={stage: _tensor(values) for stage, values in data["spectra"].items()},
        effective_ranks=dict(data["effective_ranks"]),
        samples=data["samples"],
        top=data["top"],
        sigma_fraction=data["sigma_fraction"],
        debiased=data["debiased"],
        loops=data["loops"],
    )


def load_report(path: str | Path) -> ProbeReport:
    """Read ``probes.json`` (or the folder holding it) back into a :class:`ProbeReport`."""
    path = Path(path)
    return report_from_dict(json.loads((path / REPORT_FILE if path.is_dir() else path).read_text()))


def write_probe_files(report: ProbeReport, out_dir: str | Path, **extra: Any) -> list[Path]:
    """The figures (PNG + SVG) and ``probes.json`` of ``report`` in ``out_dir``; returns the paths."""
    out = Path(out_dir)
    paths = [path for group in plot_report(report, out).values() for path in group]
    (out / REPORT_FILE).write_text(json.dumps(report_to_dict(report, **extra), indent=1, allow_nan=False))
    return [*paths, out / REPORT_FILE]


# ---------------------------------------------------------------- the callback
