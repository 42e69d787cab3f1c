"""``mesh-sweep NAME [overrides]``: one ablation grid of the paper, end to end.

    mesh-sweep schemes                                   # the grid on the tiny CPU preset
    mesh-sweep schemes seeds=3 --dry-run                 # count, cost and list the 18 runs, start nothing
    mesh-sweep schemes seeds=500 --yes                   # more than 200 cells: --yes, or answer y on a terminal
    mesh-sweep buffer_slots model=mini launcher.workers=2
    mesh-sweep schemes model=pythia-410m trainer=gpu launcher=slurm launcher.partition=gpu resources=gpu1
    mesh-sweep schemes launcher=slurm --detach           # submit the jobs and return
    mesh-sweep schemes launcher=slurm --status           # where each cell stands (any launcher)
    mesh-sweep schemes launcher=slurm --cancel           # cancel the grid's jobs; re-running continues

Overrides of ``launcher``/``resources``/``seeds`` say how the grid runs; all others go to every
cell. A comma list (``scheme=base,mesh``) adds or replaces a grid axis, and a single value for
an axis of the grid (``scheme=mesh``) pins it. The grid comes from the
sweep file's ``hydra.sweeper.params``. Bookkeeping:

* one MLflow parent run per sweep, one child run per cell (``tracking.parent_run_id``): the
  parent says what the grid is (params), how it was last run (tags: command, commit, launcher),
  how far it got (``cells_<status>`` metrics, updated as cells end) and, at the end, holds the
  summary table as its description and ``summary.json`` (sweeps/parent.py);
* a line when each cell starts and ends (``cell i/N``, with steps/s, val PPL, wall time and the
  grid's ETA), timestamped when the output is not a terminal; at the end the summary table and
  the commands that show the results (sweeps/progress.py);
* the cell count, then the FLOP model's estimate (CPU- or GPU-hours, checkpoints on disk), come
  first, before the cells are planned; a grid of more than 200 cells starts only once a terminal's
  answer or ``--yes`` confirms it (sweeps/estimate.py);
* every cell is validated before anything trains; cells whose run already finished are
  skipped, interrupted ones resume;
* a failing cell is FAILED with its error and the others go on, also when its worker process
  dies (a signal, the OOM killer): the sweep then closes the cell's MLflow run FAILED itself; the
  summary at the end lists every cell, and the exit code is 1 if any failed;
* a cell stopped on its own (its worker got SIGTERM: the run KILLED, ``last.ckpt`` saved) is
  INTERRUPTED and the others go on; the grid is not complete: the parent run is KILLED (tag
  ``interrupted``) unless a cell failed, and the exit code is 1;
* Ctrl-C stops the grid: running cells stop (their runs KILLED, tag ``interrupted``), cells not
  started never start, the parent run is KILLED, the summary says which cells finished, which
  were interrupted and which never ran, and the exit code is 130. Re-running resumes;
* ``--detach`` (``launcher=slurm``) submits the cells' jobs, writes their ids to the grid's
  ``jobs.json`` and returns: the parent run stays RUNNING (tag ``detached``) until ``--status``
  finds every cell ended, ``--cancel``, or a re-run. A re-run, attached or not, is refused while
  jobs of the grid are still queued or running. ``--status`` and ``--cancel``: sweeps/status.py.
"""

from __future__ import annotations

import json
import shlex
import sys
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import TextIO

from experiments.budget import tokens_text
from experiments.console import quiet_libraries, take_verbose_flag, timestamp
from experiments.evaluation.depth_record import evaluation_pending
from experiments.locks import RunInUseError, RunLock
from experiments.overrides import OverrideError
from experiments.plan import InputError, RunPlan
from experiments.store.sqlite import TrackingError
from experiments.store.views import ROW_TAG, write_grouped_view
from mesh_model import ConfigError
from mesh_model.cli_text import parser_for
from sweeps.catalogue import against_main_job, sweep_description, sweep_names
from sweeps.cells import SKIPPED, Cell, CellOutcome
from sweeps.closing import EXIT_INTERRUPTED, GridEnd, exit_code, finish, settle_run
from sweeps.estimate import confirmed, count_line, distinct_configs, estimate_grid
from sweeps.grid import SweepError, grid_key, launched_cells, plan_cells, read_request, sweep_dir_for
from sweeps.launch.base import LaunchError
from sweeps.parent import DETACHED_TAG, ParentRun, grid_params, invocation_tags, val_sets
from sweeps.progress import GridConsole, grid_command, summary_table
from sweeps.slurm_jobs import COMPLETING, job_states, live, read_jobs
from sweeps.status import cancel_grid, grid_status


def run_sweep(
    name: str,
    arguments: Sequence[str],
    dry_run: bool = False,
    out: TextIO | None = None,
    command: str | None = None,
    detach: bool = False,
    only: Callable[[Cell], bool] | None = None,
    yes: bool = False,
    stdin: TextIO | None = None,
    say_next: bool = True,
) -> int:
    """Run the grid ``name``; 0 when every cell finished, 1 when one failed or was stopped (or a
    big grid was not confirmed), 130 on Ctrl-C. ``detach``: submit the cells to the batch scheduler
    and return 0 at once. The cell count and the estimated cost come first, before any cell is
    planned; more than :data:`~sweeps.estimate.LARGE_GRID` cells start only with ``yes`` or the
    answer ``y`` on ``stdin`` (default: sys.stdin) when it is a terminal (sweeps/estimate.py).
    ``command`` is the command line as typed, for the parent run (default: ``mesh-sweep NAME ARGUMENTS``).
    ``only``: the cells to run (a sub-grid, with its own key and parent run: a stage of ``seeds=auto``).
    ``seeds=auto`` goes to the stage driver of the results layer (:func:`results_driver`).
    ``say_next=False``: no "results:" and "MLflow:" lines at the end (a caller that prints its own).
    ``out`` defaults to the ``sys.stdout`` of the call."""
    out = out or sys.stdout
    if "seeds=auto" in arguments:
        if detach:  # each stage's verdicts decide the next: the driver must wait for every stage
            raise SweepError("--detach does not go with seeds=auto: each stage is decided before the next is submitted")
        return results_driver("seeds_auto")(name, arguments, dry_run=dry_run, out=out, command=command)
    launch, cell_overrides, base = read_request(name, arguments)
    command = command or shlex.join(["mesh-sweep", name, *arguments])
    if detach and (base.search.n_trials > 0 or not launch.launcher.detaches):
        what = f"{name} is an Optuna search" if base.search.n_trials > 0 else f"launcher={launch.launcher.name}"
        raise SweepError(f"--detach needs a grid on a batch scheduler (launcher=slurm); {what}")
    if base.search.n_trials > 0:
        from sweeps.search import run_search_sweep  # Optuna: only for a search

        return run_search_sweep(name, base, cell_overrides, launch, dry_run, out, command)
    cells = launched_cells(name, cell_overrides, launch)
    if only is None:  # (a stage of seeds=auto is part of a grid whose driver sized it)
        configs = distinct_configs(cells)
        print(count_line(name, configs), file=out, flush=True)
        print(f"{name}: {estimate_grid(configs).describe()}", file=out, flush=True)
        if not dry_run and not confirmed(len(cells), yes, stdin or sys.stdin, out):
            print(f"{name}: not started", file=out)
            return 1
    plans = plan_cells(cells, launch)  # every cell checked before compute
    if only is not None:
        kept = [(c, p) for c, p in zip(cells, plans, strict=True) if only(c)]
        cells, plans = [Cell(i, c.overrides, c.label) for i, (c, _) in enumerate(kept)], [p for _, p in kept]
    if dry_run:
        print_dry_run(name, cells, plans, out)
        return 0

    key = grid_key(name, plans)
    sweep_dir = sweep_dir_for(plans[0], key)
    launch.launcher.check(sweep_dir / "submitit", launch.resources)
    # One mesh-sweep at a time per grid (a second one would submit or train its cells again); a
    # detached grid's jobs outlive it, and refuse_live_jobs sees those.
    with RunLock(sweep_dir, "grid"):
        refuse_live_jobs(sweep_dir, name, arguments)
        # read once: packing and skipping agree; a finished run whose depth_eval is not done runs again
        # (train() then only evaluates it)
        finished = [
            plan.result_file.exists() and not evaluation_pending(plan.run_dir, plan.train.depth_eval) for plan in plans
        ]
        packing = launch.launcher.prepare([plan for plan, done in zip(plans, finished, strict=True) if not done])
        shared = [o for o in cells[0].overrides if o != f"+sweep={name}" and o not in cells[0].label.split()]
        tags = invocation_tags(command, launch)
        params = grid_params(name, cells, shared)
        parent = ParentRun.open(name, key, plans[0], sweep_dir, cells, params, tags, val_sets(plans))
        # the view the closing lines link to: seeds folded under one row per group from the start
        parent.view = write_grouped_view(parent.client, parent.experiment_id, val_sets(plans), grid_group_key(params))
        outcomes: dict[int, CellOutcome] = {}
        pending = []
        for cell, plan, done in zip(cells, plans, finished, strict=True):
            if done:
                outcomes[cell.index] = CellOutcome.from_result(cell, SKIPPED, json.loads(plan.result_file.read_text()))
            else:
                extra = [f"tracking.parent_run_id={parent.run_id}", f"tracking.sweep={name}"]
                pending.append(Cell(cell.index, [*cell.overrides, *extra], cell.label))
        console = GridConsole(out, len(cells), len(pending), launch.launcher.concurrency)
        console.say(
            f"{name}: {len(cells)} cells, {len(cells) - len(pending)} already finished, "
            f"{len(pending)} to run with launcher={launch.launcher.name}; every cell: {' '.join(shared) or '(defaults)'}"
        )
        if packing and pending:
            console.say(packing)
        for outcome in outcomes.values():
            console.skipped(outcome)
        parent.try_progress(list(outcomes.values()), len(cells))
        if detach and pending:
            try:
                jobs = launch.launcher.submit(pending, launch.resources, sweep_dir / "submitit")
            except BaseException as error:  # nothing was submitted: the parent says why
                parent.close(list(outcomes.values()), len(cells), error=error)
                raise
            return detached(name, arguments, pending, jobs, parent, console, out)

        def record(outcome: CellOutcome) -> None:
            cell = cells[outcome.index]
            outcome.overrides, outcome.label = cell.overrides, cell.label
            settle_run(parent.tracking_uri, plans[outcome.index].run_dir, outcome)
            outcomes[outcome.index] = outcome
            console.ended(outcome)
            parent.try_progress(list(outcomes.values()), len(cells))

        started = launch.launcher.launch(pending, launch.resources, sweep_dir / "submitit", console.started)
        try:
            interrupted = launch_cells(started, record)
        except BaseException as error:  # the sweep itself broke: its parent run says so, then it propagates
            parent.close(list(outcomes.values()), len(cells), error=error)
            raise
        ordered = [outcomes.get(c.index) or CellOutcome.not_started(c) for c in cells]
        table = summary_table(name, ordered)
        finish(GridEnd(parent, plans[0], sweep_dir, len(cells)), ordered, table, interrupted, out, say_next)
        return exit_code(ordered, interrupted)


def grid_group_key(params: dict[str, str]) -> str:
    """The tag the grouped view folds seeds by while the grid runs, from its axes (the parent's
    ``grid.<axis>`` params): ``scheme`` where it varies only the scheme and the seed, else
    :data:`~experiments.store.views.ROW_TAG` (``mesh-results`` decides again from the runs)."""
    axes = {key.removeprefix("grid.") for key in params if key.startswith("grid.")}
    return "scheme" if axes <= {"scheme", "seed"} else ROW_TAG


DRIVERS = "mesh.sweep"  # entry points: what the results layer adds to mesh-sweep (pyproject.toml)


def results_driver(name: str) -> Callable[..., int]:
    """A mode of ``mesh-sweep`` that reads runs back (``seeds=auto``, ``--plan``): it lives in the
    results layer, which sweeps cannot import, and is found as the entry point ``name`` of
    :data:`DRIVERS`."""
    from importlib.metadata import distributions

    # Every installed copy's metadata, not just the first: a stale *.egg-info in the working
    # directory (from an older install) would otherwise hide the installed entry points.
    found = [ep for dist in distributions() for ep in dist.entry_points if ep.group == DRIVERS and ep.name == name]
    if not found:
        raise SweepError(
            f"{name} needs the entry point {DRIVERS}:{name} of this package: reinstall it (pip install -e .)"
        )
    return found[0].load()


def print_dry_run(name: str, cells: Sequence[Cell], plans: Sequence[RunPlan], out: TextIO) -> None:
    """The grid's runs (their count and cost came first), then what each step and each run trains
    on (global batch, tokens per step, steps, total tokens): once when every cell shares it, else
    after each cell."""
    print(f"{name}: {sweep_description(name)}", file=out)
    budgets = [plan.budget.describe() for plan in plans]
    shared = len(set(budgets)) == 1
    for cell, plan, budget in zip(cells, plans, budgets, strict=True):
        done = " [finished]" if plan.result_file.exists() else ""
        print(f"  {cell.index + 1:3d}  {cell.label}{done}", file=out)
        if not shared:
            print(f"       {budget}", file=out)
    if shared:
        print(f"every run: {budgets[0]}", file=out)
    total = sum(plan.budget.total_tokens for plan in plans)
    print(f"the grid: {tokens_text(total)} tokens in {len(plans)} runs", file=out)
    print(
        against_main_job([plan.budget.max_steps for plan in plans], len({plan.train.seed for plan in plans})), file=out
    )


def refuse_live_jobs(sweep_dir: Path, name: str, arguments: Sequence[str]) -> None:
    """Stop (SweepError) while SLURM jobs of this grid are queued, running or completing (a job
    being requeued passes through COMPLETING): started again, their cells would train twice.
    Asks SLURM only when the grid has jobs (``jobs.json``)."""
    states = job_states(read_jobs(sweep_dir).values()) or {}
    running = sorted(job for job, state in states.items() if live(state) or state == COMPLETING)
    if running:
        raise SweepError(
            f"{len(running)} SLURM job(s) of this grid are still queued, running or completing ({' '.join(running)}): "
            f"see them with `{grid_command(name, arguments, '--status')}`, stop them with `--cancel`, or wait"
        )


def detached(
    name: str,
    arguments: Sequence[str],
    pending: Sequence[Cell],
    jobs: Sequence[str],
    parent: ParentRun,
    console: GridConsole,
    out: TextIO,
) -> int:
    """Say which job runs each cell and how to follow them; 0. Each job's own process trains its
    cell and closes its MLflow run; the parent stays RUNNING, tagged ``detached``, for
    ``--status`` (or ``--cancel``) to close."""
    parent.set_tags({DETACHED_TAG: f"{timestamp()}: {len(jobs)} SLURM job(s) submitted: {' '.join(jobs)}"})
    for cell, job in zip(pending, jobs, strict=True):
        console.say(f"{console.position(cell.index)} submitted {cell.label} · SLURM job {job}")
    console.say(f"detached: {len(jobs)} SLURM job(s) run the grid without this process: {' '.join(jobs)}")
    print(f"status: {grid_command(name, arguments, '--status')}", file=out)
    print(f"cancel: {grid_command(name, arguments, '--cancel')}", file=out)
    out.flush()
    return 0


def launch_cells(outcomes: Iterator[CellOutcome], record: Callable[[CellOutcome], None]) -> bool:
    """Record every outcome the launcher yields; True when Ctrl-C stopped the grid.

    A launcher stops its running cells on KeyboardInterrupt, yields what became of them and raises
    it again (sweeps/launch/). When the interrupt lands here instead (between two outcomes),
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


def main(argv: Sequence[str] | None = None) -> int:
    parser = parser_for("mesh-sweep", __doc__)
    parser.add_argument("name", nargs="?", help="the grid: " + ", ".join(sweep_names()))
    parser.add_argument("overrides", nargs="*", help="key=value overrides (launcher=, resources=, seeds=, any run key)")
    parser.add_argument("--dry-run", action="store_true", help="list the runs (count and overrides), start nothing")
    parser.add_argument(
        "--plan", action="store_true", help="seeds and CPU-hours each primary claim needs at 80%% power; trains nothing"
    )
    parser.add_argument(
        "--yes", action="store_true", help="start a grid of more than 200 cells without asking (needed off a terminal)"
    )
    parser.add_argument("--list", action="store_true", help="list the sweeps")
    parser.add_argument(
        "--detach", action="store_true", help="launcher=slurm: submit the cells' jobs and return (see --status)"
    )
    parser.add_argument(
        "--status", action="store_true", help="each cell's state, last step and val loss; trains nothing"
    )
    parser.add_argument("--cancel", action="store_true", help="cancel the grid's SLURM jobs, close its runs KILLED")
    parser.add_argument(
        "-v", "--verbose", action="store_true", help="Lightning's and MLflow's INFO lines, in every cell"
    )
    typed = list(sys.argv[1:] if argv is None else argv)
    args = parser.parse_intermixed_args(take_verbose_flag(typed))
    if args.list or not args.name:
        for name in sweep_names():
            print(f"{name:20s} {sweep_description(name)}")
        return 0
    modes = [flag for flag in ("dry_run", "detach", "status", "cancel", "plan") if getattr(args, flag)]
    if len(modes) > 1:
        print(f"error: {' and '.join('--' + m.replace('_', '-') for m in modes)} do not go together", file=sys.stderr)
        return 2
    quiet_libraries()  # the cells inherit the level through the environment
    try:
        if args.plan:
            return results_driver("plan")(args.name, args.overrides, out=sys.stdout)
        if args.status or args.cancel:
            return (cancel_grid if args.cancel else grid_status)(args.name, args.overrides, sys.stdout)
        command = shlex.join(["mesh-sweep", *typed])
        return run_sweep(
            args.name, args.overrides, dry_run=args.dry_run, command=command, detach=args.detach, yes=args.yes
        )
    except (SweepError, OverrideError, ConfigError, InputError, TrackingError, LaunchError, RunInUseError) as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:  # before the grid started (its own Ctrl-C is handled in run_sweep)
        print("[mesh-sweep] interrupted", file=sys.stderr)
        return EXIT_INTERRUPTED


if __name__ == "__main__":
    sys.exit(main())
