"""The paper's three probe figures from :class:`~mesh_model.probes.ProbeReport` objects, as PNG and SVG.

(a) relative update magnitude with std error bars: each block's own update (core: f(h) vs h) and,
beside it, the state update h(t-1) -> h(t) of each core iteration; (b) CKA heatmaps, RBF and linear,
each as the paper's biased estimator and the debiased one, with the stage names on both axes, the
values written in and the estimator's floor in the title; (c) normalised singular-value spectra on a
log axis. :func:`plot_comparison` draws the same three for several reports, in grids of at most
:data:`PANELS_PER_ROW` panels a row.

What is shown and in which order comes from :mod:`mesh_model.probe_names`: one colour per scheme
(:func:`~mesh_model.probe_names.scheme_color`), a vanilla layout as one stack, ``stack``
(:func:`~mesh_model.probe_names.shown_blocks`), blocks in the order they run. :func:`figure` and
:func:`save_figure` are the canvas and the files of every figure of the project (``results`` draws
its report's figures with them).

A mixture-of-experts run's routing figures are :mod:`experiments.probing.routing_figures`.

matplotlib is imported only when a figure is drawn, and figures are built on the Agg canvas without
pyplot: nothing touches pyplot's global figure list or the caller's backend, so there is nothing left
open after a figure is saved.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from mesh_model.probe_names import (
    block_order,
    scheme_color,
    scheme_of,
    shown_matrix,
    shown_stages,
    shown_updates,
    variant_index,
)
from mesh_model.probes import ProbeReport

FORMATS = ("png", "svg")
PANELS_PER_ROW = 3
MAX_WIDTH = 16.0  # inches: a wider figure is cut into rows

# The k-th row of one scheme in a figure: its marker, line style and bar hatch.
MARKERS = ("o", "s", "^", "D", "v", "P", "X", "*")
LINE_STYLES = ("-", "--", ":", "-.")
HATCHES = ("", "//", "..", "xx", "\\\\", "++")


def _canvas(width: float, height: float) -> Any:
    """An empty figure on its own Agg canvas (no pyplot), laid out by constrained layout."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(width, height), layout="constrained")
    FigureCanvasAgg(fig)
    return fig


def figure(width: float, height: float, ncols: int = 1) -> tuple[Any, list[Any]]:
    """A figure of ``width`` x ``height`` inches with ``ncols`` panels side by side (:func:`_canvas`):
    the figure and its panels."""
    fig = _canvas(width, height)
    return fig, list(fig.subplots(1, ncols, squeeze=False)[0])


def _panels(count: int, width: float, height: float) -> tuple[Any, list[list[Any]]]:
    """A figure of ``count`` panels of ``width`` x ``height`` inches, at most :data:`PANELS_PER_ROW`
    a row; the panels of the last row that are not needed are removed. Returns the figure and its
    panels row by row."""
    ncols, nrows = _shape(count)
    fig = _canvas(0.6 + width * ncols, height * nrows)
    return fig, _grid_axes(fig, count)


def _shape(count: int) -> tuple[int, int]:
    """(columns, rows) of a grid of ``count`` panels, at most :data:`PANELS_PER_ROW` a row."""
    ncols = max(1, min(count, PANELS_PER_ROW))
    return ncols, math.ceil(count / ncols)


def _grid_axes(fig: Any, count: int) -> list[list[Any]]:
    """``count`` panels in a grid on ``fig`` (a figure or subfigure); the unused ones removed."""
    ncols, nrows = _shape(count)
    flat = list(fig.subplots(nrows, ncols, squeeze=False).reshape(-1))
    for ax in flat[count:]:
        ax.remove()
    return [flat[i : min(i + ncols, count)] for i in range(0, count, ncols)]


def text_inches(texts: Iterable[str], fontsize: float) -> float:
    """The width of the widest of ``texts`` at ``fontsize`` points, in inches (the default font's
    glyph advances; no canvas needed)."""
    from matplotlib.font_manager import FontProperties
    from matplotlib.textpath import TextToPath

    prop, measure = FontProperties(size=fontsize), TextToPath()
    widths = [measure.get_text_width_height_descent(text, prop, ismath=False)[0] for text in texts]
    return max(widths, default=0.0) / 72


LEGEND_INSIDE_INCHES = 3.2  # a legend whose longest entry (with its line) is wider goes below the panels


def legend_inches(labels: Iterable[str], fontsize: float) -> float:
    """The width of a legend of ``labels``: its widest label and the entry's line and padding."""
    return text_inches(labels, fontsize) + 0.6


def legends(fig: Any, axes: Sequence[Any], fontsize: float = 7) -> None:
    """Each panel's legend inside it where its entries are short. Where one is long (a row label
    that names every override its rows vary), one legend of every panel's entries goes below the
    panels and the figure grows to hold it: inside, it squeezed its panel to nothing and constrained
    layout gave up, cutting the labels off."""
    entries: dict[tuple, tuple[str, Any]] = {}  # one entry per label and look: a label styled otherwise
    for ax in axes:  # in another panel (styles are given panel by panel) keeps an entry of its own
        for handle, label in zip(*ax.get_legend_handles_labels(), strict=True):
            look = (label, _look(handle))
            entries.setdefault(look, (label, handle))
    if not entries:
        return
    labels = [label for label, _ in entries.values()]
    widest = legend_inches(labels, fontsize)
    if widest <= LEGEND_INSIDE_INCHES:
        for ax in axes:
            if ax.get_legend_handles_labels()[1]:
                ax.legend(fontsize=fontsize)
        return
    handles = [handle for _, handle in entries.values()]
    fig.legend(handles, labels, loc="outside lower center", fontsize=fontsize, frameon=False)
    width, height = fig.get_size_inches()
    fig.set_size_inches(max(width, widest + 0.8), height + len(entries) * fontsize * 1.45 / 72 + 0.3)


def _look(handle: Any) -> tuple:
    """What tells a legend entry's line apart: colour, line style, marker (a patch: its colour)."""
    from matplotlib.colors import to_hex

    if hasattr(handle, "get_linestyle") and hasattr(handle, "get_marker"):
        return (to_hex(handle.get_color()), str(handle.get_linestyle()), str(handle.get_marker()))
    return (to_hex(handle.get_facecolor()),) if hasattr(handle, "get_facecolor") else (id(handle),)


def save_figure(fig: Any, out_dir: str | Path, stem: str) -> list[Path]:
    """``fig`` as ``<stem>.png`` and ``<stem>.svg`` (:data:`FORMATS`) in ``out_dir``, then cleared:
    the paths written."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    import matplotlib

    paths = [out / f"{stem}.{fmt}" for fmt in FORMATS]
    # The same figure gives the same bytes (a report rebuilt from its data equals the one committed):
    # no date in the metadata, SVG ids from a fixed salt instead of a random one.
    # The layout is computed once, at the saved dpi, and serves both formats (:func:`_lay_out`).
    # The figure's engine is put back once it is cleared.
    engine = fig.get_layout_engine()
    try:
        with matplotlib.rc_context({"svg.hashsalt": stem}):
            if engine is not None:
                _lay_out(fig, engine, SAVED_DPI)
            for path in paths:
                fig.savefig(path, dpi=SAVED_DPI, metadata={"Date": None} if path.suffix != ".png" else None)
    finally:
        fig.clear()
        fig.set_layout_engine(engine)
    return paths


SAVED_DPI = 150


def _lay_out(fig: Any, engine: Any, dpi: float) -> None:
    """Run ``fig``'s layout engine once at ``dpi`` and take the engine off, the positions kept.

    ``savefig`` of a figure that has a layout engine (even the placeholder ``"none"`` leaves) first
    draws the whole figure without output to lay it out, then draws it again to write it: every text
    measured twice per format. Laid out here once, each format is one draw, byte for byte the same
    files (constrained layout measures the texts at the dpi it is given, as savefig's own pass did):
    a 3-panel annotated 13x13 heatmap saves in about a fifth less CPU; a report's rebuild, mostly
    other work, barely moves (benchmarks/README.md)."""
    shown = fig.dpi
    fig.dpi = dpi
    try:
        engine.execute(fig)
    finally:
        fig.dpi = shown
    fig.set_layout_engine(None)


# The two update measures: which report field, the panel title, the y label.
UPDATE_KINDS = {
    "updates": ("core update f(h) vs h", "2|f(h)-h| / (|f(h)|+|h|)"),
    "state_updates": ("state update h(t-1)→h(t)", "2|h(t)-h(t-1)| / (|h(t)|+|h(t-1)|)"),
}


def _update_kinds(reports: list[ProbeReport]) -> list[str]:
    return [kind for kind in UPDATE_KINDS if any(getattr(r, kind) for r in reports)] or ["updates"]


def report_schemes(reports: Mapping[str, ProbeReport], schemes: Mapping[str, str] | None) -> dict[str, str]:
    """label -> scheme: from ``schemes`` where given, else the label's first word."""
    return {label: (schemes or {}).get(label, scheme_of(label)) for label in reports}


def updates_figure(reports: Mapping[str, ProbeReport], schemes: Mapping[str, str] | None = None) -> Any:
    """One panel per update measure, each wide enough for its bars and its title (side by side, or
    one a row when that is wider than :data:`MAX_WIDTH` inches); the bars of a report in its
    scheme's colour (``schemes``: label -> scheme, default the label's first word)."""
    kinds = _update_kinds(list(reports.values()))
    widths = [
        max(3.6, 1.0 + 0.45 * len(reports) * len({b for r in reports.values() for b in shown_updates(r, k)}))
        for k in kinds
    ]
    if sum(widths) <= MAX_WIDTH:
        fig, axes = figure(sum(widths), 3.8, ncols=len(kinds))
    else:  # one panel a row
        fig = _canvas(max(widths), 3.8 * len(kinds))
        axes = list(fig.subplots(len(kinds), 1, squeeze=False)[:, 0])
    for ax, kind in zip(axes, kinds, strict=True):
        _draw_updates(ax, reports, kind, report_schemes(reports, schemes))
    return fig


def _draw_updates(ax: Any, reports: Mapping[str, ProbeReport], kind: str, schemes: Mapping[str, str]) -> None:
    values = {label: shown_updates(report, kind) for label, report in reports.items()}
    blocks = sorted({b for updates in values.values() for b in updates}, key=block_order)
    width = 0.8 / len(reports)
    variants = variant_index(schemes[label] for label in values)
    for i, (label, updates) in enumerate(values.items()):
        if not updates:  # a layout without these blocks (vanilla: no state update): no bar, no legend entry
            continue
        xs = [j + (i - (len(reports) - 1) / 2) * width for j, b in enumerate(blocks) if b in updates]
        means = [updates[b][0] for b in blocks if b in updates]
        stds = [updates[b][1] for b in blocks if b in updates]
        color = scheme_color(schemes[label]) if schemes[label] else None
        hatch = HATCHES[variants[i] % len(HATCHES)]
        ax.bar(xs, means, width, yerr=stds, capsize=3, label=label, color=color, hatch=hatch, edgecolor="white")
    title, ylabel = UPDATE_KINDS[kind]
    ax.set_xticks(range(len(blocks)), blocks)
    ax.set_title(title)
    ax.set_ylabel(ylabel)
    ax.set_ylim(bottom=0)
    if len(reports) > 1:
        ax.legend(fontsize=7)


def _estimators(reports: list[ProbeReport], kind: str) -> list[str]:
    """The estimators of ``kind`` ('rbf' or 'linear') the reports hold: biased first."""
    return [e for e in (kind, f"{kind}_debiased") if any(e in r.cka_matrices for r in reports)]


def _cka_title(report: ProbeReport, estimator: str) -> str:
    name = estimator.replace("_debiased", ", debiased") if "debiased" in estimator else f"{estimator}, biased"
    floor = report.cka_floors.get(estimator)
    return f"CKA ({name})" + ("" if floor is None else f", floor {floor:.2f}")


def colour_range(reports: Iterable[ProbeReport], estimator: str) -> tuple[float, float]:
    """The colour scale of ``estimator``'s heatmaps: the lowest and highest finite value over every
    report (the diagonal's 1 included); (0, 1) when there is none, and a width of at least 0.01."""
    import torch

    values = [shown_matrix(r, estimator) for r in reports if estimator in r.cka_matrices]
    finite = torch.cat([v[v.isfinite()].reshape(-1) for v in values]) if values else torch.empty(0)
    if not len(finite):
        return 0.0, 1.0
    low, high = finite.min().item(), finite.max().item()
    return (low, high) if high - low >= 0.01 else (high - 0.01, high)


def _draw_cka(ax: Any, report: ProbeReport, estimator: str, limits: tuple[float, float]) -> Any:
    stages = list(shown_stages(report))
    n = len(stages)
    ax.set_xticks(range(n), stages, rotation=45, ha="right")
    ax.set_yticks(range(n), stages)
    if estimator not in report.cka_matrices:  # a report written before this estimator was logged
        ax.text(0.5, 0.5, "not computed", ha="center", va="center", transform=ax.transAxes)
        return None
    vmin, vmax = limits
    matrix = shown_matrix(report, estimator).numpy()
    image = ax.imshow(matrix, cmap="magma", vmin=vmin, vmax=vmax)
    size = max(5, min(9, 60 / n))
    for i in range(n):
        for j in range(n):
            value = matrix[i, j]
            color = "black" if value > vmin + 0.6 * (vmax - vmin) else "white"
            ax.text(j, i, f"{value:.2f}", ha="center", va="center", fontsize=size, color=color)
    return image


def _draw_spectra(ax: Any, report: ProbeReport) -> None:
    from matplotlib import colormaps

    cmap = colormaps["viridis"]
    stages = shown_stages(report)
    n = len(stages)
    for i, (stage, index) in enumerate(stages.items()):
        values = report.spectra[report.stages[index]].numpy()
        ax.plot(range(1, len(values) + 1), values, color=cmap(i / max(n - 1, 1)), label=stage)
    ax.set_yscale("log")
    ax.set_xlabel("singular value index i")
    ax.set_ylabel("sigma_i / sigma_0")
    ax.legend(fontsize=7, ncol=2)


def plot_updates(report: ProbeReport, out_dir: str | Path, stem: str = "probe_updates") -> list[Path]:
    """(a) Bars of the mean relative update with population-std error bars: the blocks' own updates
    and, in a second panel, the core iterations' state updates."""
    fig = updates_figure({"": report})
    fig.suptitle(f"relative update magnitude ({report.samples} samples)")
    return save_figure(fig, out_dir, stem)


def plot_cka(report: ProbeReport, out_dir: str | Path, kind: str = "rbf", stem: str | None = None) -> list[Path]:
    """(b) The CKA matrices of ``kind`` ('rbf' or 'linear'), biased and debiased side by side, as
    annotated heatmaps, each on the colour scale of its values; each title gives the estimator's floor."""
    n = len(report.stages)
    estimators = _estimators([report], kind)
    fig, axes = figure((2.0 + 0.6 * n) * len(estimators), 1.5 + 0.6 * n, ncols=len(estimators))
    for ax, estimator in zip(axes, estimators, strict=True):
        image = _draw_cka(ax, report, estimator, colour_range([report], estimator))
        fig.colorbar(image, ax=ax, shrink=0.8)
        ax.set_title(_cka_title(report, estimator))
    return save_figure(fig, out_dir, stem or f"probe_cka_{kind}")


def plot_spectra(report: ProbeReport, out_dir: str | Path, stem: str = "probe_spectra") -> list[Path]:
    """(c) Normalised singular values sigma_i / sigma_0 of every stage, log y axis."""
    fig, (ax,) = figure(5.0, 3.8)
    _draw_spectra(ax, report)
    ax.set_title(f"top-{report.top} normalised singular values")
    return save_figure(fig, out_dir, stem)


def plot_report(report: ProbeReport, out_dir: str | Path) -> dict[str, list[Path]]:
    """All four files of one report: updates, RBF CKA, linear CKA, spectra."""
    return {
        "updates": plot_updates(report, out_dir),
        "cka_rbf": plot_cka(report, out_dir, "rbf"),
        "cka_linear": plot_cka(report, out_dir, "linear"),
        "spectra": plot_spectra(report, out_dir),
    }


def cka_comparison_figure(reports: Mapping[str, ProbeReport], kind: str = "rbf") -> Any:
    """The CKA heatmaps of ``kind`` ('rbf' or 'linear') of several labelled reports: for each
    estimator (biased, then debiased) a block of panels, one per report, at most
    :data:`PANELS_PER_ROW` a row, all on one colour scale (the estimator's lowest to highest value
    over the reports, :func:`colour_range`) shown by one colorbar beside the block."""
    n = max(len(r.stages) for r in reports.values())
    estimators = _estimators(list(reports.values()), kind) or [kind]
    size = 1.3 + 0.55 * n
    ncols, nrows = _shape(len(reports))
    fig = _canvas(1.2 + size * ncols, (0.4 + size * nrows) * len(estimators))
    for section, estimator in zip(fig.subfigures(len(estimators), 1, squeeze=False)[:, 0], estimators, strict=True):
        limits = colour_range(reports.values(), estimator)
        axes = [ax for row in _grid_axes(section, len(reports)) for ax in row]
        images = [_draw_cka(ax, report, estimator, limits) for ax, report in zip(axes, reports.values(), strict=True)]
        for ax, (label, report) in zip(axes, reports.items(), strict=True):
            ax.set_title(f"{label}\n{_cka_title(report, estimator)}", fontsize=9)
        image = next((i for i in images if i is not None), None)
        if image is not None:
            section.colorbar(image, ax=axes, shrink=0.8, label=f"CKA ({estimator})")
    return fig


def spectra_comparison_figure(reports: Mapping[str, ProbeReport]) -> Any:
    """One spectra panel per report, at most :data:`PANELS_PER_ROW` a row, on a shared y axis."""
    fig, rows = _panels(len(reports), 4.5, 3.8)
    axes = [ax for row in rows for ax in row]
    for ax, (label, report) in zip(axes, reports.items(), strict=True):
        _draw_spectra(ax, report)
        ax.set_title(f"{label}: normalised spectra", fontsize=9)
    lows = [ax.get_ylim()[0] for ax in axes]
    for ax in axes:
        ax.set_ylim(min(lows), 1.5)
    return fig


def plot_comparison(
    reports: Mapping[str, ProbeReport],
    out_dir: str | Path,
    stem: str = "probe_compare",
    schemes: Mapping[str, str] | None = None,
) -> dict[str, list[Path]]:
    """The same figures for several labelled reports (e.g. base vs mesh): grouped update bars in
    each scheme's colour (``schemes``: label -> scheme, default the label's first word), and the
    CKA heatmaps and spectra in grids of at most :data:`PANELS_PER_ROW` panels a row, on shared
    scales."""
    if not reports:
        raise ValueError("plot_comparison needs at least one report")
    paths: dict[str, list[Path]] = {}
    fig = updates_figure(reports, schemes)
    fig.suptitle("relative update magnitude")
    paths["updates"] = save_figure(fig, out_dir, f"{stem}_updates")
    for kind in ("rbf", "linear"):
        paths[f"cka_{kind}"] = save_figure(cka_comparison_figure(reports, kind), out_dir, f"{stem}_cka_{kind}")
    paths["spectra"] = save_figure(spectra_comparison_figure(reports), out_dir, f"{stem}_spectra")
    return paths


# ---------------------------------------------------------------- mixture-of-experts routing


__all__ = [
    "FORMATS",
    "HATCHES",
    "LINE_STYLES",
    "MARKERS",
    "PANELS_PER_ROW",
    "cka_comparison_figure",
    "colour_range",
    "figure",
    "plot_cka",
    "plot_comparison",
    "plot_report",
    "plot_spectra",
    "plot_updates",
    "report_schemes",
    "save_figure",
    "spectra_comparison_figure",
    "updates_figure",
]
