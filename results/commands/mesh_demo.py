"""``mesh-demo``: the main job. The paper's central comparison at CPU scale, from one command.

Runs the ``schemes`` grid (vanilla, base, residual, anchor, anchor*, MeSH at the tiny preset's
1+2R2+1 layout) on the embedded Shakespeare corpus with two seeds, then builds the results
table, figures and report from MLflow, prints the ranking, and says where everything is: about
10-15 minutes with set-up on 2 free cores (10 min 21 s measured from a fresh clone); re-running it skips what already finished, so
`mesh-demo --seeds 3` adds a third seed to the same grid. It opens with the grid's regime and
what the one-pass reproduction found later in training (:mod:`results.commands.demo_regime`), and
ends with the grid's `mesh-sweep ... --status` command.

Every scheme runs at one peak LR (3e-3): the per-scheme LRs of the one-pass LR sweep were chosen
on another corpus (docs) at six times the tokens, so they would not be tuned here either; one LR
treats the schemes alike, and the regime line says so.
"""

# It runs a grid (sweeps) and then reads it back (results), so it lives in the top layer.

from __future__ import annotations

# torch, MLflow and the report's libraries are imported past --help, inside the job.
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from mesh_model.cli_text import parser_for
from sweeps.main_job import MAIN_JOB, MAIN_JOB_SEEDS, MAIN_JOB_STEPS

SWEEP = MAIN_JOB


def main_job_arguments(steps: int, seeds: int, runs_dir: str | Path, extra: Sequence[str] = ()) -> list[str]:
    """The ``mesh-sweep schemes`` arguments of the main job (benchmarks/grid_throughput.py runs them too)."""
    return [
        f"seeds={seeds}",
        f"max_steps={steps}",
        f"val_every={max(1, steps // 8)}",  # 8 validations (every 50 of 400 steps): the report's curves and spans
        f"checkpoint_every={max(1, steps // 4)}",
        f"runs_dir={runs_dir}",
        *extra,
    ]


def run_main_job(
    steps: int = MAIN_JOB_STEPS,
    seeds: int = MAIN_JOB_SEEDS,
    runs_dir: str = "runs",
    out: str | None = None,
    extra: Sequence[str] = (),
) -> int:
    from experiments.store.views import runs_list_url
    from results.pipeline import build_report
    from results.render.terminal import summary_lines
    from sweeps.progress import grid_command
    from sweeps.sweep import run_sweep

    runs = Path(runs_dir).resolve()
    out_dir = Path(out or f"results/{SWEEP}").resolve()
    arguments = main_job_arguments(steps, seeds, runs, extra)
    plan = plan_main_job(arguments, seeds)
    print("\n".join([plan.head, *plan.regime]), flush=True)  # planned, before any compute: no finding yet
    sweep_status = run_sweep(SWEEP, arguments, say_next=False)
    # the store the runs went to (tracking.tracking_uri, $MLFLOW_TRACKING_URI, else runs/mlflow.db), read back
    output = build_report(SWEEP, [SWEEP], plan.store, out_dir, opening=plan.context)
    print()
    print("\n".join(output.opening))  # this grid's answer, the decided result's regime, this one's
    print()
    print("\n".join(summary_lines(output.results, output.evaluations)).rstrip())
    print()
    print(f"Table:   {out_dir / 'table.md'} (every metric and test; table.tex and table.csv beside it)")
    print(f"Report:  {output.report} (the ranking, figures, probes and methods)")
    print(f"Claims:  {out_dir / 'claims.md'} (each claim of the paper these runs can test, with its verdict)")
    print(f"MLflow:  {runs_list_url(plan.store, output.experiment_ids[SWEEP], output.view, ' ' * 9)}")
    for page in output.published_pages:
        print(f"Parent:  {page}")
        print("         (its description: the ranking, the claims and the table)")
    print(f"Status:  {grid_command(SWEEP, arguments, '--status')}")
    print(f"Seeds:   mesh-demo --seeds {seeds + 1} adds seed {seeds} to every scheme (what finished is kept)")
    return sweep_status


@dataclass(frozen=True)
class MainJobPlan:
    head: str  # what the job runs
    regime: list[str]  # its regime, planned (results.commands.demo_regime.Regime.lines)
    context: list[str]  # what its answer is set beside: the decided result (another regime), then this regime
    store: str  # where its runs go: the cells' tracking URI


def plan_main_job(arguments: Sequence[str], seeds: int) -> MainJobPlan:
    """The job's plan before any compute: what it runs, its regime, the context its outputs set their
    answer beside (:func:`results.render.answer.opening`) and the store its cells log to."""
    from experiments.data.prepare import prepare
    from results.commands.demo_regime import later_training_lines, regime_of
    from sweeps.grid import grid_cells, read_request

    launch, cell_overrides, _ = read_request(SWEEP, arguments)
    _, plans = grid_cells(SWEEP, cell_overrides, launch)
    regime = regime_of(plans, seeds, prepare(plans[0].data).train_tokens)
    head = f"mesh-demo: the {SWEEP} grid ({', '.join(regime.schemes)}) at layouts " + ", ".join(
        dict.fromkeys(str(p.model_config.layout) for p in plans)
    )
    return MainJobPlan(head, regime.lines(), [*later_training_lines(), *regime.lines()], plans[0].tracking_uri)


def main(argv: Sequence[str] | None = None) -> int:
    parser = parser_for("mesh-demo", __doc__)
    parser.add_argument(
        "--steps", type=int, default=MAIN_JOB_STEPS, help=f"training steps per run (default {MAIN_JOB_STEPS})"
    )
    parser.add_argument(
        "--seeds", type=int, default=MAIN_JOB_SEEDS, help=f"seeds per scheme (default {MAIN_JOB_SEEDS})"
    )
    parser.add_argument("--runs-dir", default="runs")
    parser.add_argument("--out", default=None, help="report folder (default results/schemes)")
    parser.add_argument("overrides", nargs="*", help="more overrides for every run, e.g. model=mini")
    args = parser.parse_intermixed_args(argv)
    from experiments.console import quiet_libraries

    quiet_libraries()  # as mesh-sweep does: no MLflow INFO lines ("Creating initial MLflow database tables")
    return run_main_job(args.steps, args.seeds, args.runs_dir, args.out, args.overrides)


if __name__ == "__main__":
    sys.exit(main())
