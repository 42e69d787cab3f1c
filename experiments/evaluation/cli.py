"""``mesh-eval``: evaluate a checkpoint, a run directory or an MLflow run; results into its MLflow run.

mesh-eval runs/mesh/<run key>                            # perplexity + the paper's 9 tasks at 0 and 5 shots
mesh-eval runs/mesh/<run key> --tasks local --limit 20   # offline: the small tasks shipped here
mesh-eval --run <MLflow run id> --tracking-uri sqlite:///runs/mlflow.db --tasks piqa,sciq --shots 0
mesh-eval runs/mesh/<run key> --loops 1,2,3,4,6,8       # validation PPL at other loop counts (docs/depth.md)
mesh-eval runs/mesh/<run key> --exit state,output        # per-token exit: PPL against loops used per token
"""

from __future__ import annotations

import argparse
import logging
import sys
from typing import TYPE_CHECKING, Any, NoReturn

from experiments.console import quiet_libraries, take_verbose_flag
from experiments.evaluation.suites import SUITES, TaskError
from experiments.store.sqlite import TrackingError
from mesh_model.cli_text import parser_for

if TYPE_CHECKING:
    from experiments.evaluation.evaluate import EvalSettings


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:  # one line, like every other error of mesh-eval
        print(f"error: {message}", file=sys.stderr)
        sys.exit(2)


def _csv(value: str) -> list[str]:
    return [item.strip() for item in value.split(",") if item.strip()]


def _shots(value: str) -> list[int]:
    """Integers only; their range is checked by ``evaluate.check_settings``."""
    try:
        return [int(item) for item in _csv(value)]
    except ValueError:
        raise argparse.ArgumentTypeError(f"{value!r} is not a comma-separated list of integers") from None


def _loops(value: str) -> list[int]:
    """``--loops`` alone: [] (the default 1..4K); else integers, checked by ``DepthSettings.check``."""
    try:
        return [int(item) for item in _csv(value)]
    except ValueError:
        raise argparse.ArgumentTypeError(f"{value!r} is not a comma-separated list of loop counts") from None


def _floats(value: str) -> list[float]:
    try:
        return [float(item) for item in _csv(value)]
    except ValueError:
        raise argparse.ArgumentTypeError(f"{value!r} is not a comma-separated list of numbers") from None


def parser() -> argparse.ArgumentParser:
    suites = "; ".join(f"{name} = {','.join(tasks)}" for name, tasks in SUITES.items())
    p = parser_for("mesh-eval", __doc__, parser_class=_Parser)
    p.add_argument("target", nargs="?", help="a checkpoint (.ckpt inside a run directory) or a run directory")
    p.add_argument("--run", help="an MLflow run id instead of a path (its run_dir tag locates the checkpoint)")
    p.add_argument(
        "--tracking-uri", help="MLflow store (default: the run's own, else $MLFLOW_TRACKING_URI, else sqlite)"
    )
    p.add_argument(
        "--tasks",
        type=_csv,
        default=["paper9"],
        help=f"comma-separated lm-eval tasks, tags or suites, 'none' for perplexity only (default paper9). {suites}. "
        "paper9 downloads its datasets from the Hugging Face Hub on first use; local needs no network",
    )
    p.add_argument("--shots", type=_shots, default=[0, 5], help="few-shot counts, comma-separated (default 0,5)")
    p.add_argument(
        "--limit", type=float, help="examples per task, an integer >= 1 (or a fraction in (0, 1)); for quick checks"
    )
    p.add_argument("--include-path", action="append", default=[], help="a folder of task YAMLs (repeatable)")
    p.add_argument("--batch-size", default="16", help="requests per forward pass (default 16)")
    p.add_argument("--device", default="auto", help="auto (cuda if present), cpu, cuda, cuda:1, ...")
    p.add_argument("--no-perplexity", action="store_true", help="skip perplexity on the validation sets")
    p.add_argument("--ppl-windows", type=int, help="at most this many windows per validation set (default: all)")
    p.add_argument("--bootstrap-iters", type=int, default=1000, help="lm-eval's bootstrap for stderrs (default 1000)")
    p.add_argument("--no-mlflow", action="store_true", help="do not log to the run's MLflow run")
    p.add_argument("--output", help="write the report JSON here (default: <run dir>/eval/)")
    p.add_argument(
        "--loops",
        type=_loops,
        nargs="?",
        const=[],
        help="test-time loop counts, e.g. 1,2,3,4,6,8 (alone: 1 to 4K): validation loss and PPL at each, logged as "
        "depth/<set>/ppl at MLflow step K'; runs instead of perplexity and tasks (docs/depth.md)",
    )
    p.add_argument(
        "--rule", type=_csv, default=["last", "cycle"], help="MeSH's router rules past K (default last,cycle)"
    )
    p.add_argument("--exit", type=_csv, default=[], help="per-token exit criteria: state, output (docs/depth.md)")
    p.add_argument(
        "--exit-eps", type=_floats, default=None, help="exit thresholds (default 0,0.001,0.003,0.01,0.03,0.1)"
    )
    p.add_argument(
        "--exit-loops", type=int, help="the most core steps a token runs under --exit (default: the run's K)"
    )
    p.add_argument("-v", "--verbose", action="store_true", help="lm-eval's, Lightning's and MLflow's INFO logging")
    return p


def settings_from(args: argparse.Namespace) -> EvalSettings:
    from experiments.evaluation.evaluate import EvalSettings

    tasks = [] if args.tasks == ["none"] else args.tasks
    return EvalSettings(
        target=args.target,
        run=args.run,
        tracking_uri=args.tracking_uri,
        tasks=tasks,
        shots=args.shots,
        limit=args.limit,
        include_paths=args.include_path,
        batch_size=args.batch_size,
        device=args.device,
        perplexity=not args.no_perplexity,
        ppl_windows=args.ppl_windows,
        bootstrap_iters=args.bootstrap_iters,
        mlflow=not args.no_mlflow,
        output=args.output,
    )


def summary(report: dict[str, Any]) -> str:
    lines = [f"checkpoint {report['checkpoint']} (step {report['step']})"]
    for name, result in report["perplexity"].items():
        lines.append(
            f"  ppl   {name:<28} {result['ppl']:10.3f}  (loss {result['loss']:.4f}, {result['tokens']:,} tokens)"
        )
    for key, value in sorted(report["metrics"].items()):
        parts = key.split("/")
        if key.endswith("/avg") or (len(parts) == 4 and not parts[3].endswith("_stderr")):
            lines.append(f"  {parts[1]:<5} {'/'.join(parts[2:]):<28} {value:10.4f}")
    if report["run_id"] is None:
        lines.append("  (no MLflow run for this checkpoint: nothing logged)")
    if report["report_path"]:
        lines.append(f"  report: {report['report_path']}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    logging.getLogger("lm_eval").setLevel(logging.INFO if args.verbose else logging.ERROR)
    take_verbose_flag(["-v"] if args.verbose else [])
    quiet_libraries()
    from experiments.checkpoints import RunInputError  # torch: only past --help
    from experiments.evaluation.evaluate import evaluate

    if args.loops is not None or args.exit:
        return depth_main(args)
    try:
        report = evaluate(settings_from(args))
    except (RunInputError, TaskError, TrackingError) as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    print(summary(report))
    return 0


def depth_main(args: argparse.Namespace) -> int:
    """``--loops`` / ``--exit``: the depth curve and the exit curves (experiments/evaluation/depth.py)."""
    from experiments.checkpoints import RunInputError
    from experiments.evaluation.depth import DEFAULT_EPS, DepthSettings, depth_summary, run_depth
    from experiments.evaluation.evaluate import resolve_target

    eps = list(DEFAULT_EPS) if args.exit_eps is None else args.exit_eps
    depth = DepthSettings(loops=args.loops, rules=args.rule, exit=args.exit, exit_eps=eps, exit_loops=args.exit_loops)
    try:
        depth.check()
        target = resolve_target(settings_from(args))
        import torch

        device = args.device if args.device != "auto" else "cuda" if torch.cuda.is_available() else "cpu"
        report = run_depth(target, depth, device, mlflow=not args.no_mlflow)
    except (RunInputError, TrackingError) as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    print(depth_summary(report))
    return 0


if __name__ == "__main__":
    sys.exit(main())
