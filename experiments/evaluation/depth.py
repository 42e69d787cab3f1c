"""``mesh-eval RUN --loops 1,2,3,4,6,8`` and ``mesh-eval RUN --exit state,output``: a finished run's
checkpoint at other test-time loop counts, and with a training-free per-token exit.

Both read the validation windows training read (``data.val_batches`` batches of each validation
set, the data module's own loaders) and sum the loss as training's validation does
(:func:`validation_losses`), so the run at its own K gives its final ``val/<set>/loss`` exactly.
Logged into the run's MLflow run (docs/depth.md):

* ``depth/<set>/loss`` and ``depth/<set>/ppl`` at MLflow step K' (the model's ``loop_rule``); for a
  scheme with per-step parameters (MeSH, static, dynamic), also ``depth/<rule>/<set>/...`` for
  every rule asked (``--rule``, default ``last,cycle``);
* ``exit/<criterion>/<set>/ppl``, ``.../loss`` and ``.../loops_used`` (mean core steps per token)
  at MLflow step i, the i-th threshold of ``--exit-eps`` (``exit/<criterion>/eps`` holds it);
* the artifacts ``depth/depth.csv`` and ``depth/exit.csv`` (also under ``<run dir>/eval/``).
"""

from __future__ import annotations

import csv
import json
import math
import sys
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import torch

from experiments.checkpoints import RunInputError, load_model
from experiments.evaluation.depth_record import SETTINGS_FILE, evaluated_with
from mesh_model import ConfigError
from mesh_model.depth import EXIT_CRITERIA, LOOP_RULES, Depth, ExitRule

DEFAULT_EPS = (0.0, 0.001, 0.003, 0.01, 0.03, 0.1)


@dataclass
class DepthSettings:
    """What ``mesh-eval --loops/--exit`` was asked (see ``mesh-eval --help``)."""

    loops: list[int] | None = None  # None: no depth curve; [] : the default 1..4K
    rules: list[str] = field(default_factory=lambda: list(LOOP_RULES))
    exit: list[str] = field(default_factory=list)
    exit_eps: list[float] = field(default_factory=lambda: list(DEFAULT_EPS))
    exit_loops: int | None = None  # the most core steps a token may run under --exit (None: the run's K)

    def check(self) -> None:
        """One line for what no evaluation can run with, before the model loads."""
        if self.loops and any(isinstance(k, bool) or not isinstance(k, int) or k < 1 for k in self.loops):
            raise RunInputError(f"--loops={','.join(map(str, self.loops))} is invalid: loop counts are integers >= 1")
        for rule in self.rules:
            if rule not in LOOP_RULES:
                raise RunInputError(f"--rule={rule} is invalid: use {', '.join(LOOP_RULES)} (docs/depth.md)")
        for criterion in self.exit:
            if criterion not in EXIT_CRITERIA:
                raise RunInputError(f"--exit={criterion} is invalid: use {', '.join(EXIT_CRITERIA)} (docs/depth.md)")
        if any(not 0 <= e < math.inf for e in self.exit_eps):
            raise RunInputError(f"--exit-eps={self.exit_eps} is invalid: thresholds are finite numbers >= 0")
        if self.exit_loops is not None and self.exit_loops < 1:
            raise RunInputError(f"--exit-loops={self.exit_loops} is invalid: a loop count >= 1 (default: the run's K)")


@torch.no_grad()
def validation_losses(model: torch.nn.Module, loaders: dict[str, Any], depth: Depth | None = None) -> dict[str, dict]:
    """Per validation set: the token-mean loss as ``MeshLitModule.validation_step`` sums it (per
    batch, loss x sequences, over the set's loaders' windows), its perplexity, and with a per-token
    exit the mean core steps a token ran (``loops_used``)."""
    device = next(model.parameters()).device
    results = {}
    for name, loader in loaders.items():
        total, count, used, tokens = 0.0, 0, 0.0, 0
        for batch in loader:
            batch = batch.to(device)
            out = model(batch, labels=batch, return_logits=False, depth=depth)
            total += out.loss.item() * batch.shape[0]
            count += batch.shape[0]
            if out.loops_used is not None:
                used += float(out.loops_used.double().sum())
                tokens += out.loops_used.numel()
        totals = torch.tensor([total, float(count)], dtype=torch.float64)
        mean = (totals[0] / totals[1]).item()
        results[name] = {"loss": mean, "ppl": math.exp(min(mean, 50.0))}
        if tokens:
            results[name]["loops_used"] = used / tokens
    return results


def validation_loaders(config: dict[str, Any]) -> dict[str, Any]:
    """The run's validation loaders by metric name (``val/<name>/...``), as training built them."""
    from experiments.checkpoints import load_tokenizer_and_data
    from experiments.data import as_data_config
    from experiments.data.datamodule import TokenDataModule

    data = as_data_config(config["data"])
    module = TokenDataModule(data, seed=int(config.get("seed", 0)), prepared=load_tokenizer_and_data(config))
    names = [data.corpus if name == "val" else name for name in module.val_names]
    return dict(zip(names, module.val_dataloader(), strict=True))


def evaluate_depth(
    checkpoint: Path, config: dict[str, Any], settings: DepthSettings, device: str = "cpu"
) -> dict[str, Any]:
    """``depth`` and ``exit`` rows (every loop count under every rule, every exit criterion at
    every threshold, on every validation set), the run's K (``trained_loops``), its ``loop_rule``
    and the checkpoint's ``step``."""
    settings.check()
    model, step = load_model(checkpoint, device)
    trained = model.config.loops
    if model.state_passing is None:
        raise RunInputError(f"layout {model.config.layout!r} has no loop: --loops and --exit need a looped core")
    loops = settings.loops if settings.loops else list(range(1, 4 * trained + 1))
    if settings.loops is not None:
        if not model.config.loopable:  # even at its own K: a non-shared layout has no depth axis
            raise RunInputError(
                f"--loops={','.join(map(str, loops))} is invalid: layout {model.config.layout!r} has distinct core "
                "segments, no single shared-weight core to loop again; only P+CRK+Q layouts run another loop count"
            )
        try:
            for k in loops:
                model.loop_schedule(k)
        except ConfigError as error:
            raise RunInputError(f"--loops: {error}") from None
    try:
        model.loop_schedule(settings.exit_loops)
    except ConfigError as error:
        raise RunInputError(f"--exit-loops: {error}") from None
    per_step = model.config.scheme_spec.kind in ("mesh", "static", "dynamic") and model.config.parameter_loops > 1
    rules = settings.rules if per_step else [model.config.loop_rule]
    loaders = validation_loaders(config)
    depth_rows, exit_rows = [], []
    for rule in rules if settings.loops is not None else []:
        for k in loops:
            for name, result in validation_losses(model, loaders, Depth(loops=k, rule=rule)).items():
                depth_rows.append({"loops": k, "rule": rule, "set": name, **result})
    for criterion in settings.exit:
        for eps in settings.exit_eps:
            depth = Depth(loops=settings.exit_loops, exit=ExitRule(criterion, float(eps)))
            for name, result in validation_losses(model, loaders, depth).items():
                row = {"criterion": criterion, "eps": eps, "loops": settings.exit_loops or trained, "set": name}
                exit_rows.append({**row, **result})
    return {
        "depth": depth_rows,
        "exit": exit_rows,
        "trained_loops": trained,
        "loop_rule": model.config.loop_rule,
        "step": step,
    }


def depth_metrics(rows: list[dict], own_rule: str, by_rule: bool) -> dict[int, dict[str, float]]:
    """MLflow metrics by step (the loop count) from :func:`evaluate_depth`'s depth rows."""
    by_step: dict[int, dict[str, float]] = {}
    for row in rows:
        metrics = by_step.setdefault(row["loops"], {})
        for stat in ("loss", "ppl"):
            if row["rule"] == own_rule:
                metrics[f"depth/{row['set']}/{stat}"] = row[stat]
            if by_rule:
                metrics[f"depth/{row['rule']}/{row['set']}/{stat}"] = row[stat]
    return by_step


def exit_metrics(rows: list[dict], eps: list[float]) -> dict[int, dict[str, float]]:
    """MLflow metrics by step (the threshold's index in ``eps``) from the exit rows."""
    by_step: dict[int, dict[str, float]] = {}
    for row in rows:
        i = eps.index(row["eps"])
        metrics = by_step.setdefault(i, {})
        metrics[f"exit/{row['criterion']}/eps"] = row["eps"]
        for stat in ("loss", "ppl", "loops_used"):
            metrics[f"exit/{row['criterion']}/{row['set']}/{stat}"] = row[stat]
    return by_step


def write_csv(rows: list[dict], path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w", newline="") as file:
        writer = csv.DictWriter(file, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)
    return path


def run_depth(target: Any, settings: DepthSettings, device: str = "cpu", mlflow: bool = True) -> dict[str, Any]:
    """Evaluate ``target`` (an ``evaluate.Target``), write the CSVs, log them; the report."""
    files = target.files
    if files.config is None or files.run_dir is None:
        raise RunInputError("no config.yaml next to the checkpoint: its validation windows are unknown")
    report = evaluate_depth(files.checkpoint, files.config, settings, device)
    folder = files.run_dir / "eval" / f"depth-step{report['step']}"
    paths = [write_csv(report[kind], folder / f"{kind}.csv") for kind in ("depth", "exit") if report[kind]]
    if mlflow and target.run_id is not None and target.tracking_uri is not None:
        import mlflow as ml

        from experiments.tracking import log_metrics

        client = ml.MlflowClient(target.tracking_uri)
        rules = {row["rule"] for row in report["depth"]}
        logged = 0
        by_rule = len(rules) > 1 or report["loop_rule"] not in rules
        for k, metrics in depth_metrics(report["depth"], report["loop_rule"], by_rule).items():
            logged += log_metrics(client, target.run_id, metrics, k)
        for i, metrics in exit_metrics(report["exit"], settings.exit_eps).items():
            logged += log_metrics(client, target.run_id, metrics, i)
        for path in paths:
            client.log_artifact(target.run_id, str(path), artifact_path="depth")
        print(f"[mesh-eval] {logged} depth/exit metrics logged to MLflow run {target.run_id}", file=sys.stderr)
    if paths:  # last, once logged: a folder with it is complete (evaluated_with)
        (folder / SETTINGS_FILE).write_text(json.dumps(asdict(settings)))
    return {**report, "files": paths}


def depth_summary(report: dict[str, Any]) -> str:
    lines = [f"trained at K={report['trained_loops']} (step {report['step']})"]
    for row in report["depth"]:
        lines.append(f"  loops {row['loops']:3d} {row['rule']:6s} {row['set']:<24} ppl {row['ppl']:10.3f}")
    for row in report["exit"]:
        lines.append(
            f"  exit {row['criterion']:6s} eps {row['eps']:<8g} max {row['loops']:2d} {row['set']:<20} ppl {row['ppl']:10.3f}"
            f"  loops/token {row['loops_used']:.3f}"
        )
    lines += [f"  csv: {path}" for path in report["files"]]
    return "\n".join(lines)


__all__ = ["DepthSettings", "depth_summary", "evaluate_depth", "evaluated_with", "run_depth", "validation_losses"]
