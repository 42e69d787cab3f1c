"""Screenshots of a grid's MLflow views, taken in headless Chromium (driven by Playwright): the
check by eye that the grouped view (experiments/store/views.py) draws each group's mean with the
band its seeds span, over the tokens seen, legends naming the schemes, the final stretch zoomed so
the rows separate, MeSH's routing curves in the routing section; that a training run's link opens
on its validation PPL; and the parent run's note. The views' JSON is tested in
tests/test_grid_console.py; what the UI draws from it is seen here.

    make screenshots                     # the main job's store (runs/, after make demo) into docs/ui
    .venv/bin/python scripts/view_screenshots.py --out /tmp/views  # a small store of its own

``make screenshots`` installs Chromium (apt-get, Debian) and Playwright (``pip install -e .[ui]``)
when missing. Without ``--runs-dir`` the script logs a small grid (three schemes, two seeds, metrics
over 400 steps, a sweep parent with its bookkeeping metrics) into a new store. Either way it runs
``mesh-results`` (which writes the views and tags the runs), serves the store with ``mlflow ui`` on
a free port and writes, 1600 pixels wide: ``grouped-charts.png`` (the grouped view's first charts),
``grouped-routing.png`` (its routing section), ``grouped-table.png``, ``run.png`` (the best run's
link: its validation PPL) and ``parent.png`` (the sweep's parent run and its note).

MLflow keeps a group's colour in the browser (localStorage), not in the store: the browser here is
given the scheme colours first (:func:`experiments.store.views.group_colors_script`, printed with
``--colors``), as a reader does by pasting that line into the browser's console once.
"""

from __future__ import annotations

import argparse
import contextlib
import math
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

WIDTH, HEIGHT = 1600, 1000
SCHEMES = {"base": 60.0, "anchor_emb": 57.0, "mesh": 55.0}  # final validation PPL of seed 0


def small_store(root: Path) -> str:
    """A sqlite store holding experiment ``schemes``: a sweep parent and three schemes x two seeds."""
    import mlflow
    from mlflow.entities import Metric

    from experiments.store.views import finished_run_note, set_run_description

    uri = f"sqlite:///{root / 'mlflow.db'}"
    client = mlflow.MlflowClient(uri)
    experiment = client.create_experiment("schemes", artifact_location=(root / "artifacts").as_uri())
    now = int(time.time() * 1000)
    parent = client.create_run(experiment, tags={"kind": "sweep", "mlflow.runName": "sweep:schemes"}).info.run_id
    counts = {"cells_finished": 6.0, "cells_failed": 0.0, "cells_pruned": 0.0}
    client.log_batch(parent, metrics=[Metric(k, v, now, 0) for k, v in counts.items()])
    client.set_terminated(parent, "FINISHED")
    for scheme, final in SCHEMES.items():
        for seed in (0, 1):
            tags = {"scheme": scheme, "layout": "1+2R2+1", "preset": "tiny", "seed": str(seed), "buffer_slots": ""}
            tags.update({"config_hash": f"{scheme}{seed}", "mlflow.parentRunId": parent})
            name = f"{scheme} s{seed} · tiny 1+2R2+1"
            run = client.create_run(experiment, tags={**tags, "mlflow.runName": name}, run_name=name).info.run_id
            facts = {"global_batch": 8.0, "flops_per_token": 1e6, "params_non_embedding": 2e5, "params_total": 1e6}
            metrics = [Metric(k, v, now, 0) for k, v in facts.items()]
            ends = {"time/steps_per_s": 4.0 + seed, "time/total_s": 120.0, "val_loss": math.log(final + seed + 1)}
            # what a probed run logs to MLflow: the summaries (experiments.probing.files.SUMMARY_METRICS)
            ends.update(
                {"probe/update/core_balance": 0.4, "probe/cka_rbf/loop_mean": 0.9, "probe/erank/loop_mean": 20.0}
            )
            metrics += [Metric(k, v, now + 400, 400) for k, v in ends.items()]
            for step in range(50, 401, 50):
                ppl = final + seed + 4000.0 / step
                metrics += [Metric("tokens", 2048.0 * step, now + step, step)]
                metrics += [Metric("routing/coef/coda/f2/mean", 1.0 if scheme == "base" else 0.8, now + step, step)]
                if scheme == "mesh":
                    metrics += [Metric("routing/loop2/read/entropy", 0.9 - step / 1000 - seed / 50, now + step, step)]
                metrics += [Metric("val/pile/ppl", ppl, now + step, step)]
                metrics += [Metric("val/pile/loss", math.log(ppl), now + step, step)]
                metrics += [Metric("train/loss", math.log(ppl) + 0.1, now + step, step)]
                metrics += [Metric("train/tokens_per_s", 9000.0 + 100 * seed, now + step, step)]
                metrics += [Metric("epoch", step / 100, now + step, step)]
            client.log_batch(run, metrics=metrics)
            last = {
                "val/pile/ppl": final + seed + 10.0,
                "train/loss": math.log(final + seed + 10.0) + 0.1,
                "steps": 400,
            }
            set_run_description(client, run, finished_run_note(last, ["pile"]))  # as train() writes it
            client.set_terminated(run, "FINISHED")
    return uri


def best_run(uri: str, experiment_id: str) -> str:
    """The finished training run of lowest validation loss."""
    import mlflow

    from experiments.store.views import TRAINING_RUNS_FILTER

    runs = mlflow.MlflowClient(uri).search_runs(
        [experiment_id], TRAINING_RUNS_FILTER, order_by=["metrics.val_loss ASC"]
    )
    return runs[0].info.run_id


def sweep_parents(uri: str, experiment_id: str) -> list[str]:
    """The run ids of the experiment's sweep parents."""
    import mlflow

    return [r.info.run_id for r in mlflow.MlflowClient(uri).search_runs([experiment_id], "tags.kind = 'sweep'")]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


ASSISTANT_CLOSE = '[data-component-id="mlflow.assistant.chat_panel.close"]'  # the panel's X (MLflow 3.x)


def close_assistant(page) -> None:
    """Close MLflow's assistant side panel, which covers a third of the page, when it is open: its
    close button, found by the component id MLflow gives it (its title is split over two elements,
    so finding the panel by its text does not work)."""
    close = page.locator(ASSISTANT_CLOSE)
    if close.count() and close.first.is_visible():
        close.first.click()
        page.wait_for_timeout(1000)


def screenshot(browser, url: str, path: Path, colors: str = "", scroll_to: str = "", wait_ms: int = 6000) -> None:
    """``url`` drawn at WIDTH x HEIGHT into ``path`` in a fresh browser context (``colors``: a line
    of JavaScript run on the UI's origin before the page, the group colours), the assistant panel
    closed, scrolled to the chart section titled ``scroll_to`` when given."""
    from playwright.sync_api import TimeoutError as PlaywrightTimeout

    context = browser.new_context(viewport={"width": WIDTH, "height": HEIGHT})
    if colors:
        context.add_init_script(colors)
    page = context.new_page()
    page.goto(url, wait_until="load", timeout=120_000)
    with contextlib.suppress(PlaywrightTimeout):  # a page without charts (a note) goes on after the wait
        page.wait_for_selector(".js-plotly-plot", timeout=wait_ms * 5)
    page.wait_for_timeout(wait_ms)  # the charts fetch every run's histories, then draw
    close_assistant(page)
    if scroll_to:
        page.get_by_text(scroll_to, exact=True).first.scroll_into_view_if_needed()
        page.mouse.wheel(0, 0)
        page.wait_for_timeout(wait_ms // 2)
    page.screenshot(path=str(path))
    context.close()
    print(f"{path}  <- {url}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", required=True, help="folder for the screenshots")
    parser.add_argument("--runs-dir", help="a store's folder (runs/mlflow.db); default: a small store of its own")
    parser.add_argument("--experiment", default="schemes")
    parser.add_argument("--colors", action="store_true", help="print the group colours' line of JavaScript and stop")
    args = parser.parse_args(argv)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    import mlflow

    from experiments.store.views import (
        GROUPED_VIEW,
        SHARED_VIEW_TAG,
        group_colors,
        group_colors_script,
        read_view,
        run_metric_url,
        runs_list_url,
        write_grouped_view,
        write_key_metrics_view,
    )
    from results.pipeline import build_report

    uri = f"sqlite:///{Path(args.runs_dir).resolve() / 'mlflow.db'}" if args.runs_dir else small_store(out)
    # A grid's own store keeps the notes its job wrote (mesh-demo's opens with its regime): the
    # report is built to tag the runs and write the views, not to publish over them.
    report = build_report(
        args.experiment,
        [args.experiment],
        uri,
        Path(tempfile.mkdtemp()) / "report",
        publish_to_parents=not args.runs_dir,
    )
    experiment_id = report.experiment_ids[args.experiment]
    client = mlflow.MlflowClient(uri)
    grouped = read_view(client.get_experiment(experiment_id).tags[SHARED_VIEW_TAG + GROUPED_VIEW])
    group_by = grouped["groupBy"]["groupByKeys"][0]["groupByData"]
    sets = [s["name"].removeprefix("val/") for s in grouped["compareRunSections"] if s["name"].startswith("val/")]
    # the views as this checkout writes them (a store's own may predate it)
    write_key_metrics_view(client, experiment_id, sets)
    write_grouped_view(client, experiment_id, sets, group_by)
    grouped = read_view(client.get_experiment(experiment_id).tags[SHARED_VIEW_TAG + GROUPED_VIEW])
    colors = group_colors_script(group_colors(client, experiment_id, group_by))
    if args.colors:
        print(colors)
        return 0
    port = free_port()
    ui = subprocess.Popen(
        [str(Path(sys.executable).parent / "mlflow"), "ui", "--backend-store-uri", uri, "--port", str(port)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    base = f"http://127.0.0.1:{port}"
    local = "http://127.0.0.1:5000"  # the address the project's links name (experiments.store.views.LOCAL_UI)
    try:
        deadline = time.monotonic() + 120
        while True:
            try:
                with urllib.request.urlopen(f"{base}/health", timeout=1):
                    break
            except OSError:
                if time.monotonic() > deadline or ui.poll() is not None:
                    raise SystemExit("mlflow ui did not answer within 120 s") from None
                time.sleep(0.5)
        from playwright.sync_api import sync_playwright

        charts = runs_list_url(f"{base}/", experiment_id, GROUPED_VIEW)
        table = charts.replace("&compareRunsMode=CHART", "")
        best = best_run(uri, experiment_id)
        page = run_metric_url(uri, experiment_id, best, f"val/{sets[0]}/ppl").replace(local, base)
        with sync_playwright() as playwright:
            browser = playwright.chromium.launch(executable_path=shutil.which("chromium"), args=["--no-sandbox"])
            screenshot(browser, charts, out / "grouped-charts.png", colors)
            screenshot(browser, charts, out / "grouped-routing.png", colors, scroll_to="routing")
            screenshot(browser, table, out / "grouped-table.png", colors)
            screenshot(browser, page, out / "run.png")
            for parent in sweep_parents(uri, experiment_id):
                parent_page = f"{base}/#/experiments/{experiment_id}/runs/{parent}?workflowType=machine_learning"
                screenshot(browser, parent_page, out / "parent.png")
            browser.close()
    finally:
        ui.terminate()
        ui.wait(timeout=30)
    return 0


if __name__ == "__main__":
    sys.exit(main())
