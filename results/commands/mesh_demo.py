"""``mesh-demo``: the main job. The paper's central comparison at CPU scale, from one command.

Runs the ``schemes`` grid (vanilla, base, residual, anchor, anchor*, MeSH at the tiny preset's
1+2R2+1 layout) on the embedded Shakespeare corpus with two seeds, then builds the results
table, figures and report from MLflow, prints the ranking, and says where everything is. About
10-20 minutes on 2 CPU cores; re-running it skips what already finished, so
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
from pathlib import Path

from mesh_model.cli_text import parser_for

SWEEP = "schemes"


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
    steps: int = 400, seeds: int = 2, runs_dir: str = "runs", out: str | None = None, extra: Sequence[str] = ()
) -> int:
    from experiments.store.views import runs_list_url
    from results.pipeline import build_report
    from results.render.terminal import summary_lines
    from sweeps.progress import grid_command
    from sweeps.sweep import run_sweep

    runs = Path(runs_dir).resolve()
    out_dir = Path(out or f"results/{SWEEP}").resolve()
    arguments = main_job_arguments(steps, seeds, runs, extra)
    opening = opening_lines(arguments, seeds)
    print("\n".join(opening), flush=True)
    sweep_status = run_sweep(SWEEP, arguments, say_next=False)
    store = f"sqlite:///{runs / 'mlflow.db'}"
    output = build_report(SWEEP, [SWEEP], store, out_dir, opening=opening[1:])
    print()
    print("\n".join(summary_lines(output.results, output.evaluations)))
    print("\n".join(opening[1:]))
    print()
    print(f"Table:   {out_dir / 'table.md'} (every metric and test; table.tex and table.csv beside it)")
    print(f"Report:  {output.report} (the ranking, figures, probes and methods)")
    print(f"Claims:  {out_dir / 'claims.md'} (each claim of the paper these runs can test, with its verdict)")
    print(f"MLflow:  {runs_list_url(store, output.experiment_ids[SWEEP], output.view)}")
    for page in output.published_pages:
        print(f"Parent:  {page} (its description: the ranking, the claims and the table)")
    print(f"Status:  {grid_command(SWEEP, arguments, '--status')}")
    print(f"Seeds:   mesh-demo --seeds {seeds + 1} adds seed {seeds} to every scheme (what finished is kept)")
    return sweep_status


def opening_lines(arguments: Sequence[str], seeds: int) -> list[str]:
    """The job's first lines: what it runs, its regime (planned, before any compute) and what the
    one-pass reproduction found later in training."""
    from experiments.data.prepare import prepare
    from results.commands.demo_regime import later_training_lines, regime_of
    from sweeps.grid import grid_cells, read_request

    launch, cell_overrides, _ = read_request(SWEEP, arguments)
    _, plans = grid_cells(SWEEP, cell_overrides, launch)
    regime = regime_of(plans, seeds, prepare(plans[0].data).train_tokens)
    return [
        f"mesh-demo: the {SWEEP} grid ({', '.join(regime.schemes)}) at layouts "
        + ", ".join(dict.fromkeys(str(p.model_config.layout) for p in plans)),
        *regime.lines(),
        *later_training_lines(regime.tokens),
    ]


def main(argv: Sequence[str] | None = None) -> int:
    parser = parser_for("mesh-demo", __doc__)
    parser.add_argument("--steps", type=int, default=400, help="training steps per run (default 400)")
    parser.add_argument("--seeds", type=int, default=2, help="seeds per scheme (default 2)")
    parser.add_argument("--runs-dir", default="runs")
    parser.add_argument("--out", default=None, help="report folder (default results/schemes)")
    parser.add_argument("overrides", nargs="*", help="more overrides for every run, e.g. model=mini")
    args = parser.parse_intermixed_args(argv)
    from experiments.console import quiet_libraries

    quiet_libraries()  # as mesh-sweep does: no MLflow INFO lines ("Creating initial MLflow database tables")
    return run_main_job(args.steps, args.seeds, args.runs_dir, args.out, args.overrides)


if __name__ == "__main__":
    sys.exit(main())
