"""``probes.json``, ``probes.csv`` and the probe figures of one report: written by the training
callback and ``mesh-probe``, read back by ``mesh-results``. No Lightning here, so readers start fast.

Every probe value is in ``probes.csv`` and ``probes.json``; MLflow gets only
:data:`SUMMARY_METRICS` (:func:`summary_metrics`), so a run's page is not a hundred charts of one dot.

A mixture-of-experts run's report also holds its routing (:mod:`experiments.probing.routing`):
``probes.json`` keeps it under ``routing`` (:func:`load_routing` reads it back), its metrics join
the report's under ``metrics``, and ``probe_routing`` (PNG and SVG) is drawn beside the other figures."""

from __future__ import annotations

import csv
import json
import math
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from experiments.probing.figures import plot_report
from experiments.probing.routing import RoutingReport, chance_jaccard, routing_from_dict, routing_to_dict
from experiments.probing.routing_figures import plot_routing
from mesh_model.probes import ProbeReport

PROBE_DIR = "probes"
REPORT_FILE = "probes.json"
TABLE_FILE = "probes.csv"  # every probe value, one row each: the run page's Artifacts tab shows it as a table
FORMAT = 3  # 1: core updates were h(t-1) -> h(t), one CKA estimator, no floors; 2: no norms,
# normalised updates or permutation floors
# The probe values logged as MLflow metrics (those a report has): what the claims
# (results/paper_claims.yaml) and the probe table's summary columns read, a few per run. The others
# (per block, per CKA pair, per stage, per router call) are read back from probes.csv.
SUMMARY_METRICS = (
    "probe/update/core_balance",
    "probe/state_update/core_balance",
    "probe/cka_rbf/loop_mean",
    "probe/cka_rbf/floor",
    "probe/cka_rbf_debiased/loop_mean",
    "probe/cka_rbf_debiased/floor",
    "probe/erank/loop_mean",
    "probe/moe_load_cv/mean",  # mixture-of-experts runs
    "probe/moe_entropy/mean",
    "probe/moe_jaccard/loop_mean",
    "probe/moe_jaccard/chance",
)


def _finite_or_none(value: float) -> float | None:
    return value if math.isfinite(value) else None  # strict JSON has no NaN


def _matrix(matrix: Tensor) -> list[list[float | None]]:
    return [[_finite_or_none(v) for v in row] for row in matrix.tolist()]


def _updates(updates: dict[str, tuple[float, float]]) -> dict[str, dict[str, float]]:
    return {block: {"mean": mean, "std": std} for block, (mean, std) in updates.items()}


def probe_metrics(report: ProbeReport, routing: RoutingReport | None = None) -> dict[str, float]:
    """Every value a probe writes to ``probes.csv``: the report's metrics and, for a
    mixture-of-experts run, its routing's."""
    return {**report.as_metrics(), **(routing.as_metrics() if routing is not None else {})}


def summary_metrics(metrics: dict[str, float]) -> dict[str, float]:
    """The :data:`SUMMARY_METRICS` among ``metrics``: what a probe logs to MLflow."""
    return {key: metrics[key] for key in SUMMARY_METRICS if key in metrics}


def report_to_dict(report: ProbeReport, routing: RoutingReport | None = None, **extra: Any) -> dict[str, Any]:
    """A JSON-ready dict of the report (NaN as null); ``extra`` keys (step, batches...) are added.
    ``updates`` are the blocks' own updates (core: f(h) vs h), ``state_updates`` h(t-1) -> h(t),
    ``normed_updates`` and ``state_normed_updates`` the same after scaling both to unit norm,
    ``norms`` each stage's and core output's ||h||_F / sqrt(L), ``cka_perm_floors`` the (S, S)
    permutation floors; ``routing`` (a MoE run's, when given) the full routing report."""
    routed = {"routing": routing_to_dict(routing)} if routing is not None else {}
    return {
        **extra,
        "format": FORMAT,
        "samples": report.samples,
        "seq_len": report.seq_len,
        "loops": report.loops,
        "top": report.top,
        "sigma_fraction": report.sigma_fraction,
        "stages": report.stages,
        "updates": _updates(report.updates),
        "state_updates": _updates(report.state_updates),
        "normed_updates": _updates(report.normed_updates),
        "state_normed_updates": _updates(report.state_normed_updates),
        "norms": _updates(report.norms),
        "cka": {estimator: _matrix(matrix) for estimator, matrix in report.cka_matrices.items()},
        "cka_floors": {estimator: _finite_or_none(floor) for estimator, floor in report.cka_floors.items()},
        "cka_perm_floors": {estimator: _matrix(matrix) for estimator, matrix in report.cka_perm_floors.items()},
        "spectra": {stage: [_finite_or_none(v) for v in values.tolist()] for stage, values in report.spectra.items()},
        "effective_ranks": report.effective_ranks,
        **routed,
        "metrics": {key: _finite_or_none(value) for key, value in probe_metrics(report, routing).items()},
    }


def _tensor(values: list) -> Tensor:
    def nan(v: Any) -> Any:  # null -> NaN, in nested lists
        return [nan(x) for x in v] if isinstance(v, list) else (math.nan if v is None else v)

    return torch.tensor(nan(values), dtype=torch.float64)


def _from_first_format(data: dict[str, Any]) -> dict[str, Any]:
    """A ``probes.json`` written before the core update was split from the state update: its core
    "updates" were h(t-1) -> h(t), so they become state updates (the core's own is unknown), and its
    two CKA matrices were the estimator its ``debiased`` flag names; it has no floors."""
    updates = {block: v for block, v in data["updates"].items() if not block.startswith("core")}
    suffix = "_debiased" if data.get("debiased") else ""
    return {
        **data,
        "updates": updates,
        "state_updates": {block: v for block, v in data["updates"].items() if block.startswith("core")},
        "cka": {f"rbf{suffix}": data["cka_rbf"], f"linear{suffix}": data["cka_linear"]},
        "cka_floors": {},
    }


def _mean_std(values: dict[str, dict[str, float]]) -> dict[str, tuple[float, float]]:
    return {block: (v["mean"], v["std"]) for block, v in values.items()}


def report_from_dict(data: dict[str, Any]) -> ProbeReport:
    """The :class:`ProbeReport` that :func:`report_to_dict` wrote (or an earlier version of it:
    formats 1 and 2 have no norms, normalised updates or permutation floors, read back empty)."""
    if data.get("format", 1) == 1:
        data = _from_first_format(data)
    elif data["format"] not in (2, FORMAT):
        raise ValueError(f"probes.json format {data['format']} is unknown: this version reads formats 1 to {FORMAT}")
    return ProbeReport(
        stages=list(data["stages"]),
        updates=_mean_std(data["updates"]),
        state_updates=_mean_std(data["state_updates"]),
        cka_matrices={estimator: _tensor(matrix) for estimator, matrix in data["cka"].items()},
        cka_floors={e: math.nan if floor is None else floor for e, floor in data["cka_floors"].items()},
        spectra={stage: _tensor(values) for stage, values in data["spectra"].items()},
        effective_ranks=dict(data["effective_ranks"]),
        samples=data["samples"],
        top=data["top"],
        sigma_fraction=data["sigma_fraction"],
        loops=data["loops"],
        seq_len=data.get("seq_len"),
        norms=_mean_std(data.get("norms", {})),
        normed_updates=_mean_std(data.get("normed_updates", {})),
        state_normed_updates=_mean_std(data.get("state_normed_updates", {})),
        cka_perm_floors={e: _tensor(matrix) for e, matrix in data.get("cka_perm_floors", {}).items()},
    )


def _read(path: str | Path) -> dict[str, Any]:
    path = Path(path)
    return json.loads((path / REPORT_FILE if path.is_dir() else path).read_text())


def load_report(path: str | Path) -> ProbeReport:
    """Read ``probes.json`` (or the folder holding it) back into a :class:`ProbeReport`."""
    return report_from_dict(_read(path))


def load_routing(path: str | Path) -> RoutingReport | None:
    """The routing report of a ``probes.json`` (or the folder holding it); None for a dense run's."""
    data = _read(path)
    return routing_from_dict(data["routing"]) if "routing" in data else None


def write_probe_table(metrics: dict[str, float | None], path: Path) -> Path:
    """``probes.csv``: a ``metric,value`` row per probe metric, by name (an empty value for NaN)."""
    with path.open("w", newline="") as file:
        writer = csv.writer(file)
        writer.writerow(["metric", "value"])
        writer.writerows((key, "" if value is None else repr(value)) for key, value in sorted(metrics.items()))
    return path


def read_probe_table(path: str | Path) -> dict[str, float]:
    """The metrics :func:`write_probe_table` wrote (NaN where empty)."""
    with Path(path).open(newline="") as file:
        return {row["metric"]: float(row["value"] or "nan") for row in csv.DictReader(file)}


def write_probe_files(
    report: ProbeReport,
    out_dir: str | Path,
    routing: RoutingReport | None = None,
    figures: bool = True,
    **extra: Any,
) -> list[Path]:
    """The figures (PNG + SVG; not when ``figures`` is false), ``probes.json`` and ``probes.csv``
    (every probe value, a table) of ``report`` (and of a MoE run's ``routing``) in ``out_dir``;
    returns the paths."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    paths = [path for group in plot_report(report, out).values() for path in group] if figures else []
    if routing is not None and figures:
        paths += plot_routing(routing.blocks, out, chance=chance_jaccard(routing.experts, routing.top_k))
    data = report_to_dict(report, routing, **extra)
    (out / REPORT_FILE).write_text(json.dumps(data, indent=1, allow_nan=False))
    return [*paths, out / REPORT_FILE, write_probe_table(data["metrics"], out / TABLE_FILE)]
