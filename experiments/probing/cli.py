"""``mesh-probe RUN_DIR_OR_CHECKPOINT``: the hidden-state probes of a saved checkpoint.

Loads the model from a checkpoint (``<run_dir>/checkpoints/last.ckpt`` when given a run dir),
rebuilds the held-out batches from the run's ``config.yaml`` (the same batches the training run's
:class:`~experiments.probing.callback.ProbeCallback` used, unless ``--batches`` or ``--seq-len`` asks
for another count or sample length),
writes the figures, ``probes.json`` and ``probes.csv`` to ``--out`` (default ``<run_dir>/probes/cli/``)
and prints a compact table (for a mixture-of-experts run, its routing per router call too).
``--mlflow-run auto`` (the run's own id from ``mlflow_run_id``) or ``--mlflow-run RUN_ID`` also logs
the summary metrics (:data:`~experiments.probing.files.SUMMARY_METRICS`, as the training callback
does) at the checkpoint's step and the files under ``probes/cli/``.
"""

from __future__ import annotations

# torch, MLflow and the run's data are imported inside the commands that use them: --help and a
# refused argument answer before any of them loads.
import argparse
import math
import os
import sys
from pathlib import Path
from typing import Any

from experiments.console import quiet_libraries, take_verbose_flag
from experiments.store.sqlite import TrackingError
from mesh_model.cli_text import parser_for

CLI_DIR = "cli"


def _mean_std(values: tuple[float, float] | None) -> str:
    return f"{values[0]:>10.3f} ± {values[1]:.3f}" if values else " " * 18


def _norms(report: Any, block: str) -> str:
    """``|in| -> |out|``: the block's input and output ||h||_F / sqrt(L)."""
    from mesh_model.probes import update_blocks  # torch: only past --help

    pair = update_blocks(report.norms).get(block) if report.norms else None
    return f"{report.norms[pair[0]][0]:>8.3f} -> {report.norms[pair[1]][0]:<8.3f}" if pair else " " * 20


def format_table(report: Any) -> str:
    """Blocks' core update f(h) vs h, the same normalised, their input and output norms and the state
    update h(t-1)->h(t) (mean ± std), loop-to-loop CKA of every estimator with its Gaussian and
    permutation floors, effective ranks."""
    header = f"{'block':<12}{'update f(h) vs h':>18}{'normalised':>22}{'|in| -> |out|':>22}"
    lines = [f"{header}{'state h(t-1)->h(t)':>22}"]
    for block in {**report.updates, **report.state_updates}:
        values = [_mean_std(report.updates.get(block)), _mean_std(report.normed_updates.get(block))]
        line = f"{block:<12}{values[0]}    {values[1]}  {_norms(report, block)}"
        lines.append(f"{line}    {_mean_std(report.state_updates.get(block))}".rstrip())
    if report.loops:
        estimators = list(report.cka_matrices)
        lines.append(f"{'CKA':<12}" + "".join(f"{e:>17}" for e in estimators))
        rows = [(f"{a}-{b}", [report.cka(a, b, e) for e in estimators]) for a, b in report.loop_pairs]
        rows.append(("mean", [report.loop_mean(e) for e in estimators]))
        rows.append(("floor", [report.cka_floors.get(e, float("nan")) for e in estimators]))
        if report.cka_perm_floors:  # the loop pairs' mean, as loop_perm_floor
            rows.append(("perm floor", [_loop_perm_floor(report, e) for e in estimators]))
        lines += [f"{name:<12}" + "".join(f"{v:>17.3f}" for v in values) for name, values in rows]
    lines.append(f"{'stage':<12}{'eff. rank':>10}")
    lines += [f"{stage:<12}{rank:>10.2f}" for stage, rank in report.effective_ranks.items()]
    return "\n".join(lines)


def _loop_perm_floor(report: Any, estimator: str) -> float:
    floors = [report.perm_floor(a, b, estimator) for a, b in report.loop_pairs]
    return sum(floors) / len(floors)


def format_routing(routing: Any) -> str:
    """A MoE run's routing per router call: expert load CV, max and min load (x E), router entropy
    and the Jaccard overlap with the block's next iteration."""
    from experiments.probing.routing import load_stats
    from mesh_model.probe_names import call_order, router_calls

    rows = []
    for block, r in routing.blocks.items():
        stats = load_stats(r.load)
        for t, name in enumerate(router_calls(block, len(r.entropy))):
            jaccard = f"{r.jaccard[t].item():>9.3f}" if t < len(r.jaccard) else ""
            values = (stats["cv"][t], stats["max"][t], stats["min"][t], r.entropy[t])
            rows.append((name, f"{name:<20}" + "".join(f"{v.item():>9.3f}" for v in values) + jaccard))
    header = f"{'router call':<20}{'load CV':>9}{'max xE':>9}{'min xE':>9}{'entropy':>9}{'J t,t+1':>9}"
    return "\n".join([header, *(line for _, line in sorted(rows, key=lambda row: call_order(row[0])))])


def log_to_mlflow(tracking_uri: str, run_id: str, metrics: dict[str, float], step: int, folder: Path) -> None:
    import mlflow

    from experiments.tracking import log_metrics

    client = mlflow.MlflowClient(tracking_uri)
    log_metrics(client, run_id, metrics, step)
    client.log_artifacts(run_id, str(folder), f"probes/{CLI_DIR}")


def _checked_run(config: dict[str, Any], run_dir: Path, run_id: str) -> str:
    """The run's store, checked to answer and to hold ``run_id``, before any probing."""
    import mlflow
    from mlflow.exceptions import MlflowException

    from experiments.checkpoints import RunInputError
    from experiments.store.check import check_tracking_uri
    from experiments.store.sqlite import resolve_tracking_uri, sqlite_path

    # The run dir is <runs_dir>/<experiment>/<run key>, so this works from any working directory.
    tracking = config.get("tracking") or {}
    uri = resolve_tracking_uri(tracking.get("tracking_uri"), run_dir.parent.parent, os.environ)
    check_tracking_uri(uri)
    store = sqlite_path(uri)
    if store is not None and not store.is_file():  # a client would create an empty store there
        raise RunInputError(f"--mlflow-run={run_id} is invalid: there is no MLflow store at {store}")
    try:
        mlflow.MlflowClient(uri).get_run(run_id)
    except MlflowException:
        raise RunInputError(f"--mlflow-run={run_id} is invalid: no such MLflow run in {uri}") from None
    return uri


def run(args: argparse.Namespace) -> None:
    from experiments.checkpoints import RunInputError, load_model, locate

    files = locate(args.path)
    if files.config is None or files.run_dir is None:
        raise RunInputError(f"{str(files.checkpoint)!r} has no config.yaml beside its run (the run's resolved config)")
    run_dir, checkpoint, config = files.run_dir, files.checkpoint, files.config
    if args.batches is not None and args.batches < 1:
        raise RunInputError(f"--batches={args.batches} is invalid: must be >= 1")
    if args.seq_len is not None and args.seq_len < 4:
        raise RunInputError(f"--seq-len={args.seq_len} is invalid: must be >= 4 (the debiased CKA needs 4 rows)")
    if not (math.isfinite(args.sigma_fraction) and args.sigma_fraction > 0):
        raise RunInputError(f"--sigma-fraction={args.sigma_fraction} is invalid: must be a finite number > 0")
    run_id = None
    if args.mlflow_run == "auto":
        if files.run_id is None:
            raise RunInputError(f"--mlflow-run auto: {str(run_dir)!r} has no mlflow_run_id")
        run_id = files.run_id
    elif args.mlflow_run:
        run_id = args.mlflow_run
    uri = _checked_run(config, run_dir, run_id) if run_id is not None else None
    # Heavy imports (Lightning, via the datamodule) only once the inputs are known to be good.
    from experiments.config import ProbeConfig
    from experiments.data.config import as_data_config
    from experiments.data.prepare import prepare
    from experiments.probing.batches import describe_batches, held_out_batches
    from experiments.probing.files import PROBE_DIR, probe_metrics, summary_metrics, write_probe_files
    from experiments.probing.routing import routing_report
    from mesh_model.probes import probe_report

    probes = config.get("probes") or {}  # runs from before the probes config: the defaults
    num_batches = args.batches or probes.get("num_batches", 2)
    try:
        data = as_data_config(config["data"])
        seq_len = ProbeConfig(seq_len=args.seq_len or probes.get("seq_len")).resolved_seq_len(data.seq_len)
        batches = held_out_batches(data, prepare(data), num_batches, seq_len)
    except (OSError, ValueError) as error:
        raise RunInputError(str(error).splitlines()[0] if str(error) else repr(error)) from None
    model, step = load_model(checkpoint)
    report = probe_report(model, batches, sigma_fraction=args.sigma_fraction, window=data.seq_len)
    routing = routing_report(model, batches, window=data.seq_len)  # None for a dense model
    out = Path(args.out) if args.out else run_dir / PROBE_DIR / CLI_DIR
    paths = write_probe_files(
        report, out, routing, step=step, checkpoint=str(checkpoint), batches=describe_batches(data, batches)
    )
    print(
        f"{run_dir.name}  step {step}  {report.samples} samples of {seq_len} tokens ({len(batches)} batches, "
        f"read in windows of {data.seq_len})"
    )
    print(format_table(report))
    if routing is not None:
        print(format_routing(routing))
    print(f"wrote {len(paths)} files to {out}")
    if run_id is not None and uri is not None:
        log_to_mlflow(uri, run_id, summary_metrics(probe_metrics(report, routing)), step, out)
        print(f"logged to MLflow run {run_id} ({uri}) at step {step}, artifacts under probes/{CLI_DIR}/")


def main(argv: list[str] | None = None) -> int:
    parser = parser_for("mesh-probe", __doc__)
    parser.add_argument("path", help="a run dir (uses checkpoints/last.ckpt) or a .ckpt file inside one")
    parser.add_argument("--out", help="where to write figures and probes.json (default <run_dir>/probes/cli/)")
    parser.add_argument("--batches", type=int, help="held-out batches (default: the run's probes.num_batches)")
    parser.add_argument("--seq-len", type=int, help="tokens per sample (default: the run's probes.seq_len)")
    parser.add_argument(
        "--sigma-fraction",
        type=float,
        default=0.5,
        help="RBF bandwidth as a fraction of the median pairwise distance (default 0.5, the training probes')",
    )
    parser.add_argument("--mlflow-run", help='log into this MLflow run id, or "auto" for the run\'s own')
    parser.add_argument("-v", "--verbose", action="store_true", help="let MLflow log its INFO lines")
    args = parser.parse_args(take_verbose_flag(list(sys.argv[1:] if argv is None else argv)))
    quiet_libraries()
    from experiments.checkpoints import RunInputError  # torch: only past --help

    try:
        run(args)
    except (RunInputError, TrackingError) as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
