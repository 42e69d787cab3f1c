"""``mesh-probe RUN_DIR_OR_CHECKPOINT``: the hidden-state probes of a saved checkpoint.

Loads the model from a checkpoint (``<run_dir>/checkpoints/last.ckpt`` when given a run dir),
rebuilds the held-out batches from the run's ``config.yaml`` (the same batches the training run's
:class:`~experiments.probing.callback.ProbeCallback` used, unless ``--batches`` asks for another count),
writes the figures and ``probes.json`` to ``--out`` (default ``<run_dir>/probes/cli/``) and prints
a compact table. ``--mlflow-run auto`` (the run's own id from ``mlflow_run_id``) or ``--mlflow-run
RUN_ID`` also logs the metrics at the checkpoint's step and the files under ``probes/cli/``.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path
from typing import Any

from experiments.checkpoints import RunInputError, load_model, locate
from experiments.tracking import TrackingError

CLI_DIR = "cli"


def format_table(report: Any) -> str:
    """Blocks' update mean ± std, loop-to-loop CKA (RBF and linear), effective ranks."""
    lines = [f"{'block':<12}{'update mean ± std':>20}"]
    lines += [f"{block:<12}{mean:>12.3f} ± {std:.3f}" for block, (mean, std) in report.updates.items()]
    if report.loops:
        lines.append(f"{'loop pair':<12}{'CKA rbf':>10}{'CKA linear':>12}")
        pairs = [(f"{a}-{b}", report.cka(a, b, "rbf"), report.cka(a, b, "linear")) for a, b in report.loop_pairs]
        if len(pairs) > 1:
            pairs.append(("mean", *(sum(p[i] for p in pairs) / len(pairs) for i in (1, 2))))
        lines += [f"{name:<12}{rbf:>10.3f}{linear:>12.3f}" for name, rbf, linear in pairs]
    lines.append(f"{'stage':<12}{'eff. rank':>10}")
    lines += [f"{stage:<12}{rank:>10.2f}" for stage, rank in report.effective_ranks.items()]
    return "\n".join(lines)


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

    from experiments.store_check import check_tracking_uri
    from experiments.tracking import resolve_tracking_uri, sqlite_path

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
    files = locate(args.path)
    if files.config is None or files.run_dir is None:
        raise RunInputError(f"{str(files.checkpoint)!r} has no config.yaml beside its run (the run's resolved config)")
    run_dir, checkpoint, config = files.run_dir, files.checkpoint, files.config
    if args.batches is not None and args.batches < 1:
        raise RunInputError(f"--batches={args.batches} is invalid: must be >= 1")
    run_id = None
    if args.mlflow_run == "auto":
        if files.run_id is None:
            raise RunInputError(f"--mlflow-run auto: {str(run_dir)!r} has no mlflow_run_id")
        run_id = files.run_id
    elif args.mlflow_run:
        run_id = args.mlflow_run
    uri = _checked_run(config, run_dir, run_id) if run_id is not None else None
    # Heavy imports (Lightning, via the datamodule) only once the inputs are known to be good.
    from experiments.data.config import as_data_config
    from experiments.data.prepare import prepare
    from experiments.probing.callback import describe_batches, held_out_batches
    from experiments.probing.files import PROBE_DIR, write_probe_files
    from mesh_model.probes import probe_report

    probes = config.get("probes") or {}  # runs from before the probes config: the defaults
    num_batches = args.batches or probes.get("num_batches", 2)
    try:
        data = as_data_config(config["data"])
        batches = held_out_batches(data, prepare(data), num_batches)
    except (OSError, ValueError) as error:
        raise RunInputError(str(error).splitlines()[0] if str(error) else repr(error)) from None
    model, step = load_model(checkpoint)
    report = probe_report(model, batches, debiased=probes.get("debiased", False))
    out = Path(args.out) if args.out else run_dir / PROBE_DIR / CLI_DIR
    paths = write_probe_files(
        report, out, step=step, checkpoint=str(checkpoint), batches=describe_batches(data, batches)
    )
    print(f"{run_dir.name}  step {step}  {report.samples} samples ({len(batches)} batches x {data.seq_len} tokens)")
    print(format_table(report))
    print(f"wrote {len(paths)} files to {out}")
    if run_id is not None and uri is not None:
        log_to_mlflow(uri, run_id, report.as_metrics(), step, out)
        print(f"logged to MLflow run {run_id} ({uri}) at step {step}, artifacts under probes/{CLI_DIR}/")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="mesh-probe", description=__doc__.split("\n\n")[0])
    parser.add_argument("path", help="a run dir (uses checkpoints/last.ckpt) or a .ckpt file inside one")
    parser.add_argument("--out", help="where to write figures and probes.json (default <run_dir>/probes/cli/)")
    parser.add_argument("--batches", type=int, help="held-out batches (default: the run's probes.num_batches)")
    parser.add_argument("--mlflow-run", help='log into this MLflow run id, or "auto" for the run\'s own')
    args = parser.parse_args(argv)
    try:
        run(args)
    except (RunInputError, TrackingError) as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
