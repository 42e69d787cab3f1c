"""Screenshots of a grid's MLflow views, taken in headless Chromium: the check by eye that the grouped
view (experiments/store/views.py) groups the seeds, ranks the groups, colours runs by scheme, charts
speed in its own section, leaves the bookkeeping metrics and the sweep's parent out, and that a
printed run link opens the run page, not the GenAI one. The views' JSON is tested in
tests/test_grid_console.py; what the UI draws from it is seen here.

    apt-get install -y chromium
    .venv/bin/python scripts/view_screenshots.py --out /tmp/views                  # a small store of its own
    .venv/bin/python scripts/view_screenshots.py --out /tmp/views --runs-dir runs  # the main job's store

Without ``--runs-dir`` it logs a small grid (three schemes, two seeds, metrics over 8 steps, a
sweep parent with its bookkeeping metrics) into a new store. Either way it runs ``mesh-results``
(which writes the views and tags the runs), serves the store with ``mlflow ui`` on a free port and
writes ``grouped-table.png``, ``grouped-charts.png``, ``flat-table.png``, ``parent.png`` and, for the
best run, ``run.png`` (its page) and ``run-metrics.png`` (its metric charts).
"""

from __future__ import annotations

import argparse
import math
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

CHROMIUM_FLAGS = (
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
    "--hide-scrollbars",
    "--virtual-time-budget=60000",  # the charts wait on metric histories
)
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


def screenshot(url: str, path: Path, height: int = 1000) -> None:
    """``url`` drawn 1600 pixels wide and ``height`` high into ``path``, in a fresh browser profile."""
    with tempfile.TemporaryDirectory(ignore_cleanup_errors=True) as profile:
        size = f"--window-size=1600,{height}"
        command = ["chromium", *CHROMIUM_FLAGS, size, f"--user-data-dir={profile}", f"--screenshot={path}", url]
        subprocess.run(command, check=True, capture_output=True, timeout=180)
    print(f"{path}  <- {url}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", required=True, help="folder for the screenshots")
    parser.add_argument("--runs-dir", help="a store's folder (runs/mlflow.db); default: a small store of its own")
    parser.add_argument("--experiment", default="schemes")
    args = parser.parse_args(argv)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    from experiments.store.views import GROUPED_VIEW, KEY_METRICS_VIEW
    from results.pipeline import build_report

    uri = f"sqlite:///{Path(args.runs_dir).resolve() / 'mlflow.db'}" if args.runs_dir else small_store(out)
    # A grid's own store keeps the notes its job wrote (mesh-demo's opens with its regime): the
    # report is built to tag the runs and write the views, not to publish over them.
    report = build_report(args.experiment, [args.experiment], uri, out / "report", publish_to_parents=not args.runs_dir)
    experiment_id = report.experiment_ids[args.experiment]
    port = free_port()
    ui = subprocess.Popen(
        [str(Path(sys.executable).parent / "mlflow"), "ui", "--backend-store-uri", uri, "--port", str(port)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    base = f"http://127.0.0.1:{port}"
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
        runs = f"{base}/#/experiments/{experiment_id}/runs?workflowType=machine_learning&viewStateShareKey="
        screenshot(f"{runs}{GROUPED_VIEW}", out / "grouped-table.png")
        screenshot(f"{runs}{GROUPED_VIEW}&compareRunsMode=CHART", out / "grouped-charts.png")
        screenshot(f"{runs}{KEY_METRICS_VIEW}", out / "flat-table.png")
        for parent in sweep_parents(uri, experiment_id):
            page = f"{base}/#/experiments/{experiment_id}/runs/{parent}?workflowType=machine_learning"
            screenshot(page, out / "parent.png")
        best = best_run(uri, experiment_id)
        screenshot(f"{base}/#/experiments/{experiment_id}/runs/{best}?workflowType=machine_learning", out / "run.png")
        metrics = f"{base}/#/experiments/{experiment_id}/runs/{best}/model-metrics?workflowType=machine_learning"
        screenshot(metrics, out / "run-metrics.png")
    finally:
        ui.terminate()
        ui.wait(timeout=30)
    return 0


if __name__ == "__main__":
    sys.exit(main())
