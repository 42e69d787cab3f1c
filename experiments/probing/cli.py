"""``mesh-probe RUN_DIR_OR_CHECKPOINT``: the hidden-state probes of a saved checkpoint.

Loads the model from a checkpoint (``<run_dir>/checkpoints/last.ckpt`` when given a run dir),
rebuilds the held-out batches from the run's ``config.yaml`` (the same batches the training run's
:class:`~experiments.probing.ProbeCallback` used, unless ``--batches`` asks for another count),
writes the figures and ``probes.json`` to ``--out`` (default ``<run_dir>/probes/cli/``) and prints
a compact table. ``--mlflow-run auto`` (the run's own id from ``mlflow_run_id``) or ``--mlflow-run
RUN_ID`` also logs the metrics at the checkpoint's step and the files under ``probes/cli/``.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path
from typing import Any

import torch

CLI_DIR = "cli"


class ProbeCliError(Exception):
    """Bad input; the message is one line."""


def locate(path: str | Path) -> tuple[Path, Path]:
    """(run dir, checkpoint) from a run dir or a checkpoint file."""
    path = Path(path).expanduser()
    if not path.exists():
        raise ProbeCliError(f"{str(path)!r} does not exist (give a run dir or a .ckpt file)")
    if path.is_dir():
        checkpoint = path / "checkpoints" / "last.ckpt"
        if not checkpoint.exists():
            raise ProbeCliError(f"{str(path)!r} has no checkpoints/last.ckpt")
        return path.resolve(), checkpoint.resolve()
    run_dir = path.parent.parent if path.parent.name == "checkpoints" else path.parent
    return run_dir.resolve(), path.resolve()


def load_run_config(run_dir: Path) -> dict[str, Any]:
    file = run_dir / "config.yaml"
    if not file.exists():
        raise ProbeCliError(f"{str(run_dir)!r} has no config.yaml (the run's resolved config)")
    from omegaconf import OmegaConf

    config = OmegaConf.to_container(OmegaConf.load(file), resolve=True)
    assert isinstance(config, dict)
    return config


def load_model(checkpoint: Path) -> tuple[torch.nn.Module, int]:
    """The MeshTransformer of a MeshLitModule checkpoint (built from its saved ``model_config``,
    weights under ``model.``, so a ``compile=true`` run loads too) and the checkpoint's global step."""
    from mesh_model import ModelConfig, build_model

    try:
        state = torch.load(checkpoint, map_location="cpu", weights_only=True)
        config = ModelConfig(**state["hyper_parameters"]["model_config"])
    except Exception as error:
        raise ProbeCliError(f"{str(checkpoint)!r} is not a mesh-train checkpoint: {type(error).__name__}") from None
    model = build_model(config)
    weights = {k.removeprefix("model."): v for k, v in state["state_dict"].items() if k.startswith("model.")}
    model.load_state_dict(weights)
    return model, int(state.get("global_step", 0))


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
    from mlflow.entities import Metric

    client = mlflow.MlflowClient(tracking_uri)
    now = int(time.time() * 1000)
    items = [Metric(key, float(value), now, step) for key, value in metrics.items()]
    for start in range(0, len(items), 500):
        client.log_batch(run_id, metrics=items[start : start + 500])
    client.log_artifacts(run_id, str(folder), f"probes/{CLI_DIR}")


def run(args: argparse.Namespace) -> None:
    run_dir, checkpoint = locate(args.path)
    config = load_run_config(run_dir)
    if args.batches is not None and args.batches < 1:
        raise ProbeCliError(f"--batches={args.batches} is invalid: must be >= 1")
    run_id = None
    if args.mlflow_run == "auto":
        id_file = run_dir / "mlflow_run_id"
        if not id_file.exists():
            raise ProbeCliError(f"--mlflow-run auto: {str(run_dir)!r} has no mlflow_run_id")
        run_id = id_file.read_text().strip()
    elif args.mlflow_run:
        run_id = args.mlflow_run
    # Heavy imports (Lightning, via the datamodule) only once the inputs are known to be good.
    from experiments.data.config import as_data_config
    from experiments.data.prepare import prepare
    from experiments.probing import PROBE_DIR, describe_batches, held_out_batches, write_probe_files
    from experiments.tracking import resolve_tracking_uri
    from mesh_model.probes import probe_report

    probes = config.get("probes") or {}  # runs from before the probes config: the defaults
    num_batches = args.batches or probes.get("num_batches", 2)
    try:
        data = as_data_config(config["data"])
        batches = held_out_batches(data, prepare(data), num_batches)
    except (OSError, ValueError) as error:
        raise ProbeCliError(str(error).splitlines()[0] if str(error) else repr(error)) from None
    model, step = load_model(checkpoint)
    report = probe_report(model, batches, debiased=probes.get("debiased", False))
    out = Path(args.out) if args.out else run_dir / PROBE_DIR / CLI_DIR
    paths = write_probe_files(
        report, out, step=step, checkpoint=str(checkpoint), batches=describe_batches(data, batches)
    )
    print(f"{run_dir.name}  step {step}  {report.samples} samples ({len(batches)} batches x {data.seq_len} tokens)")
    print(format_table(report))
    print(f"wrote {len(paths)} files to {out}")
    if run_id is not None:
        # The run dir is <runs_dir>/<experiment>/<run key>, so this works from any working directory.
        tracking = config.get("tracking") or {}
        uri = resolve_tracking_uri(tracking.get("tracking_uri"), run_dir.parent.parent, os.environ)
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
    except ProbeCliError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
