"""Which lm-evaluation-harness tasks to run, which metric each reports, and how they are found.

``HEADLINE_METRIC`` is the one table of the metric each task contributes to the averages (the
paper's choice for its 9 tasks). ``SUITES`` names task lists: ``paper9`` (online: lm-eval
downloads its datasets from the Hugging Face Hub once, then ``datasets`` serves them from its
cache) and ``local`` (the small offline tasks in ``tasks/`` next to this file).
"""

from __future__ import annotations

import glob
import os
from pathlib import Path
from typing import Any

LOCAL_TASKS_DIR = Path(__file__).resolve().parent / "tasks"

# task -> the metric that goes into eval/<k>shot/avg. MeSH (ICLR 2026), "Evaluation": acc for
# LAMBADA, Winogrande and MMLU (continuation), acc_norm for the rest; then our local tasks.
HEADLINE_METRIC: dict[str, str] = {
    "lambada_openai": "acc",
    "lambada_standard": "acc",
    "piqa": "acc_norm",
    "hellaswag": "acc_norm",
    "arc_easy": "acc_norm",
    "arc_challenge": "acc_norm",
    "sciq": "acc_norm",
    "winogrande": "acc",
    "mmlu_continuation": "acc",
    "mesh_lambada": "acc",
    "mesh_choice": "acc_norm",
    "mesh_generate": "exact_match",
}
# Tasks outside the table: the first of these they report.
FALLBACK_METRICS = ("acc", "exact_match", "acc_norm")
SUITES: dict[str, list[str]] = {
    "paper9": list(HEADLINE_METRIC)[:9],
    "local": ["mesh_lambada", "mesh_choice", "mesh_generate"],
}


class TaskError(ValueError):
    """A task name or task folder that cannot be used; the message is one line."""


def expand_suites(names: list[str]) -> list[str]:
    """``paper9,piqa`` -> the 9 paper tasks (piqa once); order kept, duplicates dropped."""
    out: list[str] = []
    for name in names:
        for task in SUITES.get(name, [name]):
            if task not in out:
                out.append(task)
    return out


def headline_metric(task: str, metrics: dict[str, Any]) -> str | None:
    """The metric of ``task`` that counts for the average, given lm-eval's ``{"acc,none": ...}``."""
    reported = {key.split(",")[0] for key in metrics if "," in key and not key.split(",")[0].endswith("_stderr")}
    wanted = HEADLINE_METRIC.get(task)
    if wanted is not None:
        return wanted if wanted in reported else None
    return next((m for m in FALLBACK_METRICS if m in reported), None)


def task_manager(names: list[str], include_paths: list[Path]) -> Any:
    """A ``TaskManager`` that knows ``names``: our local folder and ``include_paths`` only when that
    suffices (building lm-eval's full index of built-in tasks takes ~12 s), else those plus the
    built-in tasks. Unknown names raise :class:`TaskError`."""
    from lm_eval.tasks import TaskManager

    paths = [LOCAL_TASKS_DIR, *include_paths]
    for path in include_paths:
        if not path.is_dir():
            raise TaskError(f"--include-path {path} is not a folder")
    manager = TaskManager(include_path=[str(p) for p in paths], include_defaults=False)
    if not set(names) <= set(manager.all_tasks):
        manager = TaskManager(include_path=[str(p) for p in paths], include_defaults=True)
    unknown = [name for name in names if name not in manager.all_tasks]
    if unknown:
        raise TaskError(
            f"unknown task {unknown[0]!r}: not a suite ({', '.join(SUITES)}), a local task "
            f"({', '.join(SUITES['local'])}), a task of --include-path or an lm-eval task (`lm_eval ls tasks`)"
        )
    return manager


def task_specs(manager: Any, names: list[str]) -> list[str | dict[str, Any]]:
    """What to hand ``simple_evaluate``: a name, or, for a YAML task whose ``data_files`` are
    relative paths, its full config with those paths made absolute against the YAML's folder.

    lm-eval resolves relative ``data_files`` against the working directory, so a task folder would
    only work when run from inside it. Tags (``mesh_local``) are expanded into their tasks so each
    gets the same treatment; groups are passed by name (their tasks' paths stay as written).
    """
    from lm_eval.tasks._index import Kind  # lm-eval 0.4.x; pinned <0.5 in pyproject.toml

    specs: list[str | dict[str, Any]] = []
    for name in names:
        entry = manager.task_index[name]
        members = sorted(entry.tags) if entry.kind == Kind.TAG else [name]
        for member in members:
            spec = _absolute_data_files(manager.task_index[member])
            if spec not in specs:
                specs.append(spec)
    return specs


def _absolute_data_files(entry: Any) -> str | dict[str, Any]:
    from lm_eval.tasks._index import Kind
    from lm_eval.tasks._yaml_loader import load_yaml

    if entry.kind != Kind.TASK or entry.yaml_path is None:
        return entry.name
    config = load_yaml(entry.yaml_path, resolve_func=True)
    kwargs = config.get("dataset_kwargs") or {}
    if "data_files" not in kwargs:
        return entry.name
    base = Path(entry.yaml_path).parent
    absolute = _rebase(kwargs["data_files"], base)
    if absolute == kwargs["data_files"]:
        return entry.name
    config["dataset_kwargs"] = {**kwargs, "data_files": absolute}
    return config


def _rebase(value: Any, base: Path) -> Any:
    """Relative paths (or globs) that exist under ``base`` -> absolute; anything else unchanged."""
    if isinstance(value, str):
        if "://" in value or os.path.isabs(os.path.expanduser(value)):
            return value
        candidate = base / value
        return str(candidate) if candidate.exists() or glob.glob(str(candidate)) else value
    if isinstance(value, list):
        return [_rebase(v, base) for v in value]
    if isinstance(value, dict):
        return {k: _rebase(v, base) for k, v in value.items()}
    return value
