"""The paper's three probe figures from :class:`~mesh_model.probes.ProbeReport` objects, as PNG and SVG.

(a) relative update magnitude per block with std error bars, (b) CKA heatmaps (RBF and linear) with
the stage names on both axes and the values written in, (c) normalised singular-value spectra on a
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


def _save(fig: Any, out_dir: str | Path, stem: str) -> list[Path]:
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    paths = [out / f"{stem}.{fmt}" for fmt in FORMATS]
    for path in paths:
        fig.savefig(path, dpi=150)
    fig.clear()
    return paths


def _draw_updates(ax: Any, reports: dict[str, ProbeReport]) -> None:
    blocks: list[str] = []
    for report in reports.values():
        blocks += [b for b in report.updates if b not in blocks]
    width = 0.8 / len(reports)
    for i, (label, report) in enumerate(reports.items()):
        xs = [j + (i - (len(reports) - 1) / 2) * width for j, b in enumerate(blocks) if b in report.updates]
        means = [report.updates[b][0] for b in blocks if b in report.updates]
        stds = [report.updates[b][1] for b in blocks if b in report.updates]
        ax.bar(xs, means, width, yerr=stds, capsize=3, label=label)
    ax.set_xticks(range(len(blocks)), blocks)
    ax.set_ylabel("relative update  2|f(h)-h| / (|f(h)|+|h|)")
    ax.set_ylim(bottom=0)
    if len(reports) > 1:
        ax.legend()


def _draw_cka(ax: Any, report: ProbeReport, kind: str, vmin: float) -> Any:
    matrix = (report.cka_rbf if kind == "rbf" else report.cka_linear).numpy()
    image = ax.imshow(matrix, cmap="magma", vmin=vmin, vmax=1.0)
    n = len(report.stages)
    ax.set_xticks(range(n), report.stages, rotation=45, ha="right")
    ax.set_yticks(range(n), report.stages)
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


def _cka_floor(reports: list[ProbeReport], kind: str) -> float:
    values = [(r.cka_rbf if kind == "rbf" else r.cka_linear).nan_to_num(1.0).min().item() for r in reports]
    return min(0.0, math.floor(min(values) * 10) / 10)


def plot_updates(report: ProbeReport, out_dir: str | Path, stem: str = "probe_updates") -> list[Path]:
    """(a) Bars of the mean relative update per block with population-std error bars."""
    fig, (ax,) = _figure(1.0 + 0.7 * len(report.updates), 3.5)
    _draw_updates(ax, {"": report})
    ax.set_title(f"update magnitude ({report.samples} samples)")
    return _save(fig, out_dir, stem)


def plot_cka(report: ProbeReport, out_dir: str | Path, kind: str = "rbf", stem: str | None = None) -> list[Path]:
    """(b) The CKA matrix of ``kind`` ('rbf' or 'linear') as an annotated heatmap."""
    n = len(report.stages)
    fig, (ax,) = _figure(2.0 + 0.6 * n, 1.5 + 0.6 * n)
    image = _draw_cka(ax, report, kind, _cka_floor([report], kind))
    fig.colorbar(image, ax=ax, shrink=0.8)
    ax.set_title(f"CKA ({kind}{', debiased' if report.debiased else ''})")
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
    blocks = {b for r in reports.values() for b in r.updates}
    fig, (ax,) = _figure(1.5 + 0.5 * len(blocks) * len(reports), 3.8)
    _draw_updates(ax, reports)
    ax.set_title("update magnitude")
    paths["updates"] = _save(fig, out_dir, f"{stem}_updates")

    n = max(len(r.stages) for r in reports.values())
    for kind in ("rbf", "linear"):
        fig, axes = _figure(1.0 + (1.0 + 0.6 * n) * len(reports), 1.5 + 0.6 * n, ncols=len(reports))
        vmin = _cka_floor(list(reports.values()), kind)
        for ax, (label, report) in zip(axes, reports.items(), strict=True):
            image = _draw_cka(ax, report, kind, vmin)
            ax.set_title(f"{label}: CKA ({kind})")
        fig.colorbar(image, ax=axes, shrink=0.8)
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
