"""``mesh-sweep NAME [overrides]``: one ablation grid of the paper, end to end.

    mesh-sweep schemes                                   # the grid on the tiny CPU preset
    mesh-sweep schemes seeds=3 --dry-run                 # list the 18 runs, start nothing
    mesh-sweep buffer_slots model=mini launcher=parallel
    mesh-sweep schemes model=pythia-410m trainer=gpu launcher=slurm launcher.partition=gpu resources=gpu1

Overrides of ``launcher``/``resources``/``seeds`` say how the grid runs; all others go to every
cell. A comma list (``scheme=base,mesh``) adds or replaces a grid axis, and a single value for
an axis of the grid (``scheme=mesh``) pins it. The grid comes from the
sweep file's ``hydra.sweeper.params``. Bookkeeping:

* one MLflow parent run per sweep, one child run per cell (``tracking.parent_run_id``);
* every cell is validated before anything trains; cells whose run already finished are
  skipped, interrupted ones resume;
* a failing cell is FAILED with its error and the others go on; the summary at the end lists
  every cell, and the exit code is 1 if any failed.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import sys
import tempfile
from collections.abc import Iterable, Sequence
from pathlib import Path

from hydra._internal.core_plugins.basic_sweeper import BasicSweeper
from hydra.core.override_parser.overrides_parser import OverridesParser
from omegaconf import OmegaConf

from experiments.compose import compose_config
from experiments.launchers import (
    Cell,
    CellOutcome,
    LaunchError,
    launch_local,
    launch_parallel,
    launch_submitit,
    submitit_executor,
)
from experiments.overrides import OverrideError, check_overrides, group_options
from experiments.sweep_config import LAUNCHER_KINDS, LaunchConfig
from experiments.tracking import TrackingError, open_run, prepare_sqlite_store
from experiments.train import InputError, plan_run
from mesh_model import ConfigError
from sweeps import sweep_description, sweep_names

LAUNCH_KEYS = ("launcher", "resources", "seeds")


class SweepError(ValueError):
    """A bad sweep request; the message is one line."""


def split_arguments(arguments: Sequence[str]) -> tuple[list[str], list[str]]:
    """(launch overrides, cell overrides)."""
    launch, cells = [], []
    for argument in arguments:
        key = argument.lstrip("+~").split("=", 1)[0].split(".", 1)[0]
        (launch if key in LAUNCH_KEYS else cells).append(argument)
    return launch, cells


def compose_launch(overrides: Sequence[str]) -> LaunchConfig:
    normalized = []
    for override in overrides:  # seeds=3 means seeds 0, 1, 2
        key, _, value = override.partition("=")
        if key in ("launcher", "resources") and value not in group_options(key):
            raise SweepError(f"{key}={value!r} is invalid: known options: {', '.join(group_options(key))}")
        if key == "seeds" and value.isdigit():
            value = "[" + ",".join(str(s) for s in range(int(value))) + "]"
        elif key == "seeds" and not value.startswith("["):
            value = f"[{value}]"
        normalized.append(f"{key}={value}")
    try:
        launch = OmegaConf.to_object(compose_config(normalized, config_name="launch"))
    except Exception as error:
        raise SweepError(str(error).splitlines()[0]) from None
    assert isinstance(launch, LaunchConfig)
    if launch.launcher.kind not in LAUNCHER_KINDS:
        raise SweepError(f"launcher.kind={launch.launcher.kind!r} is invalid: known kinds: {', '.join(LAUNCHER_KINDS)}")
    return launch


def expand_cells(name: str, cell_overrides: Sequence[str], seeds: Sequence[int]) -> list[Cell]:
    """The grid: the sweep file's params, replaced or extended by comma lists on the command line."""
    base = compose_config([f"+sweep={name}", *_fixed(cell_overrides)], hydra_config=True)
    params = dict(OmegaConf.to_container(base.hydra.sweeper.params) or {})
    parser = OverridesParser.create()
    fixed = []
    for override in parser.parse_overrides(list(cell_overrides)):
        key = override.get_key_element()
        if override.is_sweep_override() or key in params:  # replaces the axis (one value pins it)
            params[key] = override.input_line.split("=", 1)[1]
        else:
            fixed.append(override.input_line)
    if seeds:
        params["seed"] = ",".join(str(s) for s in seeds)
    axes = parser.parse_overrides([f"{key}={value}" for key, value in params.items()])
    (combinations,) = BasicSweeper.split_arguments(axes, None)
    return [Cell(i, [f"+sweep={name}", *fixed, *combo], " ".join(combo)) for i, combo in enumerate(combinations)]


def _fixed(cell_overrides: Sequence[str]) -> list[str]:
    parsed = OverridesParser.create().parse_overrides(list(cell_overrides))
    return [o.input_line for o in parsed if not o.is_sweep_override()]


def sweep_key(name: str, cells: Sequence[Cell]) -> str:
    digest = hashlib.sha256(json.dumps([c.overrides for c in cells]).encode()).hexdigest()[:10]
    return f"{name}-{digest}"


def parent_run(name: str, key: str, cells: Sequence[Cell], plans: list) -> tuple[str, str, Path]:
    """(tracking URI, parent run id, sweep dir); the parent is reused when the sweep re-runs."""
    import mlflow

    first = plans[0]
    sweep_dir = first.run_dir.parent / "sweeps" / key
    sweep_dir.mkdir(parents=True, exist_ok=True)
    prepare_sqlite_store(first.tracking_uri)
    client = mlflow.MlflowClient(first.tracking_uri)
    id_file = sweep_dir / "parent_run_id"
    if id_file.exists():
        run_id = id_file.read_text().strip()
        client.update_run(run_id, status="RUNNING")
    else:
        tags = {"sweep": name, "kind": "sweep", "cells": str(len(cells))}
        artifacts = (first.run_dir.parent / "mlartifacts").as_uri() if first.tracking_uri.startswith("sqlite") else None
        run_id = open_run(client, first.config["tracking"]["experiment"], f"sweep:{key}", tags, artifacts)
        client.log_dict(run_id, {"cells": [c.overrides for c in cells]}, "cells.json")
        id_file.write_text(run_id)
    return first.tracking_uri, run_id, sweep_dir


def dispatch(cells: Sequence[Cell], launch: LaunchConfig, sweep_dir: Path) -> Iterable[CellOutcome]:
    kind = launch.launcher.kind
    if kind == "local":
        return launch_local(cells)
    if kind == "parallel":
        return launch_parallel(cells, launch.launcher.workers, launch.resources.cpus_per_task)
    return launch_submitit(cells, sweep_dir / "submitit", launch, local=kind == "submitit_local")


def run_sweep(name: str, arguments: Sequence[str], dry_run: bool = False, out=sys.stdout) -> int:
    if name not in sweep_names():
        raise SweepError(f"sweep={name!r} is invalid: known sweeps: {', '.join(sweep_names())}")
    launch_overrides, cell_overrides = split_arguments(arguments)
    check_overrides(cell_overrides)
    launch = compose_launch(launch_overrides)
    base = compose_config([f"+sweep={name}", *_fixed(cell_overrides)])
    if base.search.n_trials > 0:
        return run_search_sweep(name, base, cell_overrides, launch, dry_run, out)
    cells = expand_cells(name, cell_overrides, launch.seeds)
    if launch.resources.gpus_per_node > 0 and launch.launcher.kind == "slurm":
        devices = [f"trainer.devices={launch.resources.gpus_per_node}", f"trainer.num_nodes={launch.resources.nodes}"]
        cells = [Cell(c.index, [*c.overrides, *devices], c.label) for c in cells]
    plans = [plan_run(compose_config(c.overrides)) for c in cells]  # every cell checked before compute
    if dry_run:
        print(f"{name}: {len(cells)} runs ({sweep_description(name)})", file=out)
        for cell, plan in zip(cells, plans, strict=True):
            done = " [finished]" if plan.result_file.exists() else ""
            print(f"  {cell.index:3d}  {cell.label}{done}", file=out)
        return 0

    if launch.launcher.kind == "slurm":
        submitit_executor(Path(tempfile.gettempdir()), launch, local=False)  # fails fast without SLURM
    key = sweep_key(name, cells)
    tracking_uri, parent_id, sweep_dir = parent_run(name, key, cells, plans)
    outcomes: dict[int, CellOutcome] = {}
    pending = []
    for cell, plan in zip(cells, plans, strict=True):
        if plan.result_file.exists():
            outcomes[cell.index] = CellOutcome.from_result(cell, "SKIPPED", json.loads(plan.result_file.read_text()))
        else:
            extra = [f"tracking.parent_run_id={parent_id}", f"tracking.sweep={name}"]
            pending.append(Cell(cell.index, [*cell.overrides, *extra], cell.label))
    fixed = " ".join(o for o in cells[0].overrides if o != f"+sweep={name}" and o not in cells[0].label.split())
    print(
        f"[mesh-sweep] {name}: {len(cells)} cells, {len(cells) - len(pending)} already finished, "
        f"{len(pending)} to run with launcher={launch.launcher.kind}; every cell: {fixed or '(defaults)'}",
        file=out,
    )
    for outcome in dispatch(pending, launch, sweep_dir):
        outcome.overrides, outcome.label = cells[outcome.index].overrides, cells[outcome.index].label
        outcomes[outcome.index] = outcome
        print(f"[mesh-sweep] cell {outcome.index}: {outcome.status} {outcome.label}", file=out)
    ordered = [outcomes[c.index] for c in cells]
    failed = [o for o in ordered if o.status == "FAILED"]
    _close_parent(tracking_uri, parent_id, ordered)
    (sweep_dir / "summary.json").write_text(json.dumps([o.__dict__ for o in ordered], indent=2))
    print(summary_table(name, ordered), file=out)
    return 1 if failed else 0


def run_search_sweep(name: str, base, cell_overrides: Sequence[str], launch: LaunchConfig, dry_run: bool, out) -> int:
    """An Optuna search (experiments/search.py); trials are cells under the sweep's parent run."""
    from experiments.search import SearchError, default_storage, distributions, run_search

    search = OmegaConf.to_object(base.search)
    try:
        space = distributions(search)
    except SearchError as error:
        raise SweepError(str(error)) from None
    overrides = [f"+sweep={name}", *cell_overrides]
    plan = plan_run(base)
    storage = search.storage or default_storage(plan.run_dir.parent.parent)
    # The study is the same however many trials are asked for: search.* stays out of its key.
    key = sweep_key(name, [Cell(0, [o for o in overrides if not o.startswith("search.")])])
    study_name = search.study_name or key
    if dry_run:
        print(f"{name}: Optuna search, {search.n_trials} trials, study {study_name!r} in {storage}", file=out)
        for param, distribution in space.items():
            print(f"  {param}: {distribution}", file=out)
        return 0
    tracking_uri, parent_id, sweep_dir = parent_run(name, key, [Cell(0, overrides)], [plan])
    base_overrides = [*overrides, f"tracking.parent_run_id={parent_id}", f"tracking.sweep={name}"]
    kind = launch.launcher.kind
    round_size = 1 if kind == "local" else launch.launcher.max_parallel if kind == "slurm" else launch.launcher.workers
    print(f"[mesh-sweep] {name}: Optuna search to {search.n_trials} trials, study {study_name!r}", file=out)
    study, outcomes = run_search(
        search,
        study_name,
        storage,
        base_overrides,
        lambda cells: dispatch(cells, launch, sweep_dir),
        round_size,
        lambda o: print(f"[mesh-sweep] trial {o.index}: {o.status} {o.label}", file=out),
    )
    _close_parent(tracking_uri, parent_id, outcomes)
    lines = [f"\n{name}: {len(study.trials)} trials", "| trial | state | value | params |", "|---|---|---|---|"]
    for trial in study.trials:
        value = f"{trial.value:.4f}" if trial.value is not None else "-"
        params = " ".join(f"{k}={v:.4g}" if isinstance(v, float) else f"{k}={v}" for k, v in trial.params.items())
        lines.append(f"| {trial.number} | {trial.state.name} | {value} | {params} |")
    completed = [t for t in study.trials if t.state.name == "COMPLETE"]
    if completed:
        lines.append(f"best: trial {study.best_trial.number}, value {study.best_value:.4f}, {study.best_params}")
    print("\n".join(lines), file=out)
    return 1 if any(o.status == "FAILED" for o in outcomes) else 0


def _close_parent(tracking_uri: str, parent_id: str, outcomes: Sequence[CellOutcome]) -> None:
    import mlflow

    client = mlflow.MlflowClient(tracking_uri)
    counts = {s: sum(o.status == s for o in outcomes) for s in ("FINISHED", "SKIPPED", "FAILED", "PRUNED")}
    for status, count in counts.items():
        client.log_metric(parent_id, f"cells_{status.lower()}", count)
    client.set_terminated(parent_id, "FAILED" if counts["FAILED"] else "FINISHED")


def summary_table(name: str, outcomes: Sequence[CellOutcome]) -> str:
    lines = [f"\n{name}: {len(outcomes)} cells", "| # | cell | status | val loss | note |", "|---|---|---|---|---|"]
    for o in outcomes:
        loss = f"{o.val_loss:.4f}" if o.val_loss is not None else "-"
        note = o.error or o.run_dir or ""
        lines.append(f"| {o.index} | {o.label} | {o.status} | {loss} | {note} |")
    failed = sum(o.status == "FAILED" for o in outcomes)
    lines.append(f"{failed} failed" if failed else "all cells finished")
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="mesh-sweep", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("name", nargs="?", help="the grid: " + ", ".join(sweep_names()))
    parser.add_argument("overrides", nargs="*", help="key=value overrides (launcher=, resources=, seeds=, any run key)")
    parser.add_argument("--dry-run", action="store_true", help="list the runs (count and overrides), start nothing")
    parser.add_argument("--list", action="store_true", help="list the sweeps")
    args = parser.parse_intermixed_args(argv)
    if args.list or not args.name:
        for name in sweep_names():
            print(f"{name:20s} {sweep_description(name)}")
        return 0
    try:
        return run_sweep(args.name, args.overrides, dry_run=args.dry_run)
    except (SweepError, OverrideError, ConfigError, InputError, TrackingError, LaunchError) as error:
        print(f"error: {error}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
