"""``evaluate(settings)``: perplexity and lm-eval tasks at each shot count, into the run's MLflow run.

The pure entry point (tests import it); ``cli.py`` is the thin ``mesh-eval`` wrapper. Metrics,
all at the checkpoint's training step:

* ``eval/loss/<set>``, ``eval/ppl/<set>``: each validation set of the run's data config;
* ``eval/<k>shot/<task>/<metric>``: every number lm-eval reports (``acc``, ``acc_norm``,
  ``acc_stderr``, ...; a filter other than ``none`` adds ``/<filter>``);
* ``eval/<k>shot/avg``: the mean over the requested tasks of each one's headline metric
  (``suites.HEADLINE_METRIC``).

The full lm-eval results go to the artifact ``eval/results-step<N>-<time>.json`` (also written to
``<run dir>/eval/``).
"""

from __future__ import annotations

# MLflow, lm-eval and the model are imported inside the functions that use them: a refused task or
# store answers before any of them loads (lm-eval alone takes seconds).
import json
import logging
import os
import re
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from experiments.checkpoints import (
    RunFiles,
    RunInputError,
    load_model,
    load_tokenizer_and_data,
    locate,
)
from experiments.evaluation.suites import expand_suites, headline_metric, task_manager, task_specs
from experiments.store.check import check_tracking_uri
from experiments.store.sqlite import resolve_tracking_uri
from experiments.tracking import log_metrics

log = logging.getLogger(__name__)
# The most few-shot examples a prompt may hold: the largest count in common use (25-shot ARC of
# the Open LLM Leaderboard); the paper uses 0 and 5.
MAX_SHOTS = 25


@dataclass
class EvalSettings:
    """What ``mesh-eval`` was asked; see ``mesh-eval --help`` for each field."""

    target: str | None = None  # a checkpoint file or a run directory
    run: str | None = None  # or an MLflow run id (its run_dir tag gives the directory)
    tracking_uri: str | None = None
    tasks: list[str] = field(default_factory=lambda: ["paper9"])
    shots: list[int] = field(default_factory=lambda: [0, 5])
    limit: float | None = None
    include_paths: list[str] = field(default_factory=list)
    batch_size: int | str = 16
    device: str | None = "auto"
    perplexity: bool = True
    ppl_windows: int | None = None
    bootstrap_iters: int = 1000
    mlflow: bool = True
    output: str | None = None


@dataclass
class Target:
    files: RunFiles
    run_id: str | None
    tracking_uri: str | None


def resolve_target(settings: EvalSettings) -> Target:
    """The checkpoint, its run directory and the MLflow run to log into, all checked."""
    if (settings.target is None) == (settings.run is None):
        raise RunInputError("give a checkpoint or run directory, or --run RUN_ID (one of them)")
    if settings.run is not None:
        uri = resolve_tracking_uri(settings.tracking_uri, Path("runs").resolve(), os.environ)
        check_tracking_uri(uri)
        run = _get_run(uri, settings.run)
        run_dir = run.data.tags.get("run_dir")
        if not run_dir:
            raise RunInputError(f"MLflow run {settings.run} has no run_dir tag (not a mesh-train run)")
        return Target(locate(run_dir), settings.run, uri)
    files = locate(settings.target)  # type: ignore[arg-type]
    if files.run_id is None or not settings.mlflow:
        return Target(files, None, None)
    assert files.run_dir is not None
    configured = settings.tracking_uri or ((files.config or {}).get("tracking") or {}).get("tracking_uri")
    uri = resolve_tracking_uri(configured, files.run_dir.parent.parent, os.environ)  # <runs_dir>/<experiment>/<run>
    check_tracking_uri(uri)
    _get_run(uri, files.run_id)
    return Target(files, files.run_id, uri)


def _get_run(uri: str, run_id: str) -> Any:
    import mlflow
    from mlflow.exceptions import MlflowException

    try:
        return mlflow.MlflowClient(uri).get_run(run_id)
    except MlflowException:
        raise RunInputError(f"MLflow run {run_id} not found at {uri} (pass --tracking-uri)") from None


def check_settings(settings: EvalSettings) -> None:
    """Refuse, in one line, settings no evaluation can run with; before anything loads.

    Shot counts are integers from 0 to ``MAX_SHOTS``; ``limit`` is a count of examples (an
    integer >= 1) or a fraction in (0, 1). A task whose few-shot examples are a local file
    (ours, or a task of ``--include-path``) is checked against that file once the tasks are
    known (:func:`check_fewshot_pools`), still before the model loads.
    """
    shots = list(settings.shots)
    if not shots or any(not isinstance(k, int) or isinstance(k, bool) or not 0 <= k <= MAX_SHOTS for k in shots):
        raise RunInputError(
            f"--shots={','.join(map(str, shots))} is invalid: few-shot counts are integers from 0 to {MAX_SHOTS}, e.g. 0,5"
        )
    limit = settings.limit
    if limit is not None and not (0 < limit < 1 or (limit >= 1 and float(limit).is_integer())):
        raise RunInputError(
            f"--limit={limit:g} is invalid: a number of examples per task (an integer >= 1) or a fraction in (0, 1)"
        )
    if settings.ppl_windows is not None and settings.ppl_windows < 1:
        raise RunInputError(f"--ppl-windows={settings.ppl_windows} is invalid: must be >= 1 (or left out for all)")
    if settings.bootstrap_iters < 0:
        raise RunInputError(f"--bootstrap-iters={settings.bootstrap_iters} is invalid: must be >= 0")


def check_fewshot_pools(specs: list[str | dict[str, Any]], shots: list[int]) -> None:
    """A task whose few-shot split is a local JSON-lines file must hold at least ``max(shots)``
    examples (lm-eval would fail only after the model is loaded and perplexity is done)."""
    wanted = max(shots, default=0)
    for spec in specs:
        if not wanted or not isinstance(spec, dict):
            continue  # tasks given by name: only the MAX_SHOTS rule
        files = (spec.get("dataset_kwargs") or {}).get("data_files")
        split = spec.get("fewshot_split") or spec.get("training_split")
        path = files.get(split) if isinstance(files, dict) and split else None
        if not isinstance(path, str) or not path.endswith(".jsonl") or not Path(path).is_file():
            continue
        with open(path, encoding="utf-8") as file:
            pool = sum(1 for line in file if line.strip())
        if pool < wanted:
            raise RunInputError(
                f"--shots={wanted} is invalid for task {spec.get('task')}: its few-shot split has {pool} examples; "
                f"use at most {pool}"
            )


def evaluate(settings: EvalSettings) -> dict[str, Any]:
    """Evaluate one checkpoint; return the report (also logged to its MLflow run when it has one)."""
    check_settings(settings)
    target = resolve_target(settings)
    names = expand_suites(settings.tasks)
    include = [Path(p).expanduser().resolve() for p in settings.include_paths]
    manager = task_manager(names, include) if names else None  # unknown tasks fail here, before compute
    specs = task_specs(manager, names) if names else []
    check_fewshot_pools(specs, settings.shots)

    from experiments.evaluation.lm_eval_model import MeshLM, parse_batch_size, resolve_device
    from experiments.evaluation.perplexity import validation_perplexity

    device = resolve_device(settings.device)
    batch_size = parse_batch_size(settings.batch_size)
    model, step = load_model(target.files.checkpoint, device)
    prepared = load_tokenizer_and_data(target.files.config)
    metrics: dict[str, float] = {}
    perplexities: dict[str, dict[str, float]] = {}
    if settings.perplexity:
        seq_len = int(target.files.config["data"]["seq_len"])  # type: ignore[index]
        perplexities = validation_perplexity(model, prepared, seq_len, batch_size, settings.ppl_windows)
        for name, result in perplexities.items():
            metrics[f"eval/loss/{name}"] = result["loss"]
            metrics[f"eval/ppl/{name}"] = result["ppl"]

    lm = MeshLM(model, prepared.tokenizer, device=device, batch_size=batch_size)
    lm.checkpoint = str(target.files.checkpoint)
    lm_results: dict[str, Any] = {}
    if specs:
        from lm_eval.evaluator import simple_evaluate

        leaves = [spec["task"] if isinstance(spec, dict) else spec for spec in specs]
        for shots in settings.shots:
            results = simple_evaluate(
                model=lm,
                tasks=specs,
                num_fewshot=shots,
                limit=_limit(settings.limit),
                task_manager=manager,
                batch_size=batch_size,
                device=str(device),
                bootstrap_iters=settings.bootstrap_iters,
                log_samples=False,
            )
            assert results is not None  # rank 0
            lm_results[str(shots)] = results
            metrics.update(lm_eval_metrics(results, shots, leaves))

    report = {
        "checkpoint": str(target.files.checkpoint),
        "run_dir": str(target.files.run_dir) if target.files.run_dir else None,
        "run_id": target.run_id,
        "step": step,
        "settings": asdict(settings),
        "metrics": metrics,
        "perplexity": perplexities,
        "lm_eval": lm_results,
    }
    path = _write_report(report, settings.output, target.files.run_dir, step)
    report["report_path"] = str(path) if path else None
    if target.run_id is not None and target.tracking_uri is not None:
        log_to_mlflow(target.tracking_uri, target.run_id, metrics, step, path)
    return report


def _limit(limit: float | None) -> int | float | None:
    """lm-eval's ``limit``: a count of examples per task, or below 1 a fraction of them."""
    if limit is None:
        return None
    return int(limit) if limit >= 1 else limit


def lm_eval_metrics(results: dict[str, Any], shots: int, tasks: list[str]) -> dict[str, float]:
    """MLflow metrics from lm-eval's results at ``shots``: every number of every task and group,
    and ``avg`` over ``tasks`` of their headline metrics."""
    prefix = f"eval/{shots}shot"
    metrics: dict[str, float] = {}
    for task, values in results["results"].items():
        for key, value in values.items():
            if "," not in key or isinstance(value, bool) or not isinstance(value, (int, float)):
                continue  # "alias", "N/A" stderrs
            metric, filter_name = key.split(",", 1)
            name = metric if filter_name == "none" else f"{metric}/{filter_name}"
            metrics[_metric_name(f"{prefix}/{task}/{name}")] = float(value)
    headline = []
    for task in tasks:
        values = results["results"].get(task, {})
        metric = headline_metric(task, values)
        if metric is None:
            log.warning("%s reports none of its headline metric; left out of %s/avg", task, prefix)
            continue
        key = f"{metric},none" if f"{metric},none" in values else next(k for k in values if k.startswith(f"{metric},"))
        headline.append(float(values[key]))
    if headline:
        metrics[f"{prefix}/avg"] = sum(headline) / len(headline)
    return metrics


def _metric_name(name: str) -> str:
    """MLflow allows letters, digits, ``_ - . /`` and spaces in metric names."""
    return re.sub(r"[^\w\-./ ]", "_", name)


def _write_report(report: dict[str, Any], output: str | None, run_dir: Path | None, step: int) -> Path | None:
    from lm_eval.utils import handle_non_serializable

    if output:
        path = Path(output).expanduser()
    elif run_dir is not None:
        path = run_dir / "eval" / f"results-step{step}-{time.strftime('%Y%m%d-%H%M%S')}.json"
    else:
        return None
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(report, indent=2, default=handle_non_serializable) + "\n")
    return path


def log_to_mlflow(uri: str, run_id: str, metrics: dict[str, float], step: int, report: Path | None) -> None:
    """Metrics at ``step`` (1000 per request, MLflow's limit) and the report as an ``eval/`` artifact."""
    import mlflow

    client = mlflow.MlflowClient(uri)
    count = log_metrics(client, run_id, metrics, step)
    if report is not None:
        client.log_artifact(run_id, str(report), artifact_path="eval")
    print(f"[mesh-eval] {count} metrics logged to MLflow run {run_id} at step {step}", file=sys.stderr)
