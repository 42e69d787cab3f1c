"""``mesh-sweep NAME [overrides]``: one ablation grid of the paper, end to end.

    mesh-sweep schemes                                   # the grid on the tiny CPU preset
    mesh-sweep schemes seeds=3 --dry-run                 # list the 18 runs, start nothing
    mesh-sweep buffer_slots model=mini launcher.workers=2
    mesh-sweep schemes model=pythia-410m trainer=gpu launcher=slurm launcher.partition=gpu resources=gpu1

Overrides of ``launcher``/``resources``/``seeds`` say how the grid runs; all others go to every
cell. A comma list (``scheme=base,mesh``) adds or replaces a grid axis, and a single value for
an axis of the grid (``scheme=mesh``) pins it. The grid comes from the
sweep file's ``hydra.sweeper.params``. Bookkeeping:

* one MLflow parent run per sweep, one child run per cell (``tracking.parent_run_id``);
* every cell is validated before anything trains; cells whose run already finished are
  skipped, interrupted ones resume;
* a failing cell is FAILED with its error and the others go on, also when its worker process
  dies (a signal, the OOM killer): the sweep then closes the cell's MLflow run FAILED itself; the
  summary at the end lists every cell, and the exit code is 1 if any failed;
* Ctrl-C stops the grid: running cells stop (their runs KILLED, tag ``interrupted``), cells not
  started never start, the parent run is KILLED, the summary says which cells finished, which
  were interrupted and which never ran, and the exit code is 130. Re-running resumes.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path

from omegaconf import OmegaConf

from experiments.compose import compose_config
from experiments.console import quiet_libraries, take_verbose_flag
from experiments.overrides import OverrideError, check_overrides
from experiments.plan import InputError, RunPlan, plan_run
from experiments.tracking import (
    RunRecord,
    TrackingError,
    artifact_location,
    open_run,
    prepare_sqlite_store,
    reopen_run,
    terminate_run,
)
from mesh_model import ConfigError
from mesh_model.cli_text import parser_for
from sweeps.cells import FAILED, FINISHED, INTERRUPTED, NOT_STARTED, SKIPPED, STATUSES, Cell, CellOutcome
from sweeps.config import LaunchConfig
from sweeps.grid import SweepError, compose_launch, expand_cells, fixed_overrides, split_arguments, sweep_key
from sweeps.grids import sweep_description, sweep_names
from sweeps.launchers import LaunchError

EXIT_INTERRUPTED = 130  # 128 + SIGINT, as a shell reports Ctrl-C


def sweep_dir_for(plan: RunPlan, key: str) -> Path:
    """``<runs_dir>/<experiment>/sweeps/<key>/``: the parent run's id, the summary, submitit's files."""
    return plan.run_dir.parent / "sweeps" / key


def parent_run(name: str, key: str, cells: Sequence[Cell], plans: Sequence[RunPlan]) -> tuple[str, str, Path]:
    """(tracking URI, parent run id, sweep dir); the parent is reused when the sweep re-runs: it is
    RUNNING again and the tags of how an earlier invocation stopped are cleared, so its final
    status and tags are those of the latest invocation."""
    import mlflow

    first = plans[0]
    sweep_dir = sweep_dir_for(first, key)
    sweep_dir.mkdir(parents=True, exist_ok=True)
    prepare_sqlite_store(first.tracking_uri)
    client = mlflow.MlflowClient(first.tracking_uri)
    id_file = sweep_dir / "parent_run_id"
    if id_file.exists():
        run_id = id_file.read_text().strip()
        reopen_run(client, run_id, client.get_run(run_id).data.tags)
    else:
        tags = {"sweep": name, "kind": "sweep", "cells": str(len(cells))}
        artifacts = artifact_location(first.tracking_uri, first.run_dir.parent)
        run_id = open_run(client, first.experiment, f"sweep:{key}", tags, artifacts)
        client.log_dict(run_id, {"cells": [c.overrides for c in cells]}, "cells.json")
        id_file.write_text(run_id)
    return first.tracking_uri, run_id, sweep_dir


def run_sweep(name: str, arguments: Sequence[str], dry_run: bool = False, out=sys.stdout) -> int:
    """Run the grid ``name``; 0 when every cell finished, 1 when one failed, 130 on Ctrl-C."""
    if name not in sweep_names():
        raise SweepError(f"sweep={name!r} is invalid: known sweeps: {', '.join(sweep_names())}")
    launch_overrides, cell_overrides = split_arguments(arguments)
    check_overrides(cell_overrides)
    launch = compose_launch(launch_overrides)
    base = compose_config([f"+sweep={name}", *fixed_overrides(cell_overrides)])
    if base.search.n_trials > 0:
        return run_search_sweep(name, base, cell_overrides, launch, dry_run, out)
    cells = expand_cells(name, cell_overrides, launch.seeds)
    if extra := launch.launcher.cell_overrides(launch.resources):
        cells = [Cell(c.index, [*c.overrides, *extra], c.label) for c in cells]
    plans = [plan_run(compose_config(c.overrides)) for c in cells]  # every cell checked before compute
    if dry_run:
        print(f"{name}: {len(cells)} runs ({sweep_description(name)})", file=out)
        for cell, plan in zip(cells, plans, strict=True):
            done = " [finished]" if plan.result_file.exists() else ""
            print(f"  {cell.index:3d}  {cell.label}{done}", file=out)
        return 0

    key = sweep_key(name, cells)
    launch.launcher.check(sweep_dir_for(plans[0], key) / "submitit", launch.resources)
    finished = [plan.result_file.exists() for plan in plans]  # read once: packing and skipping agree
    packing = launch.launcher.prepare([plan for plan, done in zip(plans, finished, strict=True) if not done])
    tracking_uri, parent_id, sweep_dir = parent_run(name, key, cells, plans)
    outcomes: dict[int, CellOutcome] = {}
    pending = []
    for cell, plan, done in zip(cells, plans, finished, strict=True):
        if done:
            outcomes[cell.index] = CellOutcome.from_result(cell, SKIPPED, json.loads(plan.result_file.read_text()))
        else:
            extra = [f"tracking.parent_run_id={parent_id}", f"tracking.sweep={name}"]
            pending.append(Cell(cell.index, [*cell.overrides, *extra], cell.label))
    fixed = " ".join(o for o in cells[0].overrides if o != f"+sweep={name}" and o not in cells[0].label.split())
    print(
        f"[mesh-sweep] {name}: {len(cells)} cells, {len(cells) - len(pending)} already finished, "
        f"{len(pending)} to run with launcher={launch.launcher.name}; every cell: {fixed or '(defaults)'}",
        file=out,
    )
    if packing and pending:
        print(f"[mesh-sweep] {packing}", file=out)

    def record(outcome: CellOutcome) -> None:
        cell = cells[outcome.index]
        outcome.overrides, outcome.label = cell.overrides, cell.label
        settle_run(tracking_uri, plans[outcome.index].run_dir, outcome)
        outcomes[outcome.index] = outcome
        print(f"[mesh-sweep] cell {outcome.index}: {outcome.status} {outcome.label}", file=out, flush=True)

    try:
        interrupted = launch_cells(launch.launcher.launch(pending, launch.resources, sweep_dir / "submitit"), record)
    except BaseException as error:  # the sweep itself broke: its parent run says so, then it propagates
        _close_parent(tracking_uri, parent_id, list(outcomes.values()), error=error)
        raise
    ordered = [outcomes.get(c.index) or CellOutcome.not_started(c) for c in cells]
    _close_parent(tracking_uri, parent_id, ordered, interrupted=interrupted)
    (sweep_dir / "summary.json").write_text(json.dumps([o.__dict__ for o in ordered], indent=2))
    print(summary_table(name, ordered), file=out)
    if interrupted:
        return EXIT_INTERRUPTED
    return 1 if any(o.status == FAILED for o in ordered) else 0


def launch_cells(outcomes: Iterator[CellOutcome], record: Callable[[CellOutcome], None]) -> bool:
    """Record every outcome the launcher yields; True when Ctrl-C stopped the grid.

    A launcher stops its running cells on KeyboardInterrupt, yields what became of them and raises
    it again (sweeps/launchers.py). When the interrupt lands here instead (between two outcomes),
    it is thrown into the launcher at its ``yield`` so that it does the same."""
    try:
        for outcome in outcomes:
            record(outcome)
        return False
    except KeyboardInterrupt:
        pass
    try:
        outcome = outcomes.throw(KeyboardInterrupt()) if hasattr(outcomes, "throw") else next(outcomes)
        while True:
            record(outcome)
            outcome = next(outcomes)
    except (KeyboardInterrupt, StopIteration):
        pass
    finally:
        if hasattr(outcomes, "close"):
            outcomes.close()
    return True


def settle_run(tracking_uri: str, run_dir: Path, outcome: CellOutcome) -> None:
    """Make the cell's MLflow run agree with its outcome when the cell's process could not close
    it (a worker killed by a signal leaves it RUNNING): FAILED with the ``error`` tag, or KILLED
    with the ``interrupted`` tag. A run its process closed is left as it is."""
    import mlflow
    from mlflow.exceptions import MlflowException

    id_file = run_dir / RunRecord.ID_FILE
    if outcome.status not in (FAILED, INTERRUPTED) or not id_file.exists():
        return
    run_id = id_file.read_text().strip()
    outcome.run_id = outcome.run_id or run_id
    outcome.run_dir = outcome.run_dir or str(run_dir)
    client = mlflow.MlflowClient(tracking_uri)
    try:
        if client.get_run(run_id).info.status != "RUNNING":
            return
        if outcome.status == FAILED:
            terminate_run(client, run_id, "FAILED", "error", outcome.error or "failed")
        else:
            terminate_run(client, run_id, "KILLED", "interrupted", outcome.error or "interrupted")
    except MlflowException as error:  # the run is gone from the store: nothing to settle
        print(f"[mesh-sweep] could not close MLflow run {run_id}: {str(error).splitlines()[0]}", file=sys.stderr)


def run_search_sweep(name: str, base, cell_overrides: Sequence[str], launch: LaunchConfig, dry_run: bool, out) -> int:
    """An Optuna search (sweeps/search.py); trials are cells under the sweep's parent run."""
    from sweeps.search import SearchError, default_storage, distributions, run_search

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
    launch.launcher.check(sweep_dir_for(plan, key) / "submitit", launch.resources)
    if packing := launch.launcher.prepare([plan] * search.n_trials):  # trials are alike in what they need
        print(f"[mesh-sweep] {packing}", file=out)
    tracking_uri, parent_id, sweep_dir = parent_run(name, key, [Cell(0, overrides)], [plan])
    base_overrides = [*overrides, f"tracking.parent_run_id={parent_id}", f"tracking.sweep={name}"]
    print(f"[mesh-sweep] {name}: Optuna search to {search.n_trials} trials, study {study_name!r}", file=out)

    def report(outcome: CellOutcome) -> None:
        if outcome.status in (FAILED, INTERRUPTED):
            settle_run(tracking_uri, plan_run(compose_config(outcome.overrides)).run_dir, outcome)
        print(f"[mesh-sweep] trial {outcome.index}: {outcome.status} {outcome.label}", file=out, flush=True)

    outcomes: list[CellOutcome] = []
    try:
        study, outcomes = run_search(
            search,
            study_name,
            storage,
            base_overrides,
            lambda cells: launch.launcher.launch(cells, launch.resources, sweep_dir / "submitit"),
            launch.launcher.concurrency,
            report,
            outcomes,
        )
    except KeyboardInterrupt:
        _close_parent(tracking_uri, parent_id, outcomes, interrupted=True)
        print(f"\n{name}: interrupted; running trials were stopped, re-run the command to resume the study", file=out)
        return EXIT_INTERRUPTED
    except BaseException as error:
        _close_parent(tracking_uri, parent_id, outcomes, error=error)
        raise
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
    return 1 if any(o.status == FAILED for o in outcomes) else 0


def _close_parent(
    tracking_uri: str,
    parent_id: str,
    outcomes: Sequence[CellOutcome],
    interrupted: bool = False,
    error: BaseException | None = None,
) -> None:
    """Counts of cells per status, then the parent's final status: KILLED (tag ``interrupted``) on
    Ctrl-C, FAILED when a cell failed or the sweep itself broke (tag ``error``), else FINISHED."""
    import mlflow

    client = mlflow.MlflowClient(tracking_uri)
    try:
        counts = {s: sum(o.status == s for o in outcomes) for s in STATUSES}
        for status, count in counts.items():
            client.log_metric(parent_id, f"cells_{status.lower()}", count)
        if isinstance(error, (KeyboardInterrupt, SystemExit)):
            interrupted, error = True, None
        if interrupted:
            done = f"{counts[FINISHED] + counts[SKIPPED]} finished, {counts[INTERRUPTED]} interrupted"
            client.set_tag(parent_id, "interrupted", f"Ctrl-C: {done}, {counts[NOT_STARTED]} never ran")
            client.set_terminated(parent_id, "KILLED")
        elif error is not None:
            client.set_tag(parent_id, "error", f"{type(error).__name__}: {error}"[:5000])
            client.set_terminated(parent_id, "FAILED")
        else:
            client.set_terminated(parent_id, "FAILED" if counts[FAILED] else "FINISHED")
    except Exception as failure:  # the store itself failed: the sweep's own error matters more
        if error is None:
            raise
        print(f"[mesh-sweep] could not close the parent run {parent_id}: {failure}", file=sys.stderr)


def summary_table(name: str, outcomes: Sequence[CellOutcome]) -> str:
    lines = [f"\n{name}: {len(outcomes)} cells", "| # | cell | status | val loss | note |", "|---|---|---|---|---|"]
    for o in outcomes:
        loss = f"{o.val_loss:.4f}" if o.val_loss is not None else "-"
        note = o.error or o.run_dir or ""
        lines.append(f"| {o.index} | {o.label} | {o.status} | {loss} | {note} |")
    counts = {s: sum(o.status == s for o in outcomes) for s in STATUSES}
    if counts[INTERRUPTED] or counts[NOT_STARTED]:
        finished = counts[FINISHED] + counts[SKIPPED]
        lines.append(
            f"interrupted: {finished} finished, {counts[FAILED]} failed, {counts[INTERRUPTED]} interrupted, "
            f"{counts[NOT_STARTED]} never ran; run the same command to resume"
        )
    elif counts[FAILED]:
        lines.append(f"{counts[FAILED]} failed")
    else:
        lines.append("all cells finished")
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    parser = parser_for("mesh-sweep", __doc__)
    parser.add_argument("name", nargs="?", help="the grid: " + ", ".join(sweep_names()))
    parser.add_argument("overrides", nargs="*", help="key=value overrides (launcher=, resources=, seeds=, any run key)")
    parser.add_argument("--dry-run", action="store_true", help="list the runs (count and overrides), start nothing")
    parser.add_argument("--list", action="store_true", help="list the sweeps")
    parser.add_argument(
        "-v", "--verbose", action="store_true", help="Lightning's and MLflow's INFO lines, in every cell"
    )
    args = parser.parse_intermixed_args(take_verbose_flag(list(sys.argv[1:] if argv is None else argv)))
    if args.list or not args.name:
        for name in sweep_names():
            print(f"{name:20s} {sweep_description(name)}")
        return 0
    quiet_libraries()  # the cells inherit the level through the environment
    try:
        return run_sweep(args.name, args.overrides, dry_run=args.dry_run)
    except (SweepError, OverrideError, ConfigError, InputError, TrackingError, LaunchError) as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:  # before the grid started (its own Ctrl-C is handled in run_sweep)
        print("[mesh-sweep] interrupted", file=sys.stderr)
        return EXIT_INTERRUPTED


if __name__ == "__main__":
    sys.exit(main())
