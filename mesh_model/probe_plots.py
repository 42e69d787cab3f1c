"""The paper's three probe figures from :class:`~mesh_model.probes.ProbeReport` objects, as PNG and SVG.

(a) relative update magnitude with std error bars: each block's own update (core: f(h) vs h) and,
beside it, the state update h(t-1) -> h(t) of each core iteration; (b) CKA heatmaps, RBF and linear,
each as the paper's biased estimator and the debiased one, with the stage names on both axes, the
values written in and the estimator's floor in the title; (c) normalised singular-value spectra on a
log axis. :func:`plot_comparison` draws the same three side by side for several reports.

matplotlib is imported only when a figure is drawn, and figures are built on the Agg canvas without
pyplot: nothing touches pyplot's global figure list or the caller's backend, so there is nothing left
open after a figure is saved.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

from mesh_model.probes import ProbeReport

FORMATS = ("png", "svg")


def _figure(width: float, height: float, ncols: int = 1) -> tuple[Any, list[Any]]:
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(width, height), layout="constrained")
    FigureCanvasAgg(fig)
    axes = fig.subplots(1, ncols, squeeze=False)[0]
    return fig, list(axes)


def _grid(width: float, height: float, nrows: int, ncols: int) -> tuple[Any, list[list[Any]]]:
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(width, height), layout="constrained")
    FigureCanvasAgg(fig)
    return fig, [list(row) for row in fig.subplots(nrows, ncols, squeeze=False)]


def _save(fig: Any, out_dir: str | Path, stem: str) -> list[Path]:
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    paths = [out / f"{stem}.{fmt}" for fmt in FORMATS]
    for path in paths:
        fig.savefig(path, dpi=150)
    fig.clear()
    return paths


# The two update measures: which report field, the panel title, the y label.
UPDATE_KINDS = {
    "updates": ("core update f(h) vs h", "2|f(h)-h| / (|f(h)|+|h|)"),
    "state_updates": ("state update h(t-1)→h(t)", "2|h(t)-h(t-1)| / (|h(t)|+|h(t-1)|)"),
}


def _update_kinds(reports: list[ProbeReport]) -> list[str]:
    return [kind for kind in UPDATE_KINDS if any(getattr(r, kind) for r in reports)] or ["updates"]


def _updates_figure(reports: dict[str, ProbeReport]) -> Any:
    """One panel per update measure, each wide enough for its bars and its title."""
    kinds = _update_kinds(list(reports.values()))
    widths = [
        max(3.6, 1.0 + 0.45 * len(reports) * len({b for r in reports.values() for b in getattr(r, k)})) for k in kinds
    ]
    fig, axes = _figure(sum(widths), 3.8, ncols=len(kinds))
    for ax, kind in zip(axes, kinds, strict=True):
        _draw_updates(ax, reports, kind)
    return fig


def _draw_updates(ax: Any, reports: dict[str, ProbeReport], kind: str = "updates") -> None:
    values = {label: getattr(report, kind) for label, report in reports.items()}
    blocks: list[str] = []
    for updates in values.values():
        blocks += [b for b in updates if b not in blocks]
    width = 0.8 / len(reports)
    for i, (label, updates) in enumerate(values.items()):
        xs = [j + (i - (len(reports) - 1) / 2) * width for j, b in enumerate(blocks) if b in updates]
        means = [updates[b][0] for b in blocks if b in updates]
        stds = [updates[b][1] for b in blocks if b in updates]
        ax.bar(xs, means, width, yerr=stds, capsize=3, label=label)
    title, ylabel = UPDATE_KINDS[kind]
    ax.set_xticks(range(len(blocks)), blocks)
    ax.set_title(title)
    ax.set_ylabel(ylabel)
    ax.set_ylim(bottom=0)
    if len(reports) > 1:
        ax.legend()


def _estimators(reports: list[ProbeReport], kind: str) -> list[str]:
    """The estimators of ``kind`` ('rbf' or 'linear') the reports hold: biased first."""
    return [e for e in (kind, f"{kind}_debiased") if any(e in r.cka_matrices for r in reports)]


def _cka_title(report: ProbeReport, estimator: str) -> str:
    name = estimator.replace("_debiased", ", debiased") if "debiased" in estimator else f"{estimator}, biased"
    floor = report.cka_floors.get(estimator)
    return f"CKA ({name})" + ("" if floor is None else f", floor {floor:.2f}")


def _draw_cka(ax: Any, report: ProbeReport, estimator: str, vmin: float) -> Any:
    n = len(report.stages)
    ax.set_xticks(range(n), report.stages, rotation=45, ha="right")
    ax.set_yticks(range(n), report.stages)
    if estimator not in report.cka_matrices:  # a report written before this estimator was logged
        ax.text(0.5, 0.5, "not computed", ha="center", va="center", transform=ax.transAxes)
        return None
    matrix = report.cka_matrices[estimator].numpy()
    image = ax.imshow(matrix, cmap="magma", vmin=vmin, vmax=1.0)
    size = max(5, min(9, 60 / n))
    for i in range(n):
        for j in range(n):
            value = matrix[i, j]
            color = "black" if value > vmin + 0.6 * (1 - vmin) else "white"
            ax.text(j, i, f"{value:.2f}", ha="center", va="center", fontsize=size, color=color)
    return image


def _draw_spectra(ax: Any, report: ProbeReport) -> None:
    from matplotlib import colormaps

    cmap = colormaps["viridis"]
    n = len(report.stages)
    for i, stage in enumerate(report.stages):
        values = report.spectra[stage].numpy()
        ax.plot(range(1, len(values) + 1), values, color=cmap(i / max(n - 1, 1)), label=stage)
    ax.set_yscale("log")
    ax.set_xlabel("singular value index i")
    ax.set_ylabel("sigma_i / sigma_0")
    ax.legend(fontsize=7, ncol=2)


def _colour_floor(reports: list[ProbeReport], estimator: str) -> float:
    """The low end of the colour scale: 0, or the lowest value rounded down to 0.1."""
    values = [r.cka_matrices[estimator].nan_to_num(1.0).min().item() for r in reports if estimator in r.cka_matrices]
    return min(0.0, math.floor(min(values, default=0.0) * 10) / 10)


def plot_updates(report: ProbeReport, out_dir: str | Path, stem: str = "probe_updates") -> list[Path]:
    """(a) Bars of the mean relative update with population-std error bars: the blocks' own updates
    and, in a second panel, the core iterations' state updates."""
    fig = _updates_figure({"": report})
    fig.suptitle(f"relative update magnitude ({report.samples} samples)")
    return _save(fig, out_dir, stem)


def plot_cka(report: ProbeReport, out_dir: str | Path, kind: str = "rbf", stem: str | None = None) -> list[Path]:
    """(b) The CKA matrices of ``kind`` ('rbf' or 'linear'), biased and debiased side by side, as
    annotated heatmaps; each title gives the estimator's floor."""
    n = len(report.stages)
    estimators = _estimators([report], kind)
    fig, axes = _figure((2.0 + 0.6 * n) * len(estimators), 1.5 + 0.6 * n, ncols=len(estimators))
    for ax, estimator in zip(axes, estimators, strict=True):
        image = _draw_cka(ax, report, estimator, _colour_floor([report], estimator))
        fig.colorbar(image, ax=ax, shrink=0.8)
        ax.set_title(_cka_title(report, estimator))
    return _save(fig, out_dir, stem or f"probe_cka_{kind}")


def plot_spectra(report: ProbeReport, out_dir: str | Path, stem: str = "probe_spectra") -> list[Path]:
    """(c) Normalised singular values sigma_i / sigma_0 of every stage, log y axis."""
    fig, (ax,) = _figure(5.0, 3.8)
    _draw_spectra(ax, report)
    ax.set_title(f"top-{report.top} normalised singular values")
    return _save(fig, out_dir, stem)


def plot_report(report: ProbeReport, out_dir: str | Path) -> dict[str, list[Path]]:
    """All four files of one report: updates, RBF CKA, linear CKA, spectra."""
    return {
        "updates": plot_updates(report, out_dir),
        "cka_rbf": plot_cka(report, out_dir, "rbf"),
        "cka_linear": plot_cka(report, out_dir, "linear"),
        "spectra": plot_spectra(report, out_dir),
    }


def plot_comparison(
    reports: dict[str, ProbeReport], out_dir: str | Path, stem: str = "probe_compare"
) -> dict[str, list[Path]]:
    """The same figures for several labelled reports (e.g. base vs mesh): grouped update bars,
    and one CKA heatmap / spectrum panel per report side by side on shared scales."""
    if not reports:
        raise ValueError("plot_comparison needs at least one report")
    paths: dict[str, list[Path]] = {}
    fig = _updates_figure(reports)
    fig.suptitle("relative update magnitude")
    paths["updates"] = _save(fig, out_dir, f"{stem}_updates")

    n = max(len(r.stages) for r in reports.values())
    for kind in ("rbf", "linear"):
        estimators = _estimators(list(reports.values()), kind)
        size = 1.0 + 0.6 * n
        fig, grid = _grid(1.0 + size * len(reports), 0.5 + size * len(estimators), len(estimators), len(reports))
        for row, estimator in zip(grid, estimators, strict=True):
            vmin = _colour_floor(list(reports.values()), estimator)
            images = [_draw_cka(ax, report, estimator, vmin) for ax, report in zip(row, reports.values(), strict=True)]
            for ax, (label, report) in zip(row, reports.items(), strict=True):
                ax.set_title(f"{label}: {_cka_title(report, estimator)}", fontsize=9)
            image = next((i for i in images if i is not None), None)
            if image is not None:
                fig.colorbar(image, ax=row, shrink=0.8)
        paths[f"cka_{kind}"] = _save(fig, out_dir, f"{stem}_cka_{kind}")

    fig, axes = _figure(0.5 + 4.5 * len(reports), 3.8, ncols=len(reports))
    for ax, (label, report) in zip(axes, reports.items(), strict=True):
        _draw_spectra(ax, report)
        ax.set_title(f"{label}: normalised spectra")
    lows = [ax.get_ylim()[0] for ax in axes]
    for ax in axes:
        ax.set_ylim(min(lows), 1.5)
    paths["spectra"] = _save(fig, out_dir, f"{stem}_spectra")
    return paths


__all__ = ["plot_cka", "plot_comparison", "plot_report", "plot_spectra", "plot_updates"]
