"""Where the MLflow UI shows runs: the experiment views (the key-metrics and grouped views kept as
experiment tags), the addresses of a store's runs list and run pages, the ``mlflow ui`` command,
run colours and run notes (descriptions)."""

from __future__ import annotations

import base64
import json
import shlex
import zlib
from collections.abc import Iterable, Mapping, Sequence
from typing import Any
from urllib.parse import quote

from experiments.console import script_command
from mesh_model.probe_names import scheme_color

# The MLflow UI's address when ``mlflow ui`` serves a local store (its default host and port).
LOCAL_UI = "http://127.0.0.1:5000"
WORKFLOW = "workflowType=machine_learning"  # the UI's runs pages, not its GenAI (traces) pages
# MLflow's run note: the run page's "Description", rendered as Markdown.
NOTE_TAG = "mlflow.note.content"
TAG_VALUE_LIMIT = 8000  # MLflow's limit on a tag's value


# The experiment views (see :func:`key_metrics_view`, :func:`grouped_view`): MLflow's UI loads a
# view kept in the experiment tag ``mlflow.sharedViewState.<key>`` when the page's URL carries
# ``viewStateShareKey=<key>``.
KEY_METRICS_VIEW = "mesh-key-metrics"
GROUPED_VIEW = "mesh-grouped"
SHARED_VIEW_TAG = "mlflow.sharedViewState."
VIEW_COMPRESSION = "deflate;"  # the UI's prefix of a compressed tag value (pako's zlib deflate, base64)
MODEL_METRICS_SECTION = "Model metrics"  # the UI's chart section of the metrics without a "/"
SPEED_SECTION = "Speed"
ROUTING_SECTION = "routing"  # how the loop passes state (experiments/probing/state_routing.py)
DEPTH_SECTION, EXIT_SECTION = "depth", "exit"  # a run at other loop counts, and under a per-token exit (docs/depth.md)
SPEED_METRICS = ("train/tokens_per_s",)  # a curve; time/steps_per_s is one value at the end (a column)
# Tokens trained on so far at a logged step (experiments/trainer.py logs it with every curve): the
# grouped view's x axis, no chart of its own.
TOKENS_METRIC = "tokens"
# Metrics that say how a run or a grid was set up, not how runs compare: no chart in the views.
# cells_<status>: a sweep's parent run, one per status of sweeps/cells.py STATUSES.
BOOKKEEPING_METRICS = (
    "epoch",
    TOKENS_METRIC,
    "global_batch",
    "tokens_per_step",
    "tokens_planned",
    "data_train_tokens",
    "flops_per_token",
    *(f"cells_{s}" for s in ("finished", "skipped", "failed", "pruned", "interrupted", "not_started")),
)
# One value per run, logged once (experiments/train.py, experiments/callbacks/timing.py): a column
# of the runs table, not a chart. Others of this kind (the summary probe/* metrics, eval/*) are
# charted out by name once they are in the store (:func:`single_value_metrics`).
SINGLE_VALUE_METRICS = (
    "val_loss",
    "params_total",
    "params_non_embedding",
    "params_router",
    "params_pct_of_vanilla",
    *(
        f"time/{k}"
        for k in (
            "setup_s",
            "steps_s",
            "between_steps_s",
            "validation_s",
            "end_s",
            "total_s",
            "steps_per_s",
            "depth_eval_s",
        )
    ),
)
CURVE_PREFIXES = ("train/", "routing/")  # logged over steps, with val/<set>/ppl and lr
FINAL_STRETCH = 0.25  # the part of training the grouped view's zoomed chart shows (grouped_view)
ANSWER_HEIGHT = 520  # px: the main validation set's charts, two side by side
CARD_HEIGHT = 360  # the UI's default height of a chart
# Only training runs (every one is tagged with its seed; a sweep's parent run is not): the parent,
# a row of dashes, stays out of the list and the charts.
TRAINING_RUNS_FILTER = "tags.seed IS NOT NULL"
ROW_TAG = "row"  # a run's row in the report: its config without the seed (results.publish.parents writes it)
RUN_COLOR_TAG = "mlflow.runColor"  # the run's colour in the UI's charts


def run_color(scheme: str) -> str:
    """A run's colour in the UI: its scheme's in the report's figures, so a scheme's seeds share it."""
    return scheme_color(scheme)


def is_curve(metric: str) -> bool:
    """Whether the views chart ``metric``: a validation perplexity, a training or routing metric, the
    learning rate (values over steps), a depth curve's perplexity (over the loop count) and an exit
    curve's perplexity and loops per token (over its thresholds); not a loss (the log of its
    perplexity) nor an exit threshold itself."""
    if metric.startswith(("val/", f"{DEPTH_SECTION}/")):
        return metric.endswith("/ppl")
    if metric.startswith(f"{EXIT_SECTION}/"):
        return metric.endswith(("/ppl", "/loops_used"))
    return metric == "lr" or metric.startswith(CURVE_PREFIXES)


def depth_curves(metrics: Iterable[str]) -> tuple[list[str], list[str]]:
    """The ``metrics`` the depth and exit sections chart (``mesh-eval --loops/--exit``, a run's
    ``depth_eval``; MLflow step = the loop count, or the threshold's index): each depth curve's PPL,
    the run's own rule first, then each exit criterion's PPL and loops per token."""
    keys = list(dict.fromkeys(metrics))
    depth = sorted(
        (m for m in keys if m.startswith(f"{DEPTH_SECTION}/") and is_curve(m)), key=lambda m: (m.count("/"), m)
    )
    exits = sorted(m for m in keys if m.startswith(f"{EXIT_SECTION}/") and is_curve(m))
    return depth, exits


def single_value_metrics(metrics: Iterable[str]) -> list[str]:
    """The ``metrics`` (keys in a store) the views chart out: every one :func:`is_curve` rejects,
    besides :data:`BOOKKEEPING_METRICS` and :data:`SINGLE_VALUE_METRICS`, in order, each once."""
    listed = {*BOOKKEEPING_METRICS, *SINGLE_VALUE_METRICS}
    return [m for m in dict.fromkeys(metrics) if not is_curve(m) and m not in listed]


def routing_curves(metrics: Iterable[str]) -> list[str]:
    """The ``metrics`` the routing section charts, as the report's routing figures read them
    (results/render/routing.py): the coda input's coefficients (every looped scheme: a fixed one is
    a flat line, base's f_K at 1) and MeSH's router entropies (``routing/<router>/<kind>/entropy``,
    which only MeSH logs), each once, in that order."""
    keys = list(dict.fromkeys(metrics))
    coda = sorted(m for m in keys if m.startswith(f"{ROUTING_SECTION}/coef/coda/") and m.endswith("/mean"))
    entropies = sorted(m for m in keys if m.startswith(f"{ROUTING_SECTION}/") and m.endswith("/entropy"))
    return [*coda, *entropies]


def key_metrics_view(val_sets: Sequence[str], metrics: Iterable[str] = ()) -> dict[str, Any]:
    """The runs page as a grid is read: every training run in one flat list (a sort other than by
    date stops MLflow nesting cells under the sweep's collapsed parent; the parent itself is left
    out, :data:`TRAINING_RUNS_FILTER`), best validation loss first, the validation perplexities,
    losses and the run's coordinates as columns (the UI orders metric columns by name, so no other
    metric goes before the perplexity), all runs in the charts (each in its scheme's
    colour, :data:`RUN_COLOR_TAG`).

    The charts open on the answer: the main validation set's section first, its perplexity over
    steps on a log axis beside a bar chart of each run's final perplexity, two to a row and
    :data:`ANSWER_HEIGHT` high; then the other validation sets, training, routing (the coda input's
    coefficients and MeSH's router entropies, :func:`routing_curves`; the other ``routing/*``
    metrics in sections of their own after these), the depth and exit curves where runs have them
    (:func:`depth_curves`: PPL over the test-time loop count, and over the exit thresholds) and
    speed. A
    metric that is not a curve (:func:`is_curve`: the bookkeeping, the parameter counts, the
    timings, and of ``metrics``, the keys in the store, the probes' summaries (every other probe
    value is in each run's ``probes/final/probes.csv``, not a metric) and the validation losses)
    has a deleted chart, so the UI draws none.

    MLflow's UI (3.17) orders chart sections alphabetically, which puts the ``probe/...``
    sections before ``val/...`` and ``train``; a view marked as reordered keeps its sections in
    the given order and appends any others after them. A chart the view lists for a metric is
    kept as listed (its section, or ``deleted``) instead of being generated. The state is the
    UI's own view state and search facets; the UI fills in every field left out with its default
    (tests/test_grid_console.py reads the views back from a real store)."""
    sets = list(dict.fromkeys(val_sets))
    depth, exits = depth_curves(metrics)
    extra = [DEPTH_SECTION] * bool(depth) + [EXIT_SECTION] * bool(exits)
    names = [*(f"val/{s}" for s in sets), "train", ROUTING_SECTION, *extra, SPEED_SECTION, MODEL_METRICS_SECTION]
    sections = {name: f"mesh-section-{i}" for i, name in enumerate(names)}
    columns = [f"metrics.`val/{s}/ppl`" for s in sets] + ["metrics.`val_loss`", "metrics.`train/loss`"]
    columns += [f"tags.`{tag}`" for tag in ("scheme", "layout", "buffer_slots", "seed")]
    charts = []
    for s in sets:
        ppl, section = f"val/{s}/ppl", sections[f"val/{s}"]
        charts += [_line_chart(ppl, section, log=True), _bar_chart(ppl, section)]
    charts.append(_line_chart("train/loss", sections["train"], log=True))
    charts += [_line_chart(m, sections[ROUTING_SECTION]) for m in routing_curves(metrics)]
    charts += [_line_chart(m, sections[DEPTH_SECTION], log=True) for m in depth]
    charts += [_line_chart(m, sections[EXIT_SECTION], log=m.endswith("/ppl")) for m in exits]
    charts += [_line_chart(m, sections[SPEED_SECTION]) for m in SPEED_METRICS]
    hidden = [*BOOKKEEPING_METRICS, *SINGLE_VALUE_METRICS, *(f"val/{s}/loss" for s in sets)]
    hidden += single_value_metrics(metrics)
    charts += [_line_chart(m, sections[MODEL_METRICS_SECTION], deleted=True) for m in dict.fromkeys(hidden)]
    return {
        "searchFilter": TRAINING_RUNS_FILTER,
        "orderByKey": "metrics.`val_loss`",
        "orderByAsc": True,
        "selectedColumns": columns,
        "runsHiddenMode": "SHOW_ALL",
        "compareRunSections": [
            {
                "uuid": uuid,
                "name": name,
                "display": True,
                "isReordered": False,
                "columns": 2,
                "cardHeight": ANSWER_HEIGHT if sets and name == f"val/{sets[0]}" else CARD_HEIGHT,
            }
            for name, uuid in sections.items()
        ],
        "compareRunCharts": charts,
        "isAccordionReordered": True,
    }


def grouped_view(
    val_sets: Sequence[str],
    group_by: str,
    metrics: Iterable[str] = (),
    final_ranges: Mapping[str, Mapping[str, float]] | None = None,
) -> dict[str, Any]:
    """:func:`key_metrics_view` with the seeds of a row folded into one group: the finished training
    runs grouped by the tag ``group_by`` (``scheme`` where the grid varies only the scheme, else
    :data:`ROW_TAG`, the config without its seed), the groups ranked by the main set's validation
    PPL, each group a row of the table (its runs under it) and one curve in every chart: the mean
    over its runs (``aggregateFunction`` average) with a band from their minimum to their maximum
    (``useGroupedValuesInCharts``), named in the legend by its ``group_by`` value (the scheme).

    The line charts draw over steps; once the runs hold :data:`TOKENS_METRIC` (in ``metrics``) it
    is the metric the UI's x-axis setting offers first (``globalLineChartConfig``'s
    ``selectedXAxisMetricKey``: choose "Metric" as the x axis). It is not the default: MLflow 3.17.2
    draws a group's curves against a metric x axis at wrong x values where that metric is logged
    at more steps than the curve (``tokens`` at every training log, ``val/*`` at validations).
    One chart a row: a card's legend is 32 px high, two lines of names. Where
    ``final_ranges`` (:func:`final_stretch_range`) holds a range for a validation set's PPL, the bar
    chart of its final values (drawn by the UI from 0, where close values look equal) gives way to
    the same curves on that range: the last quarter of training, zoomed so the rows separate.

    MLflow (3.17) keeps a group's colour in the browser only (``localStorage``), not in a view:
    a group is drawn in a colour hashed from its name until one is picked in the runs table; the
    runs under it keep their scheme's colour (:data:`RUN_COLOR_TAG`)."""
    view = key_metrics_view(val_sets, metrics)
    sets = list(dict.fromkeys(val_sets))
    tokens = TOKENS_METRIC in set(metrics)
    view.update(
        {
            "searchFilter": f"{TRAINING_RUNS_FILTER} AND attributes.status = 'FINISHED'",
            "orderByKey": f"metrics.`val/{sets[0]}/ppl`" if sets else "metrics.`val_loss`",
            "groupBy": {"aggregateFunction": "average", "groupByKeys": [{"mode": "tag", "groupByData": group_by}]},
            "useGroupedValuesInCharts": True,
            "globalLineChartConfig": {
                "xAxisKey": "step",
                "selectedXAxisMetricKey": TOKENS_METRIC if tokens else "",
                "lineSmoothness": 0,
            },
        }
    )
    for section in view["compareRunSections"]:
        section["columns"] = 1  # a chart the section's width: its legend (32 px high) names more groups
    for i, card in enumerate(view["compareRunCharts"]):
        metric = card["metricKey"]
        if card["type"] == "BAR" and final_ranges and metric in final_ranges:
            view["compareRunCharts"][i] = {
                **_line_chart(metric, card["metricSectionId"]),
                "uuid": f"{card['metricSectionId']}-final-{metric}",
                "displayName": f"{metric}: last quarter of training, zoomed",
                "range": dict(final_ranges[metric]),
            }
    if group_by != "scheme":
        view["selectedColumns"].append(f"tags.`{group_by}`")
    return view


def final_stretch_range(client: Any, experiment_id: str, metric: str, tokens: bool) -> dict[str, float] | None:
    """The range of a line chart that shows ``metric`` over the last quarter of training
    (:data:`FINAL_STRETCH`) of the finished training runs of ``experiment_id``: x over those steps
    (the tokens seen at them when ``tokens``), y around every run's last value, from the lowest to
    the highest with a quarter of that spread on each side (1% of the value when all are equal), so
    that the rows' ends stand apart and the curves come into view as they settle. None when no run
    logged ``metric``."""
    runs = client.search_runs(
        [experiment_id], f"{TRAINING_RUNS_FILTER} AND attributes.status = 'FINISHED'", max_results=10_000
    )
    xs: list[float] = []
    finals: list[float] = []
    for run in runs:
        if metric not in run.data.metrics:
            continue
        history = sorted(client.get_metric_history(run.info.run_id, metric), key=lambda m: m.step)
        at: dict[int, float] = {}
        if tokens:
            at = {m.step: m.value for m in client.get_metric_history(run.info.run_id, TOKENS_METRIC)}
        last = history[-1].step
        finals.append(history[-1].value)
        for m in history:
            if m.step >= last * (1 - FINAL_STRETCH) and (not tokens or m.step in at):
                xs.append(at[m.step] if tokens else float(m.step))
    if not finals or not xs:
        return None
    low, high = min(finals), max(finals)
    margin = (high - low) / 4 if high > low else abs(high) / 100 or 1.0
    return {"xMin": min(xs), "xMax": max(xs), "yMin": low - margin, "yMax": high + margin}


GROUP_COLORS_KEY = "experimentRunColors"  # where the UI keeps a group's colour: the browser's localStorage


def group_colors(client: Any, experiment_id: str, group_by: str) -> dict[str, str]:
    """The colour of each group of :func:`grouped_view` in its scheme's colour, keyed as the UI
    keys a group (``tag.<group_by>.<value>``): MLflow (3.17) keeps these in the browser, under
    :data:`GROUP_COLORS_KEY`, never in the store, so a view cannot set them (see
    :func:`group_colors_script`)."""
    runs = client.search_runs([experiment_id], TRAINING_RUNS_FILTER, max_results=10_000)
    colors = {}
    for run in runs:
        tags = run.data.tags
        if tags.get(group_by) and tags.get("scheme"):
            colors[f"tag.{group_by}.{tags[group_by]}"] = run_color(tags["scheme"])
    return dict(sorted(colors.items()))


def group_colors_script(colors: Mapping[str, str]) -> str:
    """One line of JavaScript that gives the UI's groups ``colors`` (:func:`group_colors`), as
    picking each in the runs table would: pasted into the browser's console on the UI's page,
    then the page reloaded. Other colours kept there stay."""
    keyed = json.dumps(dict(colors))
    return (
        f"localStorage.setItem('{GROUP_COLORS_KEY}', JSON.stringify(Object.assign("
        f"JSON.parse(localStorage.getItem('{GROUP_COLORS_KEY}') || '{{}}'), {keyed})))"
    )


def _card(kind: str, metric: str, section: str, deleted: bool) -> dict[str, Any]:
    """The fields every chart card of the UI has; every run of the view drawn (up to 100)."""
    return {
        "uuid": f"{section}-{kind.lower()}-{metric}",
        "type": kind,
        "runsCountToCompare": 100,
        "metricSectionId": section,
        "deleted": deleted,
        "isGenerated": True,
        "displayName": metric,
        "metricKey": metric,
    }


def _line_chart(metric: str, section: str, deleted: bool = False, log: bool = False) -> dict[str, Any]:
    """A line chart card of ``metric`` over steps in the section ``section`` (a log y axis when
    ``log``), in the UI's own shape (the fields ``RunsChartsLineCardConfig`` sets; those it leaves
    undefined are left out)."""
    return {
        **_card("LINE", metric, section, deleted),
        "lineSmoothness": 0,
        "xAxisScaleType": "linear",
        "scaleType": "log" if log else "linear",
        "range": {},
        "xAxisKey": "step",
        "selectedXAxisMetricKey": "",
        "yAxisKey": "metric",
        "yAxisExpressions": [],
        "ignoreOutliers": False,
        "useGlobalXaxisKey": True,
        "useGlobalLineSmoothing": True,
    }


def _bar_chart(metric: str, section: str) -> dict[str, Any]:
    """A bar chart card of each run's last value of ``metric`` (``RunsChartsBarCardConfig``)."""
    return {**_card("BAR", metric, section, deleted=False), "displayName": f"{metric} (final)"}


def encode_view(view: dict[str, Any]) -> str:
    """``view`` as the UI's compressed tag value: ``deflate;`` and the base64 of its zlib-deflated
    JSON (a view that charts out every probe metric is longer than an experiment tag may be)."""
    return VIEW_COMPRESSION + base64.b64encode(zlib.compress(json.dumps(view).encode())).decode()


def read_view(value: str) -> dict[str, Any]:
    """The view an experiment tag holds: compressed (:func:`encode_view`) or plain JSON, as the UI reads it."""
    if value.startswith(VIEW_COMPRESSION):
        return json.loads(zlib.decompress(base64.b64decode(value.removeprefix(VIEW_COMPRESSION))))
    return json.loads(value)


def logged_metrics(client: Any, experiment_id: str) -> list[str]:
    """The metric keys the training runs of ``experiment_id`` hold so far, sorted."""
    runs = client.search_runs([experiment_id], TRAINING_RUNS_FILTER, max_results=10_000)
    return sorted({key for run in runs for key in run.data.metrics})


def write_key_metrics_view(client: Any, experiment_id: str, val_sets: Sequence[str]) -> str:
    """Keep :func:`key_metrics_view` in the experiment (replacing an earlier one), charting out the
    single values its runs hold so far (:func:`logged_metrics`); its key."""
    view = key_metrics_view(val_sets, logged_metrics(client, experiment_id))
    client.set_experiment_tag(experiment_id, SHARED_VIEW_TAG + KEY_METRICS_VIEW, encode_view(view))
    return KEY_METRICS_VIEW


def write_grouped_view(client: Any, experiment_id: str, val_sets: Sequence[str], group_by: str) -> str:
    """Keep :func:`grouped_view` in the experiment (replacing an earlier one), as
    :func:`write_key_metrics_view` does, with the final stretch of each validation set's PPL on the
    range its runs span there (:func:`final_stretch_range`); its key. A grid writes it when it
    starts (sweeps/sweep.py), ``mesh-results`` again once the runs hold every metric
    (results/publish/parents.py)."""
    metrics = logged_metrics(client, experiment_id)
    ranges = {}
    for s in dict.fromkeys(val_sets):
        found = final_stretch_range(client, experiment_id, f"val/{s}/ppl", tokens=False)
        if found is not None:
            ranges[f"val/{s}/ppl"] = found
    view = grouped_view(val_sets, group_by, metrics, ranges)
    client.set_experiment_tag(experiment_id, SHARED_VIEW_TAG + GROUPED_VIEW, encode_view(view))
    return GROUPED_VIEW


def _ui_page(tracking_uri: str, page: str) -> str:
    """``page`` (after the UI's ``#/``) on the tracking server, or at :data:`LOCAL_UI` once
    ``mlflow ui`` serves a local store."""
    if tracking_uri.startswith(("http://", "https://")):
        return f"{tracking_uri.rstrip('/')}/{page}"
    return f"{LOCAL_UI}/{page}"


def ui_command(tracking_uri: str) -> str:
    """The ``mlflow ui`` command that serves ``tracking_uri``, quoted for a shell (a path with spaces)."""
    return f"{shlex.quote(script_command('mlflow'))} ui --backend-store-uri {shlex.quote(tracking_uri)}"


def runs_list_url(tracking_uri: str, experiment_id: str, view: str | None = None, indent: str = "") -> str:
    """Where the MLflow UI lists the runs of experiment ``experiment_id`` (in the experiment's
    shared ``view`` when given, e.g. :data:`KEY_METRICS_VIEW`): the page on an http(s) tracking
    server; for any other store (a local sqlite file), the ``mlflow ui`` command that serves it,
    then the page at :data:`LOCAL_UI`: each on its own line (the next ones after ``indent``) with
    nothing glued to it, so a copied command or URL is only that (a trailing comma once named a new,
    empty store ``mlflow.db,``). The grouped view (:data:`GROUPED_VIEW`) opens on its charts.

    ``workflowType=machine_learning`` opens the runs table: MLflow 3's UI otherwise opens an
    experiment on its GenAI view (traces), whatever the experiment holds."""
    page = f"#/experiments/{experiment_id}/runs?{WORKFLOW}"
    if view == GROUPED_VIEW:  # opens on its charts (the groups' means and bands), the runs listed beside
        page += "&compareRunsMode=CHART"
    if view:
        page += f"&viewStateShareKey={view}"
    if tracking_uri.startswith(("http://", "https://")):
        return _ui_page(tracking_uri, page)
    return f"{ui_command(tracking_uri)}\n{indent}then open:\n{indent}{_ui_page(tracking_uri, page)}"


def run_url(tracking_uri: str, experiment_id: str, run_id: str) -> str:
    """The page of one run in the MLflow UI (on a local store, once :func:`ui_command` serves it),
    in the UI's machine-learning mode (see :func:`runs_list_url`): its overview, the note first (a
    sweep's parent run, whose note is the report)."""
    return _ui_page(tracking_uri, f"#/experiments/{experiment_id}/runs/{run_id}?{WORKFLOW}")


def run_metric_url(tracking_uri: str, experiment_id: str, run_id: str, metric: str) -> str:
    """The UI's page of one metric of one run (its route ``/metric``, the page a run's metric opens),
    on a log y axis: a training run's link, on ``val/<set>/ppl``, so it opens on the validation PPL
    rather than on the run page's charts, which the UI orders by name (``probe/*`` before ``val/*``).
    Every value is percent-encoded, so a terminal or a Markdown note keeps the link whole."""
    as_json = {"runs": [run_id], "metric": metric, "experiments": [experiment_id], "plot_metric_keys": [metric]}
    as_json.update({"plot_layout": {}})
    plain = {"x_axis": "step", "y_axis_scale": "log", "line_smoothness": "1", "show_point": "false"}
    after = {"deselected_curves": [], "last_linear_y_axis_range": []}  # the UI's order of the fields
    values = {**{k: json.dumps(v) for k, v in as_json.items()}, **plain, **{k: json.dumps(v) for k, v in after.items()}}
    fields = "&".join(f"{k}={quote(v, safe='')}" for k, v in values.items())
    return _ui_page(tracking_uri, f"#/metric/?{fields}")


def fit_tag_value(text: str, cut_line: str) -> str:
    """``text`` when it fits MLflow's tag limit; else cut at the last line end that leaves room for
    ``cut_line`` (a last line saying where the rest is), which is appended after a blank line."""
    if len(text) <= TAG_VALUE_LIMIT:
        return text
    tail = f"\n\n{cut_line}"
    kept = text[: TAG_VALUE_LIMIT - len(tail)]
    return kept[: kept.rfind("\n") if "\n" in kept else len(kept)] + tail


def finished_run_note(result: Mapping[str, Any], val_sets: Sequence[str]) -> str:
    """A finished training run's description, the first thing its page shows (the UI orders the
    run's charts by name, the probes' summaries before ``train`` and ``val``): the main validation
    set's perplexity and the training loss at the last step, the other sets' perplexities, and where
    the curves, the probe values and the timings are. ``result`` is ``train()``'s (``val/<set>/ppl``,
    ``train/loss``, ``steps``)."""
    main, *others = val_sets
    head = f"**validation PPL ({main}) {result[f'val/{main}/ppl']:.2f}**"
    if "train/loss" in result:
        head += f" · training loss {result['train/loss']:.4f}"
    lines = [f"{head} · after {result['steps']} steps"]
    shown = [f"{s} {result[f'val/{s}/ppl']:.2f}" for s in others if f"val/{s}/ppl" in result]
    if shown:
        lines.append(f"Validation PPL on the other sets: {', '.join(shown)}")
    lines.append(
        f"Curves: *Model metrics*, sections `val/{main}` and `train`. Every probe value: "
        "`probes/final/probes.csv` under *Artifacts* (with `probes.json` and the figures); the `probe/*` "
        "metrics are the few summaries the claims read. "
        "Steps per second and where the time went: the `time/*` metrics below."
    )
    return "\n\n".join(lines)


def set_run_description(client: Any, run_id: str, markdown: str) -> None:
    """Set the run's description (its note, rendered as Markdown on the run page), replacing any.
    Text beyond MLflow's tag limit is cut at a line end, with a last line saying so."""
    cut_line = f"*(cut at MLflow's {TAG_VALUE_LIMIT}-character limit of a run description)*"
    client.set_tag(run_id, NOTE_TAG, fit_tag_value(markdown, cut_line))
