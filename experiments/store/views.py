"""Where the MLflow UI shows runs: the experiment views (the key-metrics and grouped views kept as
experiment tags), the addresses of a store's runs list and run pages, the ``mlflow ui`` command,
run colours and run notes (descriptions)."""

from __future__ import annotations

import json
import shlex
from collections.abc import Sequence
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
MODEL_METRICS_SECTION = "Model metrics"  # the UI's chart section of the metrics without a "/"
SPEED_SECTION = "Speed"
ROUTING_SECTION = "routing"  # how the loop passes state (experiments/probing/state_routing.py)
SPEED_METRICS = ("train/tokens_per_s", "time/steps_per_s")
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
# Only training runs (every one is tagged with its seed; a sweep's parent run is not): the parent,
# a row of dashes, stays out of the list and the charts.
TRAINING_RUNS_FILTER = "tags.seed IS NOT NULL"
ROW_TAG = "row"  # a run's row in the report: its config without the seed (results.publish writes it)
RUN_COLOR_TAG = "mlflow.runColor"  # the run's colour in the UI's charts


def run_color(scheme: str) -> str:
    """A run's colour in the UI: its scheme's in the report's figures, so a scheme's seeds share it."""
    return scheme_color(scheme)


def key_metrics_view(val_sets: Sequence[str]) -> dict[str, Any]:
    """The runs page as a grid is read: every training run in one flat list (a sort other than by
    date stops MLflow nesting cells under the sweep's collapsed parent; the parent itself is left
    out, :data:`TRAINING_RUNS_FILTER`), best validation loss first, the validation perplexities,
    losses and the run's coordinates as columns, all runs in the charts (each in its scheme's
    colour, :data:`RUN_COLOR_TAG`), the chart sections of validation, training, routing and speed first,
    and no charts of :data:`BOOKKEEPING_METRICS`.

    MLflow's UI (3.17) orders chart sections alphabetically, which puts the ``probe/...``
    sections before ``val/...`` and ``train``; a view marked as reordered keeps its sections in
    the given order and appends any others after them. A chart the view lists for a metric is
    kept as listed (its section, or ``deleted``) instead of being generated. The state is the
    UI's own view state and search facets; the UI fills in every field left out with its default
    (tests/test_results.py reads the views back from a real store)."""
    sets = list(dict.fromkeys(val_sets))
    names = [*(f"val/{s}" for s in sets), "train", ROUTING_SECTION, SPEED_SECTION, MODEL_METRICS_SECTION]
    sections = {name: f"mesh-section-{i}" for i, name in enumerate(names)}
    columns = [f"metrics.`val/{s}/ppl`" for s in sets] + ["metrics.`val_loss`", "metrics.`train/loss`"]
    columns += [f"tags.`{tag}`" for tag in ("scheme", "layout", "buffer_slots", "seed")]
    charts = [_line_chart(m, sections[SPEED_SECTION]) for m in SPEED_METRICS]
    charts += [_line_chart(m, sections[MODEL_METRICS_SECTION], deleted=True) for m in BOOKKEEPING_METRICS]
    return {
        "searchFilter": TRAINING_RUNS_FILTER,
        "orderByKey": "metrics.`val_loss`",
        "orderByAsc": True,
        "selectedColumns": columns,
        "runsHiddenMode": "SHOW_ALL",
        "compareRunSections": [
            {"uuid": uuid, "name": name, "display": True, "isReordered": False} for name, uuid in sections.items()
        ],
        "compareRunCharts": charts,
        "isAccordionReordered": True,
    }


def grouped_view(val_sets: Sequence[str], group_by: str) -> dict[str, Any]:
    """:func:`key_metrics_view` with the seeds of a row folded into one group: the finished training
    runs grouped by the tag ``group_by`` (``scheme`` where the grid varies only the scheme, else
    :data:`ROW_TAG`, the config without its seed), each group showing the average of its runs, the
    groups ranked by the main set's validation PPL. The charts draw every seed in its scheme's
    colour (``useGroupedValuesInCharts`` off: MLflow colours a group by a hash of its name and keeps
    a chosen colour only in the browser); the spread between seeds is what they show."""
    view = key_metrics_view(val_sets)
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


def _line_chart(metric: str, section: str, deleted: bool = False) -> dict[str, Any]:
    """A line chart card of ``metric`` in the section ``section``, in the UI's own shape (the fields
    ``RunsChartsLineCardConfig`` sets; those it leaves undefined are left out)."""
    return {
        "uuid": f"{section}-{metric}",
        "type": "LINE",
        "runsCountToCompare": 10,
        "metricSectionId": section,
        "deleted": deleted,
        "isGenerated": True,
        "displayName": metric.rsplit("/", 1)[-1],
        "metricKey": metric,
        "lineSmoothness": 0,
        "xAxisScaleType": "linear",
        "scaleType": "linear",
        "range": {},
        "xAxisKey": "step",
        "selectedXAxisMetricKey": "",
        "yAxisKey": "metric",
        "yAxisExpressions": [],
        "ignoreOutliers": False,
        "useGlobalXaxisKey": True,
        "useGlobalLineSmoothing": True,
    }


def write_key_metrics_view(client: Any, experiment_id: str, val_sets: Sequence[str]) -> str:
    """Keep :func:`key_metrics_view` in the experiment (replacing an earlier one); its key."""
    client.set_experiment_tag(experiment_id, SHARED_VIEW_TAG + KEY_METRICS_VIEW, json.dumps(key_metrics_view(val_sets)))
    return KEY_METRICS_VIEW


def write_grouped_view(client: Any, experiment_id: str, val_sets: Sequence[str], group_by: str) -> str:
    """Keep :func:`grouped_view` in the experiment (replacing an earlier one); its key."""
    view = grouped_view(val_sets, group_by)
    client.set_experiment_tag(experiment_id, SHARED_VIEW_TAG + GROUPED_VIEW, json.dumps(view))
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


def runs_list_url(tracking_uri: str, experiment_id: str, view: str | None = None) -> str:
    """Where the MLflow UI lists the runs of experiment ``experiment_id`` (in the experiment's
    shared ``view`` when given, e.g. :data:`KEY_METRICS_VIEW`): the page on an http(s) tracking
    server; for any other store (a local sqlite file), the ``mlflow ui`` command that serves it,
    then the page at :data:`LOCAL_UI`.

    ``workflowType=machine_learning`` opens the runs table: MLflow 3's UI otherwise opens an
    experiment on its GenAI view (traces), whatever the experiment holds."""
    page = f"#/experiments/{experiment_id}/runs?{WORKFLOW}"
    if view:
        page += f"&viewStateShareKey={view}"
    if tracking_uri.startswith(("http://", "https://")):
        return _ui_page(tracking_uri, page)
    return f"{ui_command(tracking_uri)}, then open {_ui_page(tracking_uri, page)}"


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


def set_run_description(client: Any, run_id: str, markdown: str) -> None:
    """Set the run's description (its note, rendered as Markdown on the run page), replacing any.
    Text beyond MLflow's tag limit is cut at a line end, with a last line saying so."""
    cut_line = f"*(cut at MLflow's {TAG_VALUE_LIMIT}-character limit of a run description)*"
    client.set_tag(run_id, NOTE_TAG, fit_tag_value(markdown, cut_line))
