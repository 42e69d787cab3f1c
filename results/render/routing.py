"""How each row passes state along the loop, from the ``routing/*`` metrics every looped run logs at
each validation (experiments/probing/state_routing.py): ``routing.csv``, the figures and the
report's routing section and appendix table. Descriptive: no claim is tested here.

* ``routing.csv``: every logged step of every run for the coda input's coefficients
  (``routing/coef/coda/<source>/mean``) and MeSH's router entropies (``routing/<router>/<kind>/entropy``).
* ``routing_coefficients``: the coda input's coefficient of f_K over tokens, every row's mean over
  seeds in its scheme's colour; a fixed scheme is a flat line (base 1), so every scheme sits in it.
* ``routing_<row>``, one per MeSH row: each source's coefficient in the coda input over tokens, one
  line per seed coloured by the run's final validation PPL, and the entropy of the transitional and
  the final read.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import pandas as pd

from experiments.probing.figures import figure, legends, save_figure
from mesh_model.probe_names import scheme_color
from results.render.formats import markdown_escape
from results.rows.aggregate import Results, Row
from results.rows.routing import coda_sources, is_mesh, last_core, routed_rows


def _x(frame: pd.DataFrame) -> tuple[str, str]:
    if len(frame) and frame["tokens"].notna().all():
        return "tokens", "tokens seen"
    return "step", "step"


def _ticks(ax: Any, x: str) -> None:
    from matplotlib.ticker import EngFormatter

    if x == "tokens":
        ax.xaxis.set_major_formatter(EngFormatter())


def coefficients_figure(results: Results, frame: pd.DataFrame) -> Any | None:
    """The coda input's coefficient of f_K over training, one line per routed row (mean over seeds); rows
    whose curves coincide (base, residual, anchor all pass f_K whole) share one line whose legend entry
    names them all, instead of entries drawn on top of each other; each line its own style."""
    rows = [r for r in routed_rows(results) if last_core(r)]
    if not rows or frame.empty:
        return None
    fig, (ax,) = figure(7.5, 4.2)
    x, x_label = _x(frame)
    curves: dict[tuple, tuple[pd.Series, list[Row]]] = {}  # rows whose curves coincide share one line
    for row in rows:
        key = f"routing/coef/coda/{last_core(row)}/mean"
        curve = frame[(frame["row"] == row.label) & (frame["metric"] == key)].groupby(x)["value"].mean()
        same = (tuple(curve.index), tuple(round(float(v), 4) for v in curve.values))
        curves.setdefault(same, (curve, []))[1].append(row)
    for k, (curve, together) in enumerate(curves.values()):
        label = together[0].label if len(together) == 1 else ", ".join(r.label for r in together) + " (the same curve)"
        style = ("-", "--", "-.", ":")[k % 4]
        ax.plot(curve.index, curve.values, style, color=scheme_color(together[0].scheme), marker=".", label=label)
    ax.axhline(0.1, color="grey", linestyle=":", linewidth=0.8)
    _ticks(ax, x)
    ax.set_xlabel(x_label)  # once named like the loop's legend entries, it read the last row's label
    ax.set_ylabel("coefficient of f_K in the coda input")
    ax.set_title("How much of the last core iteration reaches the coda (mean over seeds; dotted: 0.1)", fontsize=9)
    ax.grid(alpha=0.3)
    legends(fig, [ax])
    return fig


def row_figure(results: Results, frame: pd.DataFrame, row: Row) -> Any | None:
    """A MeSH row: each coda source's coefficient over training, a line per seed coloured by the
    run's final PPL; then the read entropy (H / log B) of the transition (solid) and the final read
    (dashed)."""
    import matplotlib as mpl

    own = frame[frame["row"] == row.label]
    sources = coda_sources(row)
    if own.empty or not sources:
        return None
    ppl = results.runs.set_index("run_id")[results.ppl_metric] if results.ppl_metric in results.runs else None
    finals = {r: float(ppl[r]) for r in row.run_ids} if ppl is not None else {}
    values = [v for v in finals.values() if math.isfinite(v)]
    norm = (
        mpl.colors.Normalize(min(values), max(values) if max(values) > min(values) else min(values) + 1)
        if values
        else None
    )
    cmap = mpl.colormaps["viridis"]
    fig, axes = figure(0.8 + 3.3 * (len(sources) + 1), 3.6, ncols=len(sources) + 1)
    x, label = _x(own)
    final = f"loop{len([s for s in sources if s.startswith('f')])}"

    def color(run_id: str) -> Any:
        value = finals.get(run_id, math.nan)
        return cmap(norm(value)) if norm is not None and math.isfinite(value) else "grey"

    for ax, source in zip(axes, sources, strict=False):
        for run_id, curve in own[own["metric"] == f"routing/coef/coda/{source}/mean"].groupby("run_id"):
            ax.plot(curve[x], curve["value"], color=color(run_id), marker=".", markersize=3)
        ax.set_title(f"coda input: coefficient of {source}", fontsize=9)
    ax = axes[-1]
    for router, style in (("transition", "-"), (final, "--")):
        for run_id, curve in own[own["metric"] == f"routing/{router}/read/entropy"].groupby("run_id"):
            ax.plot(curve[x], curve["value"], style, color=color(run_id))
    ax.set_title(f"read entropy / log B: transition (solid), final {final} (dashed)", fontsize=9)
    ax.set_ylim(-0.02, 1.02)
    for ax in axes:
        _ticks(ax, x)
        ax.set_xlabel(label)
        ax.grid(alpha=0.3)
    if norm is not None:
        mappable = mpl.cm.ScalarMappable(norm=norm, cmap=cmap)
        fig.colorbar(mappable, ax=axes, label=f"final {results.ppl_metric}", fraction=0.02, pad=0.01)
    fig.suptitle(f"{row.label}: one line per seed, coloured by final PPL", fontsize=10)
    return fig


def slug(text: str) -> str:
    return "".join(c if c.isalnum() else "_" for c in text).strip("_")


def plot_routing(results: Results, frame: pd.DataFrame, out_dir: str | Path) -> dict[str, list[Path]]:
    """Every routing figure, saved: ``coefficients`` and one ``<row label>`` per MeSH row."""
    figures = {}
    fig = coefficients_figure(results, frame)
    if fig is not None:
        figures["coefficients"] = save_figure(fig, out_dir, "routing_coefficients")
    for row in routed_rows(results):
        if is_mesh(row):
            fig = row_figure(results, frame, row)
            if fig is not None:
                figures[row.label] = save_figure(fig, out_dir, f"routing_{slug(row.label)}")
    return figures


def _cell(row: Row, metric: str) -> str:
    stat = row.stats.get(metric)
    if stat is None:
        return "—"
    return f"{stat.mean:.3f} ± {stat.std:.3f}" if stat.std is not None else f"{stat.mean:.3f}"


def routing_table(results: Results) -> list[str]:
    """Markdown: per routed row, the coda input's coefficients at the end (mean ± sd over seeds)
    and MeSH's transitional and final read entropy."""
    rows = routed_rows(results)
    if not rows:
        return []
    sources = max((coda_sources(r) for r in rows), key=len)
    head = ["row", "n", *(f"coda: {s}" for s in sources), "transition read H", "final read H"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for row in rows:
        coefs = [_cell(row, f"routing/coef/coda/{s}/mean") for s in sources]
        final = f"loop{len(coda_sources(row)) - 2}"
        cells = [markdown_escape(row.label), str(row.n), *coefs]
        cells += [_cell(row, "routing/transition/read/entropy"), _cell(row, f"routing/{final}/read/entropy")]
        lines.append("| " + " | ".join(cells) + " |")
    return lines


def routing_section(figures: dict[str, list[Path]], csv: Path | None, image: Any, rel: Any) -> list[str]:
    """The report's "Routing" section: what the numbers are and the figures (``image(paths, alt)``
    renders one, ``rel(path)`` links a file)."""
    if not figures:
        return []
    lines = [
        "",
        "## Routing",
        "",
        "What each row's coda input is made of: every looped scheme's state is an exact per-token combination "
        "of h_emb, the prelude output and the core outputs f_1..f_K; the coefficients, MeSH's router entropies "
        "(H / log B) and slot weights are logged at every validation (MLflow section `routing`)"
        + (f", every point in [{csv.name}]({rel(csv)})" if csv else "")
        + ". The table at the end of training is in the [appendix](#appendix-the-routing-table). Descriptive: "
        "no claim is tested on these.",
        "",
    ]
    for key, paths in figures.items():
        alt = "coefficient of f_K, every row" if key == "coefficients" else f"routing of {key}"
        lines += [image(paths, alt), ""]
    return lines[:-1]


def appendix(results: Results) -> list[str]:
    table = routing_table(results)
    if not table:
        return []
    return ["", "## Appendix: the routing table", "", "At the end of training, mean ± sd over seeds.", "", *table]
