"""A grid you can watch: the lines of mesh-sweep and mesh-train in a log file, the parent run that
says what the grid is, and where to look next (the results command, the MLflow UI page)."""

from __future__ import annotations

import io
import json
import re
import shlex
import sys
from pathlib import Path
from urllib.parse import unquote

import mlflow
import pytest
import torch

from experiments.callbacks.progress import PlainProgress
from experiments.compose import compose_config
from experiments.console import PROGRESS_ENV, duration
from experiments.plan import plan_run
from experiments.store.views import (
    ANSWER_HEIGHT,
    CARD_HEIGHT,
    GROUPED_VIEW,
    KEY_METRICS_VIEW,
    NOTE_TAG,
    ROW_TAG,
    RUN_COLOR_TAG,
    SHARED_VIEW_TAG,
    TAG_VALUE_LIMIT,
    TOKENS_METRIC,
    grouped_view,
    is_curve,
    key_metrics_view,
    read_view,
    run_metric_url,
    run_url,
    runs_list_url,
    set_run_description,
    single_value_metrics,
    write_grouped_view,
    write_key_metrics_view,
)
from mesh_model.probe_names import scheme_color
from sweeps.cells import STATUSES
from sweeps.grid import expand_cells
from sweeps.sweep import grid_group_key, run_sweep

STAMP = r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d"
RUNS_PAGE = "#/experiments/{}/runs?workflowType=machine_learning"


# --- where to look ---------------------------------------------------------------------------------


def test_runs_list_url_opens_the_runs_table_of_a_server_or_says_how_to_serve_a_local_store():
    page = RUNS_PAGE.format(7)
    assert runs_list_url("http://mlflow.lab:5000", "7") == f"http://mlflow.lab:5000/{page}"
    assert runs_list_url("https://mlflow.lab/", "7") == f"https://mlflow.lab/{page}"
    local = runs_list_url("sqlite:////data/runs/mlflow.db", "7")
    command, said, then = local.split("\n")  # each on its own line: nothing glued to a command or URL
    assert said == "then open:"
    assert command.endswith("mlflow ui --backend-store-uri sqlite:////data/runs/mlflow.db")
    assert Path(command.split()[0]).name == "mlflow"
    assert then == f"http://127.0.0.1:5000/{page}"


def test_the_mlflow_ui_command_is_quoted_for_a_shell_where_the_store_path_has_spaces():
    store = "sqlite:////data/my runs/it's here/mlflow.db"
    command, _, _ = runs_list_url(store, "7").split("\n")
    words = shlex.split(command)
    assert words[1:] == ["ui", "--backend-store-uri", store] and Path(words[0]).name == "mlflow"


def test_a_run_link_opens_the_runs_page_in_machine_learning_mode():
    assert run_url("http://mlflow.lab:5000/", "7", "abc") == (
        "http://mlflow.lab:5000/#/experiments/7/runs/abc?workflowType=machine_learning"
    )
    local = "http://127.0.0.1:5000/#/experiments/7/runs/abc?workflowType=machine_learning"
    assert run_url("sqlite:////data/runs/mlflow.db", "7", "abc") == local


def test_a_training_runs_link_opens_its_validation_ppl_on_the_uis_metric_page():
    """The metric page of ``val/<set>/ppl`` for that run, every JSON value percent-encoded (a
    terminal or a Markdown note keeps the link whole), the fields in the UI's own order."""
    url = run_metric_url("http://mlflow.lab:5000", "7", "abc", "val/shakespeare/ppl")
    page, query = url.split("?", 1)
    assert page == "http://mlflow.lab:5000/#/metric/"
    fields = dict(part.split("=", 1) for part in query.split("&"))
    assert list(fields)[:4] == ["runs", "metric", "experiments", "plot_metric_keys"]
    decoded = {k: unquote(v) for k, v in fields.items()}
    assert json.loads(decoded["runs"]) == ["abc"] and json.loads(decoded["experiments"]) == ["7"]
    assert json.loads(decoded["metric"]) == "val/shakespeare/ppl"
    assert (decoded["x_axis"], decoded["y_axis_scale"]) == ("step", "log")
    assert not set(query) & set('"[]{}/ ')
    assert run_metric_url("sqlite:////r/mlflow.db", "7", "abc", "val/kjv/ppl").startswith(
        "http://127.0.0.1:5000/#/metric/?"
    )


def test_the_installed_mlflow_ui_reads_the_runs_page_and_workflow_type_of_that_url():
    """The URL's shape is MLflow's client-side routing: read in the UI bundle that ships with the
    installed MLflow, so an upgrade that changes it fails here."""
    build = Path(mlflow.__file__).parent / "server" / "js" / "build" / "static" / "js"
    bundle = "".join(path.read_text(errors="replace") for path in build.glob("*.js"))
    assert "createHashRouter" in bundle  # hence /#/ in the URL
    assert '"/experiments/:experimentId/:tabName"' in bundle and 'Runs="runs"' in bundle
    assert 'get("workflowType")' in bundle and 'MACHINE_LEARNING="machine_learning"' in bundle


def test_runs_list_url_opens_a_shared_view_when_given_one():
    url = runs_list_url("http://mlflow.lab:5000", "7", KEY_METRICS_VIEW)
    assert url == f"http://mlflow.lab:5000/{RUNS_PAGE.format(7)}&viewStateShareKey={KEY_METRICS_VIEW}"


def test_the_key_metrics_view_lists_runs_flat_by_val_loss_and_puts_validation_sections_first(tmp_path):
    view = key_metrics_view(["shakespeare", "kjv", "shakespeare"])
    assert (view["orderByKey"], view["orderByAsc"]) == ("metrics.`val_loss`", True)
    names = [s["name"] for s in view["compareRunSections"]]
    assert names == ["val/shakespeare", "val/kjv", "train", "routing", "Speed", "Model metrics"]
    assert view["isAccordionReordered"] is True and "groupBy" not in view
    assert view["selectedColumns"][:4] == [
        "metrics.`val/shakespeare/ppl`",
        "metrics.`val/kjv/ppl`",
        "metrics.`val_loss`",
        "metrics.`train/loss`",
    ]
    client = mlflow.MlflowClient(f"sqlite:///{tmp_path / 'mlflow.db'}")
    experiment_id = client.create_experiment("views")
    assert write_key_metrics_view(client, experiment_id, ["shakespeare"]) == KEY_METRICS_VIEW
    stored = client.get_experiment(experiment_id).tags[SHARED_VIEW_TAG + KEY_METRICS_VIEW]
    assert read_view(stored) == key_metrics_view(["shakespeare"])


def test_the_views_chart_speed_in_its_own_section_and_no_bookkeeping_metric():
    """train/tokens_per_s sits in the Speed section; the metrics that say how a run or grid was set
    up (the parent's cells_<status> for every status a cell can end in, epoch, global_batch...) and
    the single values (parameter counts, timings, val_loss) have a deleted chart, which the UI keeps
    instead of generating one."""
    for view in (key_metrics_view(["shakespeare"]), grouped_view(["shakespeare"], "scheme")):
        sections = {s["name"]: s["uuid"] for s in view["compareRunSections"]}
        charts = view["compareRunCharts"]
        speed = {c["metricKey"] for c in charts if c["metricSectionId"] == sections["Speed"] and not c["deleted"]}
        assert speed == {"train/tokens_per_s"}
        hidden = {c["metricKey"] for c in charts if c["deleted"]}
        assert {"epoch", "global_batch", "flops_per_token", "cells_failed", "cells_pruned"} <= hidden
        assert {f"cells_{status.lower()}" for status in STATUSES} <= hidden
        assert {"val_loss", "params_non_embedding", "time/steps_per_s", "val/shakespeare/loss"} <= hidden
        assert not hidden & {"lr", "train/loss", "val/shakespeare/ppl"}
        # The UI orders metric columns by name: only train/loss before the validation PPL.
        metrics = sorted(c for c in view["selectedColumns"] if c.startswith("metrics."))
        assert metrics[:2] == ["metrics.`train/loss`", "metrics.`val/shakespeare/ppl`"]


def test_the_views_open_on_validation_ppl_over_steps_on_a_log_axis_beside_its_final_values():
    """The first section is the main validation set's, two charts a row and taller than the UI's
    default: its PPL over steps on a log y axis, then a bar chart of each run's final PPL; training
    loss on a log axis too; every chart draws every run (up to 100), not the UI's first 10."""
    view = grouped_view(["shakespeare", "kjv"], "scheme")
    first, second = view["compareRunSections"][:2]
    assert (first["name"], first["columns"], first["cardHeight"]) == ("val/shakespeare", 1, ANSWER_HEIGHT)
    assert (second["name"], second["cardHeight"]) == ("val/kjv", CARD_HEIGHT) and ANSWER_HEIGHT > CARD_HEIGHT
    shown = [c for c in view["compareRunCharts"] if not c["deleted"]]
    in_first = [(c["type"], c["metricKey"]) for c in shown if c["metricSectionId"] == first["uuid"]]
    assert in_first == [("LINE", "val/shakespeare/ppl"), ("BAR", "val/shakespeare/ppl")]
    lines = {c["metricKey"]: c for c in shown if c["type"] == "LINE"}
    assert lines["val/shakespeare/ppl"]["scaleType"] == lines["train/loss"]["scaleType"] == "log"
    assert lines["val/shakespeare/ppl"]["xAxisKey"] == "step"
    assert lines["train/tokens_per_s"]["scaleType"] == "linear"
    assert {c["runsCountToCompare"] for c in view["compareRunCharts"]} == {100}
    assert len({c["uuid"] for c in view["compareRunCharts"]}) == len(view["compareRunCharts"])


def test_the_views_chart_out_the_probes_and_other_single_values_a_store_holds(tmp_path):
    """Written to a store, a view lists a deleted chart for every metric of its training runs that
    is not a curve (probes, downstream accuracies), so a run's ~50 probe values draw no chart; the
    curves (validation PPL, training and routing metrics, the learning rate) keep theirs. The
    tag is the UI's compressed form: with every probe listed it is longer than a plain tag may be."""
    client = mlflow.MlflowClient(f"sqlite:///{tmp_path / 'mlflow.db'}")
    experiment_id = client.create_experiment("views")
    probes = [f"probe/cka_rbf/h{i}/h{j}" for i in range(12) for j in range(i + 1, 12)]  # 66
    curves = ["val/pile/ppl", "train/loss", "routing/coef/h1/emb/mean", "lr"]
    run_id = client.create_run(experiment_id, tags={"seed": "0", "scheme": "mesh"}).info.run_id
    parent = client.create_run(experiment_id, tags={"kind": "sweep"}).info.run_id
    for key in [*probes, *curves, "eval/0shot/hellaswag/acc", "val/pile/loss"]:
        client.log_metric(run_id, key, 0.5, step=0)
    client.log_metric(parent, "cells_finished", 1.0)
    write_grouped_view(client, experiment_id, ["pile"], "scheme")
    stored = client.get_experiment(experiment_id).tags[SHARED_VIEW_TAG + GROUPED_VIEW]
    assert stored.startswith("deflate;") and len(json.dumps(read_view(stored))) > 20_000  # MLflow's limit
    hidden = {c["metricKey"] for c in read_view(stored)["compareRunCharts"] if c["deleted"]}
    assert {*probes, "eval/0shot/hellaswag/acc", "val/pile/loss"} <= hidden and not hidden & set(curves)
    assert is_curve("val/pile/ppl") and not is_curve("val/pile/loss") and not is_curve("probe/erank/h1")
    assert single_value_metrics(["lr", "probe/samples", "epoch", "probe/samples"]) == ["probe/samples"]


def test_a_grid_folds_its_seeds_by_scheme_from_its_start_where_only_the_scheme_and_seed_vary():
    assert grid_group_key({"sweep": "s", "grid.scheme": "base,mesh", "grid.seed": "0,1"}) == "scheme"
    assert grid_group_key({"sweep": "s", "grid.scheme": "mesh", "grid.layout": "a,b"}) == ROW_TAG
    assert grid_group_key({"sweep": "s", "cells": "1"}) == "scheme"


def test_the_installed_mlflow_ui_reads_a_compressed_view_and_the_chart_fields_the_views_set():
    """The compressed tag value (``deflate;`` + base64 of zlib's deflate, pako's format), the
    section's columns and card height, the line chart's scale type, read in the UI bundle of the
    installed MLflow, so an upgrade that changes them fails here."""
    build = Path(mlflow.__file__).parent / "server" / "js" / "build" / "static" / "js"
    bundle = "".join(path.read_text(errors="replace") for path in build.glob("*.js"))
    assert 'f="deflate;"' in bundle and 'return t.inflate(e,{to:"string"})' in bundle
    assert "null!==(d=t.columns)&&void 0!==d?d:3" in bundle and "null!==(u=t.cardHeight)&&void 0!==u?u:360" in bundle
    assert 'this.xAxisScaleType="linear",this.scaleType="linear"' in bundle
    assert 'this.type=c.BAR,this.metricKey=""' in bundle
    assert CARD_HEIGHT == 360


def test_the_views_filters_select_the_training_runs_and_the_grouped_one_its_finished_runs(tmp_path):
    """The search filter of each view, run by the store: the sweep's parent run (no seed tag) is in
    neither; the grouped view averages finished runs only."""
    client = mlflow.MlflowClient(f"sqlite:///{tmp_path / 'mlflow.db'}")
    experiment_id = client.create_experiment("filters")
    parent = client.create_run(experiment_id, tags={"kind": "sweep"}).info.run_id
    finished = [client.create_run(experiment_id, tags={"seed": str(s), "scheme": "mesh"}).info.run_id for s in (0, 1)]
    running = client.create_run(experiment_id, tags={"seed": "2", "scheme": "mesh"}).info.run_id
    for run_id in (parent, *finished):
        client.set_terminated(run_id, "FINISHED")

    def selected(view: dict) -> set[str]:
        return {r.info.run_id for r in client.search_runs([experiment_id], view["searchFilter"])}

    assert selected(key_metrics_view(["shakespeare"])) == {*finished, running}
    assert selected(grouped_view(["shakespeare"], "scheme")) == set(finished)


def test_the_grouped_view_folds_seeds_by_the_given_tag_ranked_by_validation_ppl(tmp_path):
    view = grouped_view(["shakespeare", "kjv"], "scheme")
    groups = {"aggregateFunction": "average", "groupByKeys": [{"mode": "tag", "groupByData": "scheme"}]}
    assert view["groupBy"] == groups
    assert (view["orderByKey"], view["orderByAsc"]) == ("metrics.`val/shakespeare/ppl`", True)
    assert view["useGroupedValuesInCharts"] is True  # each group's mean, with its min-max band
    assert view["globalLineChartConfig"]["xAxisKey"] == "step"  # no run holds the tokens yet
    by_row = grouped_view(["shakespeare"], ROW_TAG)
    assert by_row["groupBy"]["groupByKeys"] == [{"mode": "tag", "groupByData": "row"}]
    assert by_row["selectedColumns"][-1] == "tags.`row`"
    client = mlflow.MlflowClient(f"sqlite:///{tmp_path / 'mlflow.db'}")
    experiment_id = client.create_experiment("views")
    assert write_grouped_view(client, experiment_id, ["shakespeare"], "scheme") == GROUPED_VIEW
    stored = client.get_experiment(experiment_id).tags[SHARED_VIEW_TAG + GROUPED_VIEW]
    assert read_view(stored) == grouped_view(["shakespeare"], "scheme")


def test_the_grouped_view_written_to_a_store_draws_group_means_over_tokens_and_zooms_on_the_end(tmp_path):
    """Two schemes of two seeds in a real sqlite store, with the metrics a grid logs: the written
    view (decoded from its tag) folds the seeds by scheme into their mean with a min-max band, in
    every line chart over the tokens seen (the UI's metric-as-x-axis), the tokens themselves without
    a chart; the bar chart of final PPLs (drawn from 0 by the UI) gives way to the last quarter of
    training on a range around the runs' last values; the routing section
    charts the coda input's coefficients and MeSH's router entropies."""
    client = mlflow.MlflowClient(f"sqlite:///{tmp_path / 'mlflow.db'}")
    experiment_id = client.create_experiment("views")
    finals = {("base", 0): 101.0, ("base", 1): 103.0, ("mesh", 0): 98.0, ("mesh", 1): 99.0}
    for (scheme, seed), final in finals.items():
        tags = {"seed": str(seed), "scheme": scheme, RUN_COLOR_TAG: scheme_color(scheme)}
        run_id = client.create_run(experiment_id, tags=tags).info.run_id
        for step in range(0, 401, 50):  # validated every 50 of 400 steps of 2048 tokens
            client.log_metric(run_id, "val/shakespeare/ppl", final + 4 * (400 - step), step=step)
            client.log_metric(run_id, TOKENS_METRIC, 2048.0 * step, step=step)
            client.log_metric(run_id, "routing/coef/coda/f2/mean", 1.0, step=step)
            if scheme == "mesh":
                client.log_metric(run_id, "routing/loop2/read/entropy", 0.5, step=step)
        client.log_metric(run_id, "routing/coef/h0/h_emb/mean", 1.0, step=400)
        client.set_terminated(run_id)
    write_grouped_view(client, experiment_id, ["shakespeare"], "scheme")
    view = read_view(client.get_experiment(experiment_id).tags[SHARED_VIEW_TAG + GROUPED_VIEW])
    assert view["groupBy"] == {
        "aggregateFunction": "average",
        "groupByKeys": [{"mode": "tag", "groupByData": "scheme"}],
    }
    assert view["useGroupedValuesInCharts"] is True
    assert view["globalLineChartConfig"] == {
        "xAxisKey": "step",
        "selectedXAxisMetricKey": "tokens",
        "lineSmoothness": 0,
    }
    shown = [c for c in view["compareRunCharts"] if not c["deleted"]]
    assert {c["type"] for c in shown} == {"LINE"} and all(c["useGlobalXaxisKey"] for c in shown)
    assert TOKENS_METRIC in {c["metricKey"] for c in view["compareRunCharts"] if c["deleted"]}
    sections = {s["name"]: s["uuid"] for s in view["compareRunSections"]}
    main = [c for c in shown if c["metricSectionId"] == sections["val/shakespeare"]]
    assert [c["metricKey"] for c in main] == ["val/shakespeare/ppl"] * 2
    zoomed = main[1]["range"]
    assert (zoomed["xMin"], zoomed["xMax"]) == (300, 400)  # the last quarter of 400 steps
    low, high = min(finals.values()), max(finals.values())  # 98 and 103, the runs' last values
    assert (zoomed["yMin"], zoomed["yMax"]) == (low - (high - low) / 4, high + (high - low) / 4)  # not from 0
    routing = [c["metricKey"] for c in shown if c["metricSectionId"] == sections["routing"]]
    assert routing == ["routing/coef/coda/f2/mean", "routing/loop2/read/entropy"]


def test_the_installed_mlflow_ui_reads_a_shared_view_from_that_tag_as_plain_json():
    """The view is the UI's own state: its tag prefix, URL key, plain-JSON fallback, the fields it
    sets, and the rule that a reordered accordion keeps its sections' order (checked in the UI
    bundle of the installed MLflow, so an upgrade that changes them fails here)."""
    build = Path(mlflow.__file__).parent / "server" / "js" / "build" / "static" / "js"
    bundle = "".join(path.read_text(errors="replace") for path in build.glob("*.js"))
    assert '"viewStateShareKey"' in bundle and f'"{SHARED_VIEW_TAG}"' in bundle
    assert ":JSON.parse(e))(t.value)" in bundle  # an uncompressed value is parsed as JSON
    for field in (
        "selectedColumns",
        "compareRunCharts",
        "compareRunSections",
        "isAccordionReordered",
        "runsHiddenMode",
    ):
        assert f'"{field}"' in bundle, field
    assert '"orderByKey","orderByAsc"' in bundle and 'SHOWALL="SHOW_ALL"' in bundle
    # the section's name beside the URL key, whatever the minifier called it (q in 3.17, Z in 3.18)
    assert re.search(r'[\w$]+="Model metrics",[\w$]+="viewStateShareKey"', bundle)
    # updateChartAndSectionConfigs sorts the sections by name only when the accordion was not reordered
    assert "!n){const e=v.filter(e=>e.name!==i.NN&&e.name!==i.rx);e.sort((e,t)=>e.name.localeCompare(t.name))" in bundle


def test_the_installed_mlflow_ui_draws_groups_over_a_metric_axis_on_a_line_charts_range_as_the_grouped_view_asks():
    """What the grouped view and the run links rely on, read in the UI bundle of the installed
    MLflow: the shared view's global line chart settings (x axis ``metric`` with its metric key), a
    line card's ``range``, a group's min-max band; what it cannot ask: a bar card has no range, and a
    group's colour is kept in the browser's localStorage only; and the metric page's route and fields."""
    build = Path(mlflow.__file__).parent / "server" / "js" / "build" / "static" / "js"
    bundle = "".join(path.read_text(errors="replace") for path in build.glob("*.js"))
    assert '"hideEmptyCharts","globalLineChartConfig","chartsSearchFilter"]' in bundle  # shared UI state fields
    assert 'globalLineChartConfig:{xAxisKey:i.fj.STEP,lineSmoothness:0,selectedXAxisMetricKey:""}' in bundle
    assert 'e.STEP="step",e.TIME="time",e.TIME_RELATIVE="time-relative"' in bundle and 'e.METRIC="metric",e}' in bundle
    assert "this.range={xMin:void 0,xMax:void 0,yMin:void 0,yMax:void 0},this.xAxisKey=r.fj.STEP" in bundle  # LINE
    assert 'this.type=c.BAR,this.metricKey="",this.selectedMetricKeys=void 0,this.datasetName=void 0,' in bundle
    assert "is-band" in bundle  # the band a group's runs span
    assert 'const c="experimentRunColors",u=()=>{const e=window.localStorage.getItem(c)' in bundle
    assert 'static get metricPage(){return(0,r.Oz)("/metric/*")}' in bundle
    for field in ("runs", "metric", "experiments", "plot_metric_keys", "x_axis", "y_axis_scale"):
        assert f"&{field}=" in bundle or f"?{field}=" in bundle, field


def test_the_installed_mlflow_ui_shares_grouping_search_filter_and_listed_charts_as_the_views_use_them():
    """What the views rely on, read in the UI bundle of the installed MLflow: the grouping fields
    and values, the search filter among the shared facets, the run colour tag, a chart listed for a
    metric kept (not generated again) and a deleted one not drawn, and the run page's route."""
    build = Path(mlflow.__file__).parent / "server" / "js" / "build" / "static" / "js"
    bundle = "".join(path.read_text(errors="replace") for path in build.glob("*.js"))
    for field in ("groupBy", "useGroupedValuesInCharts"):
        assert f'"{field}"' in bundle, field
    assert 'Dataset="dataset",e.Tag="tag",e.Param="param"' in bundle  # RunGroupingMode
    assert 'e.Min="min",e.Average="average",e.Max="max"' in bundle  # RunGroupingAggregateFunction
    assert '["searchFilter","orderByKey","orderByAsc",' in bundle  # the facets a shared view sets
    assert f'T="{RUN_COLOR_TAG}"' in bundle
    assert 'e.BAR="BAR",e.LINE="LINE"' in bundle and 'e.STEP="step"' in bundle
    # a metric with a listed chart (found by its metricKey) keeps that chart, its section and deleted flag
    assert "x.forEach(e=>{const t=m.findIndex(t=>{const n=t.metricKey;return!!n&&n===e})>=0" in bundle
    assert "l.filter(e=>!e.deleted)" in bundle
    assert '"/experiments/:experimentId/runs/:runUuid"' in bundle


def test_a_description_longer_than_mlflows_limit_is_cut_at_a_line_end(tmp_path):
    client = mlflow.MlflowClient(f"sqlite:///{tmp_path / 'mlflow.db'}")
    run_id = client.create_run(client.create_experiment("notes")).info.run_id
    set_run_description(client, run_id, "| a | b |\n|---|---|\n| 1 | 2 |")
    assert client.get_run(run_id).data.tags[NOTE_TAG] == "| a | b |\n|---|---|\n| 1 | 2 |"
    rows = "\n".join(f"| {i} | {'x' * 60} |" for i in range(200))  # about 13,000 characters
    set_run_description(client, run_id, rows)
    note = client.get_run(run_id).data.tags[NOTE_TAG]
    kept, cut = note.rsplit("\n\n", 1)
    assert len(note) <= TAG_VALUE_LIMIT and rows.startswith(kept + "\n") and "limit" in cut


# --- mesh-train in a log file ----------------------------------------------------------------------


@pytest.mark.slow
def test_a_run_writes_plain_progress_lines_when_stderr_is_not_a_terminal(tmp_path, capsys, monkeypatch, fast):
    from experiments.train import train

    monkeypatch.setenv(PROGRESS_ENV, "0")  # a line after every step
    train(compose_config([*fast, f"runs_dir={tmp_path}"]))  # pytest's stderr is not a terminal
    lines = [line for line in capsys.readouterr().err.splitlines() if "[mesh-train]" in line]
    steps = [
        re.fullmatch(rf"{STAMP} \[mesh-train\] step (\d)/6 · loss [\d.]+ · [\d.]+ steps/s · ETA \d+s", x) for x in lines
    ]
    vals = [
        re.fullmatch(rf"{STAMP} \[mesh-train\] step (\d)/6 · val shakespeare loss [\d.]+ · ppl [\d.]+", x)
        for x in lines
    ]
    assert [int(m.group(1)) for m in steps if m] == [1, 2, 3, 4, 5, 6]
    assert [int(m.group(1)) for m in vals if m] == [3, 6]  # one line per validation
    assert all(s or v for s, v in zip(steps, vals, strict=True)), lines
    result = json.loads((next(tmp_path.glob("mesh/*/result.json"))).read_text())
    assert lines[-1].endswith(f"ppl {result['val_ppl']:.2f}")


def test_no_plain_lines_beside_a_progress_bar_and_none_in_the_run_hash(tmp_path, monkeypatch, fast):
    from experiments.trainer import run_callbacks

    plan = plan_run(compose_config([*fast, f"runs_dir={tmp_path}"]))

    class Terminal(io.StringIO):
        def isatty(self) -> bool:
            return True

    monkeypatch.setattr(sys, "stderr", Terminal())
    assert not [c for c in run_callbacks(plan, ["shakespeare"]) if isinstance(c, PlainProgress)]
    monkeypatch.setattr(sys, "stderr", io.StringIO())
    monkeypatch.setenv(PROGRESS_ENV, "12.5")
    (progress,) = [c for c in run_callbacks(plan, ["shakespeare"]) if isinstance(c, PlainProgress)]
    assert progress.every_s == 12.5 and progress.name == "mesh-train"
    assert plan_run(compose_config([*fast, f"runs_dir={tmp_path}"])).config_hash == plan.config_hash


def test_durations_read_as_in_an_eta():
    assert [duration(s) for s in (0.4, 45, 190, 3600 + 5 * 60 + 59)] == ["0s", "45s", "3m10s", "1h05m"]


# --- a grid in a log file, and its parent run ------------------------------------------------------


@pytest.fixture
def fast(grid_cell_overrides) -> list[str]:
    return grid_cell_overrides("probes.enabled=false")


def parent_of(runs_dir: Path):
    client = mlflow.MlflowClient(f"sqlite:///{runs_dir / 'mlflow.db'}")
    experiment = client.get_experiment_by_name("schemes")
    (parent,) = client.search_runs([experiment.experiment_id], "tags.kind = 'sweep'")
    return client, parent


def history(client, run_id: str, key: str) -> list[float]:
    return [m.value for m in sorted(client.get_metric_history(run_id, key), key=lambda m: m.timestamp)]


@pytest.mark.slow
def test_a_grid_in_a_log_says_each_start_and_end_and_its_parent_run_says_what_the_grid_is(tmp_path, fast):
    runs = tmp_path / "runs"
    args = ["scheme=base,mesh", *fast, f"runs_dir={runs}"]
    # The first cell fails at once (an intact checkpoint of no model: its resume fails), the second finishes.
    (base,) = [c for c in expand_cells("schemes", args, []) if c.label == "scheme=base"]
    broken = plan_run(compose_config(base.overrides)).run_dir / "checkpoints" / "last.ckpt"
    broken.parent.mkdir(parents=True)
    torch.save({"state_dict": {}, "global_step": 3}, broken)

    out = io.StringIO()  # not a terminal, as a SLURM log or nohup.out
    assert run_sweep("schemes", [*args, "launcher=local"], out=out) == 1
    text = out.getvalue()
    lines = [line for line in text.splitlines() if "[mesh-sweep]" in line]
    assert all(re.match(rf"{STAMP} \[mesh-sweep\] ", line) for line in lines), lines
    events = [line.split("] ", 1)[1] for line in lines[1:]]
    assert events[0] == "cell 1/2 started scheme=base"
    assert re.fullmatch(r"cell 1/2 FAILED scheme=base · \w+Error: .+ · wall \d+s · ETA \?", events[1]), events[1]
    assert events[2] == "cell 2/2 started scheme=mesh"
    finished = r"cell 2/2 FINISHED scheme=mesh · ([\d.]+) steps/s · val PPL ([\d.]+) · wall (\d+)s · ETA 0s"
    assert (match := re.fullmatch(finished, events[3])), events[3]
    summary = {o["label"]: o for o in json.loads(next(runs.glob("schemes/sweeps/*/summary.json")).read_text())}
    mesh = summary["scheme=mesh"]
    assert float(match.group(2)) == pytest.approx(mesh["val_ppl"], abs=0.01) and mesh["steps"] == 6
    assert mesh["steps_per_s"] > 0 and mesh["wall_s"] > 0

    # The table: every cell with its status, val loss and PPL, steps/s and wall time; then what next.
    rows = {r[1]: r for r in table_rows(text)}
    assert rows["scheme=mesh"][:5] == [
        "2",
        "scheme=mesh",
        "FINISHED",
        f"{mesh['val_loss']:.4f}",
        f"{mesh['val_ppl']:.2f}",
    ]
    assert rows["scheme=mesh"][5] == f"{mesh['steps_per_s']:.3g}" and rows["scheme=mesh"][6] == duration(mesh["wall_s"])
    assert rows["scheme=base"][2:6] == ["FAILED", "-", "-", "-"] and "Error" in rows["scheme=base"][7]
    client, parent = parent_of(runs)
    experiment_id = parent.info.experiment_id
    store = f"sqlite:///{runs / 'mlflow.db'}"
    assert f"results: mesh-results schemes --runs-dir {runs}\n" in text.replace(f"{Path(sys.executable).parent}/", "")
    assert text.rstrip().endswith(f"MLflow:  {runs_list_url(store, experiment_id, GROUPED_VIEW, ' ' * 9)}")
    assert SHARED_VIEW_TAG + KEY_METRICS_VIEW in client.get_experiment(experiment_id).tags
    # The grouped view, written when the grid started (no mesh-results ran): seeds folded by scheme.
    grouped = read_view(client.get_experiment(experiment_id).tags[SHARED_VIEW_TAG + GROUPED_VIEW])
    assert grouped["groupBy"]["groupByKeys"] == [{"mode": "tag", "groupByData": "scheme"}]

    # The parent: params (what the grid is), tags (how it was run), counts as each cell ended,
    # the table as its description, the summary as its artifact.
    assert parent.info.status == "FAILED"
    params = parent.data.params
    assert params["sweep"] == "schemes" and params["cells"] == "2" and params["grid.scheme"] == "base,mesh"
    assert params["overrides"] == " ".join([*fast, f"runs_dir={runs}"])
    tags = parent.data.tags
    assert tags["command"] == shlex.join(["mesh-sweep", "schemes", *args, "launcher=local"])
    assert tags["launcher"] == "local" and tags["git_commit"] and tags["progress"] == "2/2: 1 finished, 1 failed"
    # At the start, after each cell, at the end (the latest value is the last one).
    assert history(client, parent.info.run_id, "cells_failed") == [0, 1, 1, 1]
    assert history(client, parent.info.run_id, "cells_finished") == [0, 0, 1, 1]
    note = tags[NOTE_TAG]
    assert note.startswith("schemes: 2 cells\n\n| # | cell | status | val loss | val PPL | steps/s | wall | note |")
    assert "| 2 | scheme=mesh | FINISHED |" in note and note.rstrip().endswith(f"--runs-dir {runs}`")
    logged = Path(client.download_artifacts(parent.info.run_id, "summary.json", str(tmp_path)))
    assert json.loads(logged.read_text()) == list(summary.values())

    # Again, another way: the finished cell is listed once as skipped, the failed one runs again;
    # the same parent, its params as they were, its tags those of this invocation.
    again = io.StringIO()
    assert run_sweep("schemes", [*args, "launcher.workers=1"], out=again) == 1
    events = [line.split("] ", 1)[1] for line in again.getvalue().splitlines() if "[mesh-sweep]" in line]
    assert "0 already finished" not in events[0] and "1 already finished, 1 to run" in events[0]
    (skipped,) = [e for e in events if "SKIPPED" in e]
    assert (
        skipped
        == f"cell 2/2 SKIPPED scheme=mesh · {match.group(1)} steps/s · val PPL {match.group(2)} (finished before)"
    )
    assert not [e for e in events if e.startswith("cell 2/2 started")]
    assert [e for e in events if e.startswith("cell 1/2 ")][0] == "cell 1/2 started scheme=base"
    client, rerun = parent_of(runs)
    assert rerun.info.run_id == parent.info.run_id and rerun.data.params == params
    assert rerun.data.tags["launcher"] == "auto" and rerun.data.tags["command"].endswith("launcher.workers=1")
    assert rerun.data.metrics["cells_skipped"] == 1 and rerun.data.metrics["cells_failed"] == 1


def table_rows(text: str) -> list[list[str]]:
    rows = [line for line in text.splitlines() if re.match(r"\| \d+ \|", line)]
    return [[part.strip() for part in row.strip("|").split("|")] for row in rows]


def test_the_eta_counts_what_the_running_cells_have_left(monkeypatch):
    """6 cells, 2 at a time, 60 s each: when the first ends, its twin is about to end too, so 4
    queued cells on 2 slots leave 2 minutes (remaining x mean / at_once said 2m30s)."""
    from sweeps import progress
    from sweeps.cells import Cell, CellOutcome

    clock = [0.0]
    monkeypatch.setattr(progress.time, "monotonic", lambda: clock[0])
    out = io.StringIO()
    console = progress.GridConsole(out, total=6, to_run=6, at_once=2)
    assert console.eta() == "?"
    cells = [Cell(i, [f"seed={i}"], f"seed={i}") for i in range(6)]
    console.started(cells[0])
    console.started(cells[1])
    clock[0] = 60.0
    console.ended(CellOutcome(0, ["seed=0"], "FINISHED", "seed=0"))
    assert out.getvalue().rstrip().endswith("wall 1m00s · ETA 2m00s")
    # one queued cell and one running for 30 s of its 60: the last ends 60 s from now
    assert console.eta(now=60.0) == "2m00s"
    console.started(cells[2])
    clock[0] = 90.0
    console.ended(CellOutcome(1, ["seed=1"], "FINISHED", "seed=1"))  # mean 75 s; cell 2 has 45 s left
    assert console.eta(now=90.0) == "2m30s"
