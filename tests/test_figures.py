"""The report's figures read back from their matplotlib artists: one colour per scheme everywhere,
no label over another, readable grids of probe panels on the data's colour scale, and no value for a
block a layout does not have."""

from __future__ import annotations

import itertools

import pandas as pd
import pytest
import torch
from matplotlib.colors import to_hex

from experiments.probing.figures import (
    PANELS_PER_ROW,
    cka_comparison_figure,
    colour_range,
    spectra_comparison_figure,
    updates_figure,
)
from mesh_model.probe_names import FALLBACK_COLORS, SCHEME_COLORS, scheme_color
from mesh_model.probes import ESTIMATORS, ProbeReport
from mesh_model.scheme_names import PAPER_SCHEMES
from results.render.plots import (
    plot_probes,
    ppl_vs_params_figure,
    ranking_figure,
    shares_spread,
    smooth_histories,
    train_loss_figure,
)
from results.rows.aggregate import Block, Results, Row, Stat

KNOWN = PAPER_SCHEMES
SEEDS = ("0", "1")


def _row(scheme: str, layout: str, ppl: tuple[float, float], pct: float, slots: str = "") -> Row:
    stats = {
        "val/pile/ppl": Stat(ppl, SEEDS),
        "params_pct_of_vanilla": Stat((pct, pct), SEEDS),
    }
    run_ids = [f"{scheme}-{layout}-{slots}-{s}" for s in SEEDS]
    return Row("pythia-410m", scheme, layout, slots, "", run_ids, list(SEEDS), stats)


def _block() -> list[Row]:
    """A block like the paper's, residual and anchor at nearly the same PPL and parameters (their
    points coincide), two MeSH rows."""
    return [
        _row("vanilla", "16", (9.05, 9.07), 100.0),
        _row("base", "4+8R2+4", (9.30, 9.31), 66.67),
        _row("residual", "4+8R2+4", (9.190, 9.200), 66.67),
        _row("anchor", "4+8R2+4", (9.191, 9.201), 66.67),
        _row("mesh", "4+8R2+4", (9.02, 9.04), 66.68, slots="5"),
        _row("mesh", "4+8R2+4", (9.10, 9.12), 66.68, slots="4"),
    ]


def _results(rows: list[Row]) -> Results:
    return Results([Block("pythia-410m", 16, rows)], pd.DataFrame(), ["pile"], "val_loss", "val/pile/ppl", True, [])


def _report(loops: int | None, low: float, seed: int = 0) -> ProbeReport:
    """A report of a vanilla (``loops`` None) or looped layout whose CKA values span [low, 1]."""
    torch.manual_seed(seed)
    stages = ["embedding", "prelude", "coda"] if loops is None else ["embedding", *(f"h{t}" for t in range(loops + 1))]
    if loops is not None:
        stages.append("coda")
    n = len(stages)
    values = low + (1 - low) * torch.rand(n, n, dtype=torch.float64)
    matrix = (values + values.T) / 2
    matrix.fill_diagonal_(1.0)
    matrix[0, -1] = matrix[-1, 0] = low
    blocks = ["prelude", "coda"] if loops is None else ["prelude", *(f"core{t}" for t in range(1, loops + 1)), "coda"]
    updates = {b: (0.1 + 0.1 * i, 0.01) for i, b in enumerate(blocks)}
    if loops is None:
        updates["coda"] = (0.0, 0.0)  # a vanilla layout's empty coda
    state = {f"core{t}": (0.2, 0.02) for t in range(1, (loops or 0) + 1)}
    return ProbeReport(
        stages=stages,
        updates=updates,
        state_updates=state,
        cka_matrices={e: matrix - (0.5 if "debiased" in e else 0.0) for e in ESTIMATORS},
        cka_floors={e: 0.5 for e in ESTIMATORS},
        spectra={s: torch.linspace(1.0, 0.01, 8, dtype=torch.float64) for s in stages},
        effective_ranks={s: 4.0 for s in stages},
        samples=2,
        top=8,
        loops=loops,
    )


# ---------------------------------------------------------------- one colour per scheme


def test_every_known_scheme_has_its_own_fixed_colour_and_unknown_names_a_stable_one():
    assert {s: scheme_color(s) for s in KNOWN} == {s: SCHEME_COLORS[s] for s in KNOWN}
    assert len({scheme_color(s) for s in KNOWN}) == len(KNOWN)
    assert scheme_color("anchor*") == scheme_color("anchor_emb")  # an alias is its scheme
    assert scheme_color("anchor+residual") == scheme_color("residual+anchor")  # one canonical sum
    for name in ("foo", "0.5*anchor+anchor_emb", "my_scheme"):
        assert scheme_color(name) == scheme_color(name) and scheme_color(name) in FALLBACK_COLORS
    assert not set(FALLBACK_COLORS) & set(SCHEME_COLORS.values())


def _artist_colours(ax) -> dict[str, str]:
    """legend label -> the hex colour of its line, marker or bar."""
    handles, labels = ax.get_legend_handles_labels()
    colours = {}
    for handle, label in zip(handles, labels, strict=True):
        artist = handle[0] if isinstance(handle, tuple) else handle  # an errorbar container: its line
        if hasattr(artist, "patches"):  # a bar container
            artist = artist.patches[0]
        getter = getattr(artist, "get_color", None) or artist.get_facecolor
        colours[label] = to_hex(getter())
    return colours


def test_a_scheme_has_the_same_colour_in_the_loss_ppl_and_probe_figures():
    rows = _block()
    results = _results(rows)
    histories = pd.DataFrame(
        [{"run_id": r, "step": s, "value": 8.0 - s / 100} for row in rows for r in row.run_ids for s in (10, 20)]
    )
    loss = _artist_colours(train_loss_figure(results, histories).axes[0])
    ppl = _artist_colours(ppl_vs_params_figure(results).axes[0])
    probes = _artist_colours(
        updates_figure(
            {row.label: _report(None if row.scheme == "vanilla" else 2, 0.6) for row in rows},
            {row.label: row.scheme for row in rows},
        ).axes[0]
    )
    for row in rows:
        expected = scheme_color(row.scheme)
        assert loss[f"{row.label} (n=2)"] == ppl[f"{row.label} (n=2)"] == probes[row.label] == expected, row.label
    # the probe figures of the report get the rows' schemes (labels alone would do here too)
    assert probes["mesh 4+8R2+4 B5"] == probes["mesh 4+8R2+4 B4"] == SCHEME_COLORS["mesh"]


def test_plot_probes_passes_each_rows_scheme(tmp_path, monkeypatch):
    import results.render.plots as plots

    seen = {}
    monkeypatch.setattr(plots, "plot_comparison", lambda reports, out, schemes: seen.update(schemes) or {})
    rows = [_row("vanilla", "16", (9.0, 9.1), 100.0), _row("anchor+anchor_emb", "4+8R2+4", (9.0, 9.1), 66.7)]
    plot_probes(_results(rows), {row.run_ids[0]: _report(None, 0.6) for row in rows}, tmp_path)
    assert seen == {"vanilla 16": "vanilla", "anchor+anchor_emb 4+8R2+4": "anchor+anchor_emb"}


# ---------------------------------------------------------------- no label over another


def _overlap(a, b) -> bool:
    return a.x0 < b.x1 and b.x0 < a.x1 and a.y0 < b.y1 and b.y0 < a.y1


def test_no_two_labels_of_ppl_vs_params_overlap():
    rows = _block()
    fig = ppl_vs_params_figure(_results(rows))
    fig.canvas.draw()
    renderer = fig.canvas.get_renderer()
    ax = fig.axes[0]
    # the texts that name rows (legend entries and any annotation), the title and the axis labels
    texts = [*ax.get_legend().get_texts(), *ax.texts, ax.title, ax.xaxis.label, ax.yaxis.label]
    boxes = [(t.get_text(), t.get_window_extent(renderer)) for t in texts if t.get_visible() and t.get_text()]
    labels = {text for text, _ in boxes}
    assert {f"{r.label} (n=2)" for r in rows} <= labels  # every row is named
    for (ta, a), (tb, b) in itertools.combinations(boxes, 2):
        assert not _overlap(a, b), (ta, tb)


# ---------------------------------------------------------------- probe panels


def test_cka_comparison_of_six_rows_is_a_grid_on_the_datas_colour_scale():
    reports = {f"row{i}": _report(2 if i else None, 0.67 + 0.01 * i, seed=i) for i in range(6)}
    fig = cka_comparison_figure(reports, "rbf")
    images = [ax.images[0] for sub in fig.subfigs for ax in sub.axes if ax.images]
    assert len(images) == 12  # biased and debiased, six reports each
    for sub, estimator in zip(fig.subfigs, ("rbf", "rbf_debiased"), strict=True):
        heatmaps = [ax for ax in sub.axes if ax.images]
        rows = {round(ax.get_position().y0, 3) for ax in heatmaps}
        assert len(heatmaps) == 6 and len(rows) == 2  # two rows of three
        assert all(sum(round(ax.get_position().y0, 3) == y for ax in heatmaps) <= PANELS_PER_ROW for y in rows)
        drawn = [ax.images[0].get_array() for ax in heatmaps]  # the values the panels show
        low, high = min(a.min() for a in drawn), max(a.max() for a in drawn)
        shift = 0.0 if estimator == "rbf" else 0.5
        assert high == 1.0 - shift and 0.67 - shift <= low <= 0.68 - shift  # the data's span, not 0..1
        assert colour_range(reports.values(), estimator) == (low, high)
        for ax in heatmaps:
            assert ax.images[0].get_clim() == pytest.approx((low, high))
        assert len(sub.axes) == 7  # six heatmaps and their one colorbar
    width, height = fig.get_size_inches()
    assert width < 2 * height  # no strip


def test_spectra_comparison_has_at_most_three_panels_a_row():
    fig = spectra_comparison_figure({f"row{i}": _report(2, 0.7, seed=i) for i in range(5)})
    ys = [round(ax.get_position().y0, 3) for ax in fig.axes]
    assert len(fig.axes) == 5 and max(ys.count(y) for y in set(ys)) == PANELS_PER_ROW and len(set(ys)) == 2


def test_a_vanilla_update_is_one_stack_and_shows_no_coda():
    fig = updates_figure({"vanilla 16": _report(None, 0.6), "base 4+8R2+4": _report(2, 0.6)})
    own = fig.axes[0]
    assert [t.get_text() for t in own.get_xticklabels()] == ["stack", "prelude", "core1", "core2", "coda"]
    from matplotlib.container import BarContainer

    vanilla_bars = next(c for c in own.containers if isinstance(c, BarContainer))
    assert len(vanilla_bars.patches) == 1 and vanilla_bars.patches[0].get_height() == pytest.approx(0.1)
    assert vanilla_bars.patches[0].get_x() + vanilla_bars.patches[0].get_width() / 2 < 0.5  # at "stack"


def test_a_vanilla_state_is_one_stack_in_the_cka_and_spectra_panels():
    reports = {"vanilla 16": _report(None, 0.6), "base 4+8R2+4": _report(2, 0.6)}
    vanilla, base = cka_comparison_figure(reports).subfigs[0].axes[:2]
    assert [t.get_text() for t in vanilla.get_xticklabels()] == ["embedding", "stack"]  # no empty coda
    assert vanilla.images[0].get_array().shape == (2, 2)
    assert [t.get_text() for t in base.get_xticklabels()] == ["embedding", "h0", "h1", "h2", "coda"]
    spectra = spectra_comparison_figure(reports).axes
    assert spectra[0].get_legend_handles_labels()[1] == ["embedding", "stack"]


def test_validation_curves_are_drawn_in_the_schemes_colours_with_the_t_band_on_log_y():
    from scipy import stats as scipy_stats

    from results.render.plots import validation_curves_figure

    rows = _block()
    results = _results(rows)
    block = results.blocks[0].name
    records = []
    for k, row in enumerate(rows):
        runs = [*zip(row.run_ids, row.seeds, strict=True), (f"{row.run_ids[0]}-third", "s2")]  # 3 seeds: a band
        for i, (run_id, seed) in enumerate(runs):
            for step in (10, 20, 30):
                value = 30.0 - step / 5 + k + 0.5 * i
                records.append((run_id, row.label, row.scheme, seed, block, step, step * 100, "val/pile/ppl", value))
    curves = pd.DataFrame.from_records(
        records, columns=["run_id", "row", "scheme", "seed", "block", "step", "tokens", "metric", "value"]
    )
    (ax,) = validation_curves_figure(results, curves, block).axes
    assert ax.get_yscale() == "log" and ax.get_xlabel() == "tokens seen"
    colours = _artist_colours(ax)
    for row in rows:
        assert colours[f"{row.label} (n=3)"] == scheme_color(row.scheme), row.label
    # the first row's band at its first step is the 95% t interval of its three seeds
    (band, *_) = ax.collections
    values = [30.0 - 2.0, 30.0 - 2.0 + 0.5, 30.0 - 2.0 + 1.0]
    low, high = scipy_stats.t.interval(0.95, 2, loc=sum(values) / 3, scale=scipy_stats.sem(values))
    ys = [y for x, y in band.get_paths()[0].vertices if x == 1000]  # step 10: 1000 tokens
    assert min(ys) == pytest.approx(low) and max(ys) == pytest.approx(high)


def test_validation_axis_spans_the_means_and_draws_no_band_at_two_seeds():
    from results.render.plots import BAND_MARGIN, validation_curves_figure

    rows = [_row("base", "1+2R2+1", (97.0, 98.0), 66.67), _row("mesh", "1+2R2+1", (83.0, 86.0), 66.7)]
    results = _results(rows)
    block = results.blocks[0].name
    first = {"base": (300.0, 340.0), "mesh": (250.0, 330.0)}  # t band of mesh's: 290 ± 508, below 0
    records = [
        (run_id, row.label, row.scheme, seed, block, step, step * 100, "val/pile/ppl", value)
        for row in rows
        for i, (run_id, seed) in enumerate(zip(row.run_ids, row.seeds, strict=True))
        for step, value in ((10, first[row.scheme][i]), (20, row.stats["val/pile/ppl"].values[i]))
    ]
    curves = pd.DataFrame.from_records(
        records, columns=["run_id", "row", "scheme", "seed", "block", "step", "tokens", "metric", "value"]
    )
    (ax,) = validation_curves_figure(results, curves, block).axes
    assert ax.get_ylim() == pytest.approx((84.5 / BAND_MARGIN, 320.0 * BAND_MARGIN))
    # at n = 2 the t band (±12.7 standard errors) would wash over the plot: none is drawn, and the legend says so
    assert not ax.collections
    labels = ax.get_legend_handles_labels()[1]
    assert labels == [f"{row.label} (n=2, no band under 3 seeds)" for row in rows]


# ---------------------------------------------------------------- the ranking, parameter shares, smoothing


def test_ranking_sorts_rows_by_mean_and_draws_each_seed_in_its_schemes_colour():
    rows = [
        _row("vanilla", "6", (60.0, 62.0), 100.0),
        _row("base", "1+2R2+1", (70.0, 71.0), 66.67),
        _row("mesh", "1+2R2+1", (55.0, 57.0), 66.7),
        _row("anchor_emb", "1+2R2+1", (58.5, 54.5), 66.67),  # mean 56.5: between mesh (56) and vanilla (61)
    ]
    (ax,) = ranking_figure(_results(rows)).axes
    order = [t.get_text() for t in ax.get_yticklabels()]
    assert order == ["mesh 1+2R2+1 (n=2)", "anchor_emb 1+2R2+1 (n=2)", "vanilla 6 (n=2)", "base 1+2R2+1 (n=2)"]
    bottom, top = ax.get_ylim()
    assert top < bottom  # the first (best) row is drawn on top
    by_row = {}
    for line in ax.get_lines():
        y = round(float(line.get_ydata().mean()))
        by_row.setdefault(y, []).append(line)
    for y, label in enumerate(order):
        dots, bar = by_row[y]
        scheme = label.split()[0]
        assert to_hex(dots.get_color()) == to_hex(bar.get_color()) == scheme_color(scheme)
        row = next(r for r in rows if r.scheme == scheme)
        assert sorted(dots.get_xdata()) == sorted(row.stats["val/pile/ppl"].values)  # each seed a dot
        assert list(bar.get_xdata()) == [row.stats["val/pile/ppl"].mean] * 2  # the mean a bar


def test_ppl_vs_params_only_where_shares_spread():
    schemes = [
        _row("vanilla", "6", (60.0, 62.0), 100.0),
        *(_row(s, "1+2R2+1", (57.0, 58.0), 66.67) for s in KNOWN[1:6]),
    ]
    schemes.append(_row("mesh", "1+2R2+1", (55.0, 56.0), 67.33))  # MeSH's routers, as in the main job
    assert not shares_spread(_results(schemes))
    assert shares_spread(_results([*schemes, _row("base", "1+2R4+1", (57.0, 58.0), 80.0)]))
    two_blocks = _results(schemes)
    two_blocks.blocks.append(Block("tiny", 6, schemes[:2]))
    assert shares_spread(two_blocks)


def test_training_loss_is_each_runs_rolling_mean_over_a_tenth_of_its_steps():
    steps = range(0, 400, 10)  # 40 logged steps: a window of 4
    noisy = [4.0 + (0.5 if i % 2 else -0.5) for i, _ in enumerate(steps)]
    histories = pd.DataFrame(
        [{"run_id": run, "step": s, "value": v} for run in ("a", "b") for s, v in zip(steps, noisy, strict=True)]
    )
    smoothed, window = smooth_histories(histories.sample(frac=1.0, random_state=0))  # any order in
    assert window == 4
    a = smoothed[smoothed.run_id == "a"].set_index("step")["value"]
    assert list(a.iloc[:3]) == pytest.approx([3.5, 4.0, 3.5 + 1 / 3])  # the first over the steps there are
    assert list(a.iloc[3:]) == pytest.approx([4.0] * 37)  # the alternation averaged out
    rows = [_row("base", "1+2R2+1", (57.0, 58.0), 66.67)]
    rows[0].run_ids[:] = ["a", "b"]
    (ax,) = train_loss_figure(_results(rows), histories).axes
    (curve,) = ax.get_lines()
    assert list(curve.get_ydata()[3:]) == pytest.approx([4.0] * 37)
    assert "rolling mean, 4 logged steps" in ax.get_ylabel()


def test_routing_rows_with_the_same_curve_share_one_labelled_line_instead_of_entries_on_top_of_each_other():
    from results.render.routing import coefficients_figure

    coef = "routing/coef/coda/f2/mean"
    rows = []
    for scheme, value in (("base", 1.0), ("residual", 1.0), ("anchor", 1.0), ("mesh", 0.4)):
        row = _row(scheme, "1+2R2+1", (9.0, 9.1), 66.67, slots="5" if scheme == "mesh" else "")
        row.stats[coef] = Stat((value, value), SEEDS)
        rows.append(row)
    records = [
        (run_id, row.label, row.scheme, seed, step, step * 100, coef, 1.0 if row.scheme != "mesh" else 0.4 + step / 100)
        for row in rows
        for run_id, seed in zip(row.run_ids, row.seeds, strict=True)
        for step in (10, 20)
    ]
    frame = pd.DataFrame.from_records(
        records, columns=["run_id", "row", "scheme", "seed", "step", "tokens", "metric", "value"]
    )
    (ax,) = coefficients_figure(_results(rows), frame).axes
    labels = ax.get_legend_handles_labels()[1]
    assert labels == [
        "base 1+2R2+1, residual 1+2R2+1, anchor 1+2R2+1 (the same curve)",
        "mesh 1+2R2+1 B5",
    ]
    assert len({line.get_linestyle() for line in ax.get_lines() if line.get_label() in labels}) == 2
    assert ax.get_xlabel() == "tokens seen"  # not the last legend entry's label, which once shadowed it


def _long(row: Row, overrides: str) -> Row:
    """``row`` named as a report names rows whose overrides vary: every one of them in the label."""
    return Row(row.preset, row.scheme, row.layout, row.buffer_slots, overrides, row.run_ids, row.seeds, row.stats)


LONG = "loops.distribution=poisson_lognormal loops.max=6 loops.mean=2.0 model_overrides.loop_rule=cycle"


def _laid_out(fig) -> None:
    """``fig`` drawn (laid out by constrained layout, as saving it does); a layout that gives up is an error."""
    import warnings

    with warnings.catch_warnings():
        warnings.filterwarnings("error", message="constrained_layout not applied")
        fig.canvas.draw()


def test_long_row_labels_go_in_one_legend_below_the_panels_and_no_panel_collapses():
    """The depth report's training-loss figure, before: nine labels of ~100 characters inside a
    5.5-inch panel squeezed it to nothing and constrained layout gave up, cutting the labels off."""
    steps = range(0, 200, 10)
    rows = [_long(_row(s, "1+2R2+1", (57.0, 58.0), 66.67), LONG) for s in ("base", "anchor", "mesh")]
    histories = pd.DataFrame(
        [{"run_id": r, "step": s, "value": 4.0} for row in rows for r in row.run_ids for s in steps]
    )
    fig = train_loss_figure(_results(rows), histories)
    (ax,) = fig.axes
    assert ax.get_legend() is None and len(fig.legends) == 1
    assert [t.get_text() for t in fig.legends[0].get_texts()] == [f"{r.label} (n=2)" for r in rows]
    from experiments.probing.figures import text_inches

    assert fig.get_size_inches()[0] >= text_inches([f"{rows[2].label} (n=2)"], 7) + 0.6
    _laid_out(fig)
    assert ax.get_position().width * fig.get_size_inches()[0] > 3.0  # the panel keeps its plot
    legend, whole = fig.legends[0].get_window_extent(), fig.bbox
    assert whole.x0 <= legend.x0 and legend.x1 <= whole.x1 and whole.y0 <= legend.y0  # inside the figure
    short = [_row(s, "1+2R2+1", (57.0, 58.0), 66.67) for s in ("base", "mesh")]
    histories = pd.DataFrame(
        [{"run_id": r, "step": s, "value": 4.0} for row in short for r in row.run_ids for s in steps]
    )
    fig = train_loss_figure(_results(short), histories)
    assert fig.axes[0].get_legend() is not None and not fig.legends  # short labels: inside, as before
    assert list(fig.get_size_inches()) == [6.0, 4.0]


def test_the_ranking_is_as_wide_as_its_row_labels_need():
    rows = [_long(_row(s, "1+2R2+1", (57.0 + i, 58.0 + i), 66.67), LONG) for i, s in enumerate(("base", "mesh"))]
    fig = ranking_figure(_results(rows))
    _laid_out(fig)
    (ax,) = fig.axes
    assert ax.get_position().width * fig.get_size_inches()[0] > 3.0  # the panel keeps its plot
    assert list(ranking_figure(_results(_block())).get_size_inches()) == [6.5, 1.3 + 0.38 * 6]  # short: as before


def test_one_label_drawn_otherwise_in_two_panels_keeps_an_entry_for_each_look():
    """Styles are given panel by panel: the same row can be solid in one panel and dashed in another,
    and one legend below both must not name a line by another's look."""
    from experiments.probing.figures import figure, legends

    fig, axes = figure(8.0, 3.0, ncols=2)
    axes[0].plot([0, 1], [0, 1], "-", color="red", label=f"mesh {LONG}")
    axes[1].plot([0, 1], [0, 1], "--", color="red", label=f"mesh {LONG}")
    axes[1].plot([0, 1], [1, 0], "-", color="blue", label=f"base {LONG}")
    legends(fig, axes)
    (legend,) = fig.legends
    drawn = [
        (text.get_text(), line.get_linestyle())
        for text, line in zip(legend.get_texts(), legend.get_lines(), strict=True)
    ]
    assert drawn == [(f"mesh {LONG}", "-"), (f"mesh {LONG}", "--"), (f"base {LONG}", "-")]


def test_saving_a_figure_gives_it_back_cleared_with_its_layout_engine(tmp_path):
    """save_figure lays out once for both formats (the engine off while they are written) and puts
    the engine back, a colorbar's figure included."""
    import matplotlib as mpl

    from experiments.probing.figures import figure, save_figure

    fig, (ax,) = figure(4.0, 3.0)
    engine = fig.get_layout_engine()
    image = ax.imshow([[0.0, 1.0], [1.0, 0.0]])
    fig.colorbar(image, ax=ax)
    paths = save_figure(fig, tmp_path, "with_colorbar")
    assert [p.name for p in paths] == ["with_colorbar.png", "with_colorbar.svg"] and all(
        p.stat().st_size for p in paths
    )
    assert fig.get_layout_engine() is engine and not fig.axes
    fig.colorbar(mpl.cm.ScalarMappable(), ax=fig.subplots())  # the engine takes a colorbar again


def test_a_saved_figure_is_drawn_once_a_format_and_is_what_savefig_with_its_engine_writes(tmp_path, monkeypatch):
    """The layout runs once, at the saved dpi, before both formats: two draws in all, where savefig
    of a figure that keeps its engine draws each format twice (a pass without output to lay it
    out). The files are byte for byte the ones that slower path writes."""
    import matplotlib
    from matplotlib.figure import Figure

    from experiments.probing.figures import SAVED_DPI, figure, save_figure

    def heatmap():
        fig, (ax,) = figure(4.0, 3.0)
        image = ax.imshow([[0.0, 0.5, 1.0], [1.0, 0.25, 0.0], [0.5, 0.5, 0.5]])
        for i, j in itertools.product(range(3), range(3)):
            ax.text(j, i, f"{i + j / 10:.2f}", ha="center", va="center", fontsize=7)
        ax.set_xticks(range(3), ["prelude", "core 1", "coda"], rotation=45, ha="right")
        fig.colorbar(image, ax=ax, shrink=0.8)
        ax.set_title("a title that constrained layout makes room for")
        return fig

    draws = []
    draw = Figure.draw
    monkeypatch.setattr(Figure, "draw", lambda self, renderer: (draws.append(1), draw(self, renderer))[1])
    paths = save_figure(heatmap(), tmp_path / "once", "heatmap")
    assert len(draws) == 2
    draws.clear()
    slow = heatmap()  # as before: the PNG laid out by savefig, its layout kept for the SVG
    (tmp_path / "slow").mkdir()
    with matplotlib.rc_context({"svg.hashsalt": "heatmap"}):
        for path in paths:
            metadata = {"Date": None} if path.suffix != ".png" else None
            slow.savefig(tmp_path / "slow" / path.name, dpi=SAVED_DPI, metadata=metadata)
            slow.set_layout_engine("none")
    assert len(draws) == 4
    for path in paths:
        assert path.read_bytes() == (tmp_path / "slow" / path.name).read_bytes(), path.name


def test_ppl_vs_params_widens_for_a_long_legend_beside_its_panel():
    rows = [_long(row, LONG) for row in _block()]
    fig = ppl_vs_params_figure(_results(rows))
    _laid_out(fig)
    (ax,) = [a for a in fig.axes if a.get_legend() is not None]
    assert ax.get_position().width * fig.get_size_inches()[0] > 3.0  # the panel keeps its plot
    assert fig.get_size_inches()[0] > 8.5  # widened for the legend
    assert list(ppl_vs_params_figure(_results(_block())).get_size_inches()) == [8.5, 4.2]  # short: as before
