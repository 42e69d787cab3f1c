"""The report's figures (PNG + SVG, matplotlib's Agg canvas, no pyplot state):

* the ranking: per block, its rows sorted by mean PPL (best at top), each seed a dot, the mean a bar;
* PPL against % non-embedding parameters of vanilla, one point per row named in a legend, a panel per
  preset, where the rows' parameter shares spread (:func:`shares_spread`);
* the B ablation (PPL against MeSH's buffer slots, error bars over seeds) when B varies;
* training-loss curves per row, each run smoothed by a trailing rolling mean (:func:`smoothing_window`),
  then the mean over seeds with a ± std band, a panel per block;
* validation PPL over tokens per block (mean ± 95% t band over seeds), and each primary claim's Δ in
  validation loss over tokens with its 95% CI (:mod:`results.verdicts.over_training` computes both);
* the probe comparison of each block (:func:`experiments.probing.figures.plot_comparison`), and, where
  rows are mixtures of experts, their routing per router call, mean ± std over seeds
  (:func:`experiments.probing.routing_figures.routing_comparison_figure`).

Every ``plot_*`` function returns the paths it wrote, or an empty list when the runs hold nothing to
draw; a scheme has the same colour in every figure (:func:`mesh_model.probe_names.scheme_color`).
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import pandas as pd

from experiments.probing.figures import (
    LINE_STYLES,
    MARKERS,
    figure,
    legend_inches,
    legends,
    plot_comparison,
    save_figure,
    text_inches,
)
from experiments.probing.routing_figures import ROUTING_KINDS, routing_comparison_figure
from mesh_model.probe_names import scheme_color, variant_index
from results.rows.aggregate import Results, Row
from results.rows.paper import PaperRow
from results.verdicts.ranking import ranked_rows


def _marker_styles(rows: Sequence[Row]) -> dict[str, int]:
    """row label -> k: the row is the k-th of its scheme (its marker / line style in the figures)."""
    return dict(zip((r.label for r in rows), variant_index(r.scheme for r in rows), strict=True))


def _with_n(row: Row, metric: str) -> str:
    """A row's label with its number of seeds in ``metric``, as its tick or legend entry reads."""
    return f"{row.label} (n={row.stats[metric].n})"


def ranking_figure(results: Results) -> Any | None:
    """One panel per block: its rows from best to worst mean PPL, top down; each seed a dot and the
    mean a bar across it, in the scheme's colour. None when no row has the PPL."""
    metric = results.ppl_metric
    panels = []
    for block in results.blocks:
        if rows := ranked_rows(results, block):  # the order of report.md's ranking
            panels.append((block.name, rows))
    if not panels:
        return None
    longest = max(len(rows) for _, rows in panels)
    # each panel as wide as its row labels need (beside a 4-inch plot): cut to fit, they named no row
    widths = [text_inches((_with_n(r, metric) for r in rows), 8) for _, rows in panels]
    fig, axes = figure(0.5 + sum(max(2.0, width) + 4.0 for width in widths), 1.3 + 0.38 * longest, ncols=len(panels))
    for ax, (name, rows) in zip(axes, panels, strict=True):
        for y, row in enumerate(rows):
            stat, color = row.stats[metric], scheme_color(row.scheme)
            ax.plot(stat.values, [y] * stat.n, "o", color=color, alpha=0.75, markersize=5, linestyle="none")
            ax.plot([stat.mean, stat.mean], [y - 0.32, y + 0.32], color=color, linewidth=2.5, label=row.label)
        ax.set_yticks(range(len(rows)), [_with_n(r, metric) for r in rows], fontsize=8)
        ax.set_ylim(len(rows) - 0.5, -0.5)  # the best row on top
        ax.set_xlabel(f"{results.metric_label} (dots: seeds, bar: mean)")
        ax.set_title(name)
        ax.grid(axis="x", alpha=0.3)
    return fig


def plot_ranking(results: Results, out_dir: str | Path, stem: str = "ranking") -> list[Path]:
    """:func:`ranking_figure`, saved."""
    fig = ranking_figure(results)
    return [] if fig is None else save_figure(fig, out_dir, stem)


def shares_spread(results: Results) -> bool:
    """Whether PPL against parameters says more than the ranking: more than one block, or rows at
    three or more non-embedding parameter shares (to the whole percent). A grid of schemes has two
    (the main job's: vanilla at 100%, the looped rows at 66.7%, MeSH's routers at 67.3%), and its
    PPL-vs-parameters figure is two columns of points."""
    shares = {round(r.stats["params_pct_of_vanilla"].mean) for r in results.rows if "params_pct_of_vanilla" in r.stats}
    return len(results.blocks) > 1 or len(shares) >= 3


def ppl_vs_params_figure(results: Results) -> Any | None:
    """One panel per preset: x the non-embedding parameters in % of vanilla, y the key PPL, error bars
    the sample std over seeds; each row a point in its scheme's colour (the k-th row of a scheme
    with the k-th marker), named in the panel's legend beside it, so that no label covers another.
    None when no row has both numbers."""
    metric = results.ppl_metric
    by_preset: dict[str, list[Row]] = {}
    for row in results.rows:
        if metric in row.stats and "params_pct_of_vanilla" in row.stats:
            by_preset.setdefault(row.preset, []).append(row)
    if not by_preset:
        return None
    # each panel 8 inches, or more where its legend (beside it) needs more than 3.5 of them
    legend = [legend_inches((_with_n(r, metric) for r in rows), 7) for rows in by_preset.values()]
    fig, axes = figure(0.5 + sum(max(8.0, 4.5 + width) for width in legend), 4.2, ncols=len(by_preset))
    for ax, (preset, rows) in zip(axes, by_preset.items(), strict=True):
        variants = _marker_styles(rows)
        for row in rows:
            stat = row.stats[metric]
            ax.errorbar(
                row.stats["params_pct_of_vanilla"].mean,
                stat.mean,
                yerr=stat.std or 0.0,
                fmt=MARKERS[variants[row.label] % len(MARKERS)],
                color=scheme_color(row.scheme),
                capsize=3,
                label=_with_n(row, metric),
            )
        ax.set_xlabel("non-embedding parameters (% of vanilla)")
        ax.set_ylabel(results.metric_label)
        ax.set_title(preset)
        ax.grid(alpha=0.3)
        ax.margins(x=0.15, y=0.12)
        ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.02, 1.0), borderaxespad=0.0)
    return fig


def plot_ppl_vs_params(results: Results, out_dir: str | Path, stem: str = "ppl_vs_params") -> list[Path]:
    """:func:`ppl_vs_params_figure`, saved."""
    fig = ppl_vs_params_figure(results)
    return [] if fig is None else save_figure(fig, out_dir, stem)


def _slots(row: Row) -> int | None:
    try:
        return int(float(row.buffer_slots))
    except ValueError:
        return None


def plot_buffer_slots(
    results: Results, out_dir: str | Path, paper: Sequence[PaperRow] = (), stem: str = "buffer_slots"
) -> list[Path]:
    """PPL against B for MeSH rows of the same preset, layout and other settings, when at least two
    B were run, in MeSH's colour (a marker and line style per series); error bars are the sample
    std over seeds. The paper's B ablation is drawn dashed
    where its preset and layout match."""
    metric = results.ppl_metric
    series: dict[tuple[str, str, str], list[Row]] = {}
    for row in results.rows:
        if row.scheme == "mesh" and _slots(row) is not None and metric in row.stats:
            series.setdefault((row.preset, row.layout, row.overrides), []).append(row)
    series = {k: sorted(v, key=lambda r: _slots(r) or 0) for k, v in series.items() if len({_slots(r) for r in v}) >= 2}
    if not series:
        return []
    fig, (ax,) = figure(5.5, 4.0)
    for k, ((preset, layout, overrides), rows) in enumerate(series.items()):
        label = " ".join(filter(None, [preset, layout, overrides]))
        ax.errorbar(
            [_slots(r) for r in rows],
            [r.stats[metric].mean for r in rows],
            yerr=[r.stats[metric].std or 0.0 for r in rows],
            marker=MARKERS[k % len(MARKERS)],
            linestyle=LINE_STYLES[k % len(LINE_STYLES)],
            color=scheme_color("mesh"),
            capsize=3,
            label=f"{label} (n={'/'.join(str(r.stats[metric].n) for r in rows)})",
        )
        reference = sorted(
            (p for p in paper if (p.preset, p.layout, p.scheme) == (preset, layout, "mesh") and p.buffer_slots),
            key=lambda p: p.buffer_slots or 0,
        )
        if reference and metric.endswith("ppl") and all("ppl" in p.values for p in reference):
            ax.plot(
                [p.buffer_slots for p in reference],
                [p.values["ppl"].value for p in reference],
                "--",
                marker="s",
                color="black",
                label=f"paper ({preset} {layout})",
            )
    from matplotlib.ticker import MaxNLocator

    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.set_xlabel("buffer slots B")
    ax.set_ylabel(results.metric_label)
    ax.set_title("MeSH: PPL vs B")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7)
    return save_figure(fig, out_dir, stem)


SMOOTHING_FRACTION = 10  # the rolling window: 1/10 of a run's logged steps


def smoothing_window(points: int) -> int:
    """The training loss's rolling window, in logged steps: 1/:data:`SMOOTHING_FRACTION` of a
    run's logged steps, at least 1 (40 logged steps: 4; 1000: 100)."""
    return max(1, round(points / SMOOTHING_FRACTION))


def smooth_histories(histories: pd.DataFrame) -> tuple[pd.DataFrame, int]:
    """Each run's ``value`` replaced by its trailing rolling mean over :func:`smoothing_window` of
    its logged steps (the first ones over the steps there are), and the largest window used."""
    parts, widest = [], 1
    for _, run in histories.sort_values("step").groupby("run_id", sort=False):
        window = smoothing_window(len(run))
        widest = max(widest, window)
        parts.append(run.assign(value=run["value"].rolling(window, min_periods=1).mean()))
    return pd.concat(parts, ignore_index=True), widest


def train_loss_figure(results: Results, histories: pd.DataFrame) -> Any | None:
    """One panel per block, one curve per row in its scheme's colour (the k-th row of a scheme with
    the k-th line style): ``train/loss`` of each run smoothed (:func:`smooth_histories`), averaged
    over the row's seeds at each logged step, with a ± sample-std band where two or more seeds
    logged the step. None when nothing was logged."""
    if histories.empty:
        return None
    histories, window = smooth_histories(histories)
    blocks = [b for b in results.blocks if any(histories["run_id"].isin(r.run_ids).any() for r in b.rows)]
    if not blocks:
        return None
    fig, axes = figure(0.5 + 5.5 * len(blocks), 4.0, ncols=len(blocks))
    for ax, block in zip(axes, blocks, strict=True):
        variants = _marker_styles(block.rows)
        for row in block.rows:
            curve = histories[histories["run_id"].isin(row.run_ids)].groupby("step")["value"]
            if not len(curve):
                continue
            mean, std, count = curve.mean(), curve.std(ddof=1), curve.count()
            style = LINE_STYLES[variants[row.label] % len(LINE_STYLES)]
            color = scheme_color(row.scheme)
            ax.plot(mean.index, mean.values, style, color=color, label=f"{row.label} (n={row.n})")
            band = count >= 2
            if band.any():
                ax.fill_between(
                    mean.index[band], (mean - std)[band], (mean + std)[band], color=color, alpha=0.15, linewidth=0
                )
        ax.set_xlabel("step")
        ax.set_ylabel("training loss" + (f" (rolling mean, {window} logged steps)" if window > 1 else ""))
        ax.set_title(block.name)
        ax.grid(alpha=0.3)
    legends(fig, axes)
    return fig


def plot_train_loss(
    results: Results, histories: pd.DataFrame, out_dir: str | Path, stem: str = "train_loss"
) -> list[Path]:
    """:func:`train_loss_figure`, saved."""
    fig = train_loss_figure(results, histories)
    return [] if fig is None else save_figure(fig, out_dir, stem)


def _x_axis(frame: pd.DataFrame) -> tuple[str, str]:
    """(column, label) of the x axis: tokens seen when every point has them, else the step."""
    if len(frame) and frame["tokens"].notna().all():
        return "tokens", "tokens seen"
    return "step", "step"


def _token_ticks(ax: Any, x: str) -> None:
    from matplotlib.ticker import EngFormatter

    if x == "tokens":
        ax.xaxis.set_major_formatter(EngFormatter())  # 20k, 1.6M


# A 95% t band on 2 seeds is +-12.7 standard errors: it washed over the whole plot, so bands start at 3 seeds
# and a row with fewer says so in the legend.
MIN_BAND_N = 3
BAND_MARGIN = 1.25  # the validation curves' y axis: the means' range, widened by this factor each way


def validation_curves_figure(results: Results, curves: pd.DataFrame, block: str) -> Any | None:
    """One panel per validation set of ``block``: each row's validation PPL over training, mean over
    its seeds with the 95% t band (where n >= :data:`MIN_BAND_N`; the legend says where there is none), in its scheme's colour (the k-th row of a scheme
    with the k-th line style), log y. The y axis spans the means (x/÷ :data:`BAND_MARGIN`) and the
    bands are cut at its ends: with two seeds the t band is ±12.7 standard errors, often below 0,
    which on a log axis would stretch it to 0.1 and flatten every curve. None when the block
    logged no validation PPL."""
    from results.stats.bands import row_bands

    rows = next((b.rows for b in results.blocks if b.name == block), [])
    panels = [(s, row_bands(curves[curves["block"] == block], f"val/{s}/ppl")) for s in results.sets]
    panels = [(s, bands) for s, bands in panels if len(bands)]
    if not rows or not panels:
        return None
    fig, axes = figure(0.5 + 5.5 * len(panels), 4.0, ncols=len(panels))
    variants = _marker_styles(rows)
    x, x_label = _x_axis(curves[curves["block"] == block])
    for ax, (name, bands) in zip(axes, panels, strict=True):
        drawn = bands[bands["row"].isin([r.label for r in rows])]["mean"]
        bottom, top = drawn.min() / BAND_MARGIN, drawn.max() * BAND_MARGIN
        for row in rows:
            curve = bands[bands["row"] == row.label].sort_values("step")
            if not len(curve):
                continue
            color = scheme_color(row.scheme)
            style = LINE_STYLES[variants[row.label] % len(LINE_STYLES)]
            n = int(curve["n"].max())
            said = f"n={n}" if n >= MIN_BAND_N or n < 2 else f"n={n}, no band under {MIN_BAND_N} seeds"
            ax.plot(curve[x], curve["mean"], style, color=color, marker=".", label=f"{row.label} ({said})")
            band = curve["low"].notna() & (curve["n"] >= MIN_BAND_N)
            if band.any():
                low, high = curve["low"][band].clip(lower=bottom), curve["high"][band].clip(upper=top)
                ax.fill_between(curve[x][band], low, high, color=color, alpha=0.15, linewidth=0)
        ax.set_yscale("log")
        ax.set_ylim(bottom, top)
        _token_ticks(ax, x)
        ax.set_xlabel(x_label)
        ax.set_ylabel(f"validation PPL ({name})")
        ax.set_title(block)
        ax.grid(alpha=0.3, which="both")
    legends(fig, axes)
    return fig


def plot_validation_curves(results: Results, curves: pd.DataFrame, out_dir: str | Path) -> dict[str, list[Path]]:
    """:func:`validation_curves_figure` of every block, saved as ``val_ppl_<block>``: block -> paths."""
    figures = {}
    for block in results.blocks:
        fig = validation_curves_figure(results, curves, block.name)
        if fig is not None:
            figures[block.name] = save_figure(fig, out_dir, f"val_ppl_{slug(block.name)}")
    return figures


def claim_delta_figure(deltas: pd.DataFrame, claim: str) -> Any | None:
    """One panel per block and validation set of ``claim``: each comparison's Δ in validation loss
    (log PPL; claimed row - other) over training with its 95% CI, in the other row's scheme colour,
    and the zero line. None when the claim has no comparison over training."""
    own = deltas[deltas["claim"] == claim]
    if own.empty:
        return None
    panels = list(own.groupby(["block", "metric"], sort=False))
    fig, axes = figure(0.5 + 5.5 * len(panels), 4.0, ncols=len(panels))
    x, x_label = _x_axis(own)
    for ax, ((block, metric), panel) in zip(axes, panels, strict=True):
        for k, ((row, other, scheme), curve) in enumerate(panel.groupby(["row", "other", "other_scheme"], sort=False)):
            curve = curve.sort_values("step")
            color = scheme_color(scheme)
            style = LINE_STYLES[k % len(LINE_STYLES)]
            ax.plot(curve[x], curve["diff"], style, color=color, marker=".", label=f"{row} − {other}")
            band = curve["low"].notna()
            if band.any():
                ax.fill_between(
                    curve[x][band], curve["low"][band], curve["high"][band], color=color, alpha=0.15, linewidth=0
                )
        ax.axhline(0.0, color="black", linewidth=0.8)
        _token_ticks(ax, x)
        ax.set_xlabel(x_label)
        ax.set_ylabel(f"Δ {metric} (log PPL)")
        ax.set_title(f"{claim}: {block}", fontsize=9)
        ax.grid(alpha=0.3)
    legends(fig, axes)
    return fig


def plot_claim_deltas(deltas: pd.DataFrame, claims: Sequence[str], out_dir: str | Path) -> dict[str, list[Path]]:
    """:func:`claim_delta_figure` of each claim id, saved as ``delta_<claim>``: claim -> paths."""
    figures = {}
    for claim in claims:
        fig = claim_delta_figure(deltas, claim)
        if fig is not None:
            figures[claim] = save_figure(fig, out_dir, f"delta_{claim}")
    return figures


def slug(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9.+-]+", "_", text).strip("_")


ROUTING_SUMMARIES = ("mean", "loop_mean", "chance")  # probe/moe_<kind>/<summary>: not a router call


def routing_series(row: Row) -> dict[str, dict[str, tuple[float, float | None]]]:
    """A MoE row's routing metrics (experiments.probing.routing) as
    :func:`~experiments.probing.routing_figures.routing_comparison_figure` takes them: ``load_cv`` and
    ``entropy`` per router call, ``jaccard`` per pair of iterations, each (mean, std) over seeds;
    empty for a dense row."""
    series: dict[str, dict[str, tuple[float, float | None]]] = {}
    for metric, stat in row.stats.items():
        for kind in ROUTING_KINDS:
            name = metric.removeprefix(f"probe/moe_{kind}/")
            if name != metric and name not in ROUTING_SUMMARIES:
                series.setdefault(kind, {})[name] = (stat.mean, stat.std)
    return series


def _chance(rows: Sequence[Row]) -> float | None:
    """The rows' chance Jaccard when they share one (same E and k), else None."""
    values = {
        round(r.stats["probe/moe_jaccard/chance"].mean, 12) for r in rows if "probe/moe_jaccard/chance" in r.stats
    }
    return values.pop() if len(values) == 1 else None


def plot_probes(results: Results, reports: Mapping[str, Any], out_dir: str | Path) -> dict[str, dict[str, list[Path]]]:
    """For each block with probe reports: the probe figures of its rows side by side (updates, RBF
    and linear CKA, spectra), each row drawn from the report of its first seed that has one
    (in the block's order, each in its scheme's colour). A block with mixture-of-experts rows also
    gets ``routing``: their expert load CV and router entropy per router call and the Jaccard
    overlap between loop iterations, mean ± std over seeds (from the logged metrics).
    Returns block name -> figure -> paths."""
    figures = {}
    for block in results.blocks:
        chosen, schemes = {}, {}
        for row in block.rows:
            run_id = next((r for r in row.run_ids if r in reports), None)
            if run_id is not None:
                chosen[row.label], schemes[row.label] = reports[run_id], row.scheme
        folder = Path(out_dir) / slug(block.name)
        if chosen:
            figures[block.name] = plot_comparison(chosen, folder, schemes=schemes)
        routed = [row for row in block.rows if routing_series(row)]
        if routed:
            fig = routing_comparison_figure(
                {row.label: routing_series(row) for row in routed},
                {row.label: row.scheme for row in routed},
                _chance(routed),
            )
            fig.suptitle("mixture-of-experts routing (mean ± std over seeds)")
            figures.setdefault(block.name, {})["routing"] = save_figure(fig, folder, "probe_compare_routing")
    return figures


def probe_seeds(results: Results, reports: Mapping[str, Any]) -> dict[str, str]:
    """row label -> the seed whose probe report :func:`plot_probes` draws."""
    seeds = {}
    for row in results.rows:
        for run_id, seed in zip(row.run_ids, row.seeds, strict=True):
            if run_id in reports:
                seeds[row.label] = seed
                break
    return seeds


__all__ = [
    "claim_delta_figure",
    "plot_buffer_slots",
    "plot_claim_deltas",
    "plot_ppl_vs_params",
    "plot_probes",
    "plot_train_loss",
    "plot_validation_curves",
    "ppl_vs_params_figure",
    "probe_seeds",
    "routing_series",
    "train_loss_figure",
    "validation_curves_figure",
]
