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
SPEED_METRICS = ("train/tokens_per_s",)  # a curve; time/steps_per_s is one value at the end (a column)
# Metrics that say how a run or a grid was set up, not how runs compare: no chart in the views.
# cells_<status>: a sweep's parent run, one per status of sweeps/cells.py STATUSES.
BOOKKEEPING_METRICS = (
    "epoch",
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
        for k in ("setup_s", "steps_s", "between_steps_s", "validation_s", "end_s", "total_s", "steps_per_s")
    ),
)
CURVE_PREFIXES = ("train/", "routing/")  # logged over steps, with val/<set>/ppl and lr
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
    learning rate (values over steps); not a validation loss (the log of its perplexity)."""
    if metric.startswith("val/"):
        return metric.endswith("/ppl")
    return metric == "lr" or metric.startswith(CURVE_PREFIXES)


def single_value_metrics(metrics: Iterable[str]) -> list[str]:
    """The ``metrics`` (keys in a store) the views chart out: every one :func:`is_curve` rejects,
    besides :data:`BOOKKEEPING_METRICS` and :data:`SINGLE_VALUE_METRICS`, in order, each once."""
    listed = {*BOOKKEEPING_METRICS, *SINGLE_VALUE_METRICS}
    return [m for m in dict.fromkeys(metrics) if not is_curve(m) and m not in listed]


def key_metrics_view(val_sets: Sequence[str], metrics: Iterable[str] = ()) -> dict[str, Any]:
    """The runs page as a grid is read: every training run in one flat list (a sort other than by
    date stops MLflow nesting cells under the sweep's collapsed parent; the parent itself is left
    out, :data:`TRAINING_RUNS_FILTER`), best validation loss first, the validation perplexities,
    losses and the run's coordinates as columns (the UI orders metric columns by name, so no other
    metric goes before the perplexity), all runs in the charts (each in its scheme's
    colour, :data:`RUN_COLOR_TAG`).

    The charts open on the answer: the main validation set's section first, its perplexity over
    steps on a log axis beside a bar chart of each run's final perplexity, two to a row and
    :data:`ANSWER_HEIGHT` high; then the other validation sets, training, routing and speed. A
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
    names = [*(f"val/{s}" for s in sets), "train", ROUTING_SECTION, SPEED_SECTION, MODEL_METRICS_SECTION]
    sections = {name: f"mesh-section-{i}" for i, name in enumerate(names)}
    columns = [f"metrics.`val/{s}/ppl`" for s in sets] + ["metrics.`val_loss`", "metrics.`train/loss`"]
    columns += [f"tags.`{tag}`" for tag in ("scheme", "layout", "buffer_slots", "seed")]
    charts = []
    for s in sets:
        ppl, section = f"val/{s}/ppl", sections[f"val/{s}"]
        charts += [_line_chart(ppl, section, log=True), _bar_chart(ppl, section)]
    charts.append(_line_chart("train/loss", sections["train"], log=True))
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


def grouped_view(val_sets: Sequence[str], group_by: str, metrics: Iterable[str] = ()) -> dict[str, Any]:
    """:func:`key_metrics_view` with the seeds of a row folded into one group: the finished training
    runs grouped by the tag ``group_by`` (``scheme`` where the grid varies only the scheme, else
    :data:`ROW_TAG`, the config without its seed), each group showing the average of its runs, the
    groups ranked by the main set's validation PPL. The charts draw every seed in its scheme's
    colour (``useGroupedValuesInCharts`` off: MLflow colours a group by a hash of its name and keeps
    a chosen colour only in the browser); the spread between seeds is what they show."""
    view = key_metrics_view(val_sets, metrics)
    sets = list(dict.fromkeys(val_sets))
    view.update(
        {
            "searchFilter": f"{TRAINING_RUNS_FILTER} AND attributes.status = 'FINISHED'",
            "orderByKey": f"metrics.`val/{sets[0]}/ppl`" if sets else "metrics.`val_loss`",
            "groupBy": {"aggregateFunction": "average", "groupByKeys": [{"mode": "tag", "groupByData": group_by}]},
            "useGroupedValuesInCharts": False,
        }
    )
    if group_by != "scheme":
        view["selectedColumns"].append(f"tags.`{group_by}`")
    return view


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
    :func:`write_key_metrics_view` does; its key. A grid writes it when it starts (sweeps/sweep.py),
    ``mesh-results`` again once the runs hold every metric (results/publish/parents.py)."""
    view = grouped_view(val_sets, group_by, logged_metrics(client, experiment_id))
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
    empty store ``mlflow.db,``).

    ``workflowType=machine_learning`` opens the runs table: MLflow 3's UI otherwise opens an
    experiment on its GenAI view (traces), whatever the experiment holds."""
    page = f"#/experiments/{experiment_id}/runs?{WORKFLOW}"
    if view:
        page += f"&viewStateShareKey={view}"
    if tracking_uri.startswith(("http://", "https://")):
        return _ui_page(tracking_uri, page)
    return f"{ui_command(tracking_uri)}\n{indent}then open:\n{indent}{_ui_page(tracking_uri, page)}"


def run_url(tracking_uri: str, experiment_id: str, run_id: str) -> str:
    """The page of one run in the MLflow UI (on a local store, once :func:`ui_command` serves it),
    in the UI's machine-learning mode (see :func:`runs_list_url`)."""
    return _ui_page(tracking_uri, f"#/experiments/{experiment_id}/runs/{run_id}?{WORKFLOW}")


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
