"""A mixture-of-experts run's routing, drawn: :func:`plot_routing` (one run: the expert load of
every router call as a heatmap, the router entropy per call, the Jaccard overlap of the chosen
experts between consecutive loop iterations) and :func:`routing_comparison_figure` (several rows:
load CV, entropy and Jaccard with their spread over seeds). Router calls are named as the probes
log them (:func:`~mesh_model.probe_names.router_calls`) and drawn in the order they run
(:func:`~mesh_model.probe_names.call_order`). Canvas and files as every probe figure
(:mod:`experiments.probing.figures`).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from experiments.probing.figures import (
    HATCHES,
    LINE_STYLES,
    MARKERS,
    figure,
    report_schemes,
    save_figure,
)
from mesh_model.moe import BlockRouting
from mesh_model.probe_names import SCHEME_COLORS, call_order, router_calls, scheme_color, variant_index

ROUTING_KINDS = {  # what a routing comparison panel shows: title, y label
    "load_cv": ("expert load CV per router call", "std / mean of the experts' load (0 = balanced)"),
    "entropy": ("router entropy per router call", "entropy (nats)"),
    "jaccard": ("chosen experts, iteration t vs t+1", "Jaccard |S_t & S_t+1| / |S_t | S_t+1|"),
}


def _pair_label(block: str, t: int) -> str:
    return f"{block} {t}→{t + 1}"


def plot_routing(
    blocks: Mapping[str, BlockRouting], out_dir: str | Path, chance: float | None = None, stem: str = "probe_routing"
) -> list[Path]:
    """One run's routing, three panels: (a) the load share x E of every expert at every router call
    (1 = uniform), calls in the order they run; (b) the router entropy of each call beside log E;
    (c) the Jaccard overlap of each core block's chosen experts between consecutive loop iterations
    beside ``chance`` (two unrelated random top-k sets), when a block ran more than once."""

    import torch

    calls = sorted(
        (
            (name, block, t)
            for block, routing in blocks.items()
            for t, name in enumerate(router_calls(block, len(routing.entropy)))
        ),
        key=lambda call: call_order(call[0]),
    )
    if not calls:
        raise ValueError("plot_routing needs at least one MoE block")
    experts = next(iter(blocks.values())).load.shape[-1]
    load = torch.stack([blocks[block].load[t] for _, block, t in calls]).double() * experts
    pairs = {
        _pair_label(block, t): value
        for block, routing in blocks.items()
        for t, value in enumerate(routing.jaccard.tolist(), 1)
    }
    names = [name for name, _, _ in calls]
    widths = [min(10.0, 2.5 + 0.3 * experts), max(3.5, 1.0 + 0.4 * len(names))]
    if pairs:
        widths.append(max(3.0, 1.0 + 0.5 * len(pairs)))
    fig, axes = figure(sum(widths), 1.8 + 0.25 * len(names), len(widths))
    ax = axes[0]
    image = ax.imshow(load.numpy(), cmap="viridis", vmin=0.0, aspect="auto")
    ax.set_yticks(range(len(names)), names, fontsize=7)
    ax.set_xticks(range(experts), [str(e) for e in range(experts)], fontsize=7 if experts <= 16 else 5)
    ax.set_xlabel("expert")
    ax.set_title("expert load (share x E, 1 = uniform)")
    if experts * len(names) <= 160:
        high = load.max().item()
        for i in range(len(names)):
            for j in range(experts):
                value = load[i, j].item()
                color = "black" if value > 0.6 * high else "white"
                ax.text(j, i, f"{value:.2f}", ha="center", va="center", fontsize=6, color=color)
    fig.colorbar(image, ax=ax, shrink=0.8)
    ax = axes[1]
    entropy = [blocks[block].entropy[t].item() for _, block, t in calls]
    ax.bar(range(len(names)), entropy, color=SCHEME_COLORS["base"])
    ax.axhline(math.log(experts), linestyle="--", color="black", linewidth=1, label=f"log E = {math.log(experts):.2f}")
    ax.set_xticks(range(len(names)), names, rotation=45, ha="right", fontsize=7)
    ax.set_ylim(0, math.log(experts) * 1.3)
    ax.set_ylabel("entropy (nats)")
    ax.set_title("router entropy")
    ax.legend(fontsize=7, loc="upper right")
    if pairs:
        ax = axes[2]
        ax.bar(range(len(pairs)), list(pairs.values()), color=SCHEME_COLORS["base"])
        if chance is not None:
            ax.axhline(chance, linestyle="--", color="black", linewidth=1, label=f"chance {chance:.2f}")
            ax.legend(fontsize=7, loc="upper right")
        ax.set_xticks(range(len(pairs)), list(pairs), rotation=45, ha="right", fontsize=7)
        ax.set_ylim(0, 1.3)
        ax.set_ylabel("Jaccard of the chosen experts")
        ax.set_title("iteration t vs t+1")
    return save_figure(fig, out_dir, stem)


def routing_comparison_figure(
    series: Mapping[str, Mapping[str, Mapping[str, tuple[float, float | None]]]],
    schemes: Mapping[str, str] | None = None,
    chance: float | None = None,
) -> Any:
    """Several labelled rows' routing, mean and spread over seeds: ``series`` maps a label to
    ``load_cv`` and ``entropy`` (router call, :func:`router_calls` -> (mean, std)) and ``jaccard``
    (``<block>/iter<t>/iter<t+1>`` -> (mean, std)). Load CV and entropy are drawn against the
    position of the call in the order the calls run (for MoE in every block: the layer of the
    unrolled model, so a vanilla row and the looped rows of its compute depth line up); Jaccard as
    grouped bars per core block and pair of iterations, beside ``chance``. Each row in its scheme's
    colour (``schemes``: label -> scheme, default the label's first word)."""
    schemes = report_schemes(series, schemes)  # type: ignore[arg-type]
    variants = dict(zip(series, variant_index(schemes[label] for label in series), strict=True))
    kinds = [k for k in ROUTING_KINDS if any(values.get(k) for values in series.values())]
    if not kinds:
        raise ValueError("routing_comparison_figure needs a row with routing metrics")
    fig, axes = figure(0.5 + 5.0 * len(kinds), 4.0, ncols=len(kinds))
    for ax, kind in zip(axes, kinds, strict=True):
        title, ylabel = ROUTING_KINDS[kind]
        if kind == "jaccard":
            _draw_routing_pairs(ax, series, schemes, variants, chance)
        else:
            for label, values in series.items():
                points = sorted((values.get(kind) or {}).items(), key=lambda item: call_order(item[0]))
                if not points:
                    continue
                ax.errorbar(
                    range(1, len(points) + 1),
                    [mean for _, (mean, _) in points],
                    yerr=[std or 0.0 for _, (_, std) in points],
                    marker=MARKERS[variants[label] % len(MARKERS)],
                    linestyle=LINE_STYLES[variants[label] % len(LINE_STYLES)],
                    color=scheme_color(schemes[label]),
                    capsize=3,
                    label=label,
                )
            ax.set_xlabel("router call, in the order run (MoE layer of the unrolled model)")
            ax.set_ylim(bottom=0)
        ax.set_title(title)
        ax.set_ylabel(ylabel, fontsize=8)
        ax.grid(alpha=0.3)
        if ax.get_legend_handles_labels()[0]:
            ax.legend(fontsize=7)
    return fig


def _draw_routing_pairs(
    ax: Any,
    series: Mapping[str, Mapping[str, Mapping[str, tuple[float, float | None]]]],
    schemes: Mapping[str, str],
    variants: Mapping[str, int],
    chance: float | None,
) -> None:
    pairs = sorted({p for values in series.values() for p in values.get("jaccard") or {}}, key=call_order)
    drawn = [label for label, values in series.items() if values.get("jaccard")]
    width = 0.8 / max(len(drawn), 1)
    for i, label in enumerate(drawn):
        values = series[label]["jaccard"]
        xs = [j + (i - (len(drawn) - 1) / 2) * width for j, p in enumerate(pairs) if p in values]
        ax.bar(
            xs,
            [values[p][0] for p in pairs if p in values],
            width,
            yerr=[values[p][1] or 0.0 for p in pairs if p in values],
            capsize=3,
            color=scheme_color(schemes[label]),
            hatch=HATCHES[variants[label] % len(HATCHES)],
            edgecolor="white",
            label=label,
        )
    if chance is not None:
        ax.axhline(chance, linestyle="--", color="black", linewidth=1, label=f"chance {chance:.2f}")
    names = [f"{p.split('/')[0]} {p.split('/')[1][4:]}→{p.split('/')[2][4:]}" for p in pairs]
    ax.set_xticks(range(len(pairs)), names, rotation=30, ha="right", fontsize=7)
    ax.set_ylim(0, 1.3)


__all__ = ["ROUTING_KINDS", "plot_routing", "routing_comparison_figure"]
