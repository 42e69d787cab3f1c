"""From a checkpoint, a run directory or an MLflow run id to a model, its tokenizer and its run.

A run directory is ``<runs_dir>/<experiment>/<run key>/`` as ``mesh-train`` writes it:
``config.yaml``, ``mlflow_run_id`` and ``checkpoints/last.ckpt``. A checkpoint elsewhere still
loads, but without ``config.yaml`` there is no tokenizer or validation data to go with it.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from omegaconf import OmegaConf

from mesh_model import MeshTransformer, ModelConfig, build_model


class RunInputError(ValueError):
    """A path, run or setting that cannot be evaluated; the message is one line."""


@dataclass
class RunFiles:
    """Where a checkpoint and its run live. ``run_dir`` and ``config`` are None for a bare checkpoint;
    ``run_id`` is None when no MLflow run goes with it."""

    checkpoint: Path
    run_dir: Path | None
    config: dict[str, Any] | None
    run_id: str | None


def locate(target: str | os.PathLike[str]) -> RunFiles:
    """A checkpoint file or a run directory -> its :class:`RunFiles`."""
    path = Path(target).expanduser()
    if not path.exists():
        raise RunInputError(f"{target} does not exist (expected a checkpoint file or a run directory)")
    if path.is_dir():
        run_dir, checkpoint = path, path / "checkpoints" / "last.ckpt"
        if not checkpoint.is_file():
            raise RunInputError(f"{path} has no checkpoints/last.ckpt (not a mesh-train run directory?)")
    else:
        checkpoint = path
        parent = path.resolve().parent.parent  # <run dir>/checkpoints/<name>.ckpt
        run_dir = parent if (parent / "config.yaml").is_file() else None
    config = None
    run_id = None
    if run_dir is not None:
        run_dir = run_dir.resolve()
        if (run_dir / "config.yaml").is_file():
            config = OmegaConf.to_container(OmegaConf.load(run_dir / "config.yaml"), resolve=True)  # type: ignore[assignment]
        if (run_dir / "mlflow_run_id").is_file():
            run_id = (run_dir / "mlflow_run_id").read_text().strip() or None
    return RunFiles(checkpoint.resolve(), run_dir, config, run_id)


def load_model(checkpoint: str | os.PathLike[str], device: str | torch.device = "cpu") -> tuple[MeshTransformer, int]:
    """The ``MeshTransformer`` of a ``MeshLitModule`` checkpoint (in eval mode) and its global step;
    a checkpoint whose bytes differ from its saved digest is refused in one line, never loaded."""
    from experiments.checkpoint_digest import checkpoint_damage

    if Path(checkpoint).is_file() and (damage := checkpoint_damage(Path(checkpoint))) is not None:
        raise RunInputError(f"{checkpoint} is damaged ({damage}); use an older checkpoint of the run")
    try:
        state = torch.load(checkpoint, map_location="cpu", weights_only=True, mmap=True)
    except Exception as error:  # torch raises several kinds for a file that is not a checkpoint
        raise RunInputError(f"{checkpoint} is not a readable checkpoint: {str(error).splitlines()[0]}") from None
    hparams = state.get("hyper_parameters", {}) if isinstance(state, dict) else {}
    if "model_config" not in hparams or "state_dict" not in state:
        raise RunInputError(f"{checkpoint} is not a mesh-train checkpoint (no model_config in its hyper_parameters)")
    model = build_model(ModelConfig(**hparams["model_config"]))
    prefix = "model."
    weights = {k[len(prefix) :]: v for k, v in state["state_dict"].items() if k.startswith(prefix)}
    model.load_state_dict(weights)
    return model.to(device).eval(), int(state.get("global_step", 0))


def load_tokenizer_and_data(config: dict[str, Any] | None) -> Any:
    """The run's prepared data (``experiments.data.prepare``): tokenizer and validation token streams.

    Cached by ``mesh-train``, so this only memory-maps files (it rebuilds them if the cache was cleared).
    """
    if config is None or "data" not in config:
        raise RunInputError("no config.yaml next to the checkpoint: its tokenizer and validation data are unknown")
    from experiments.data import as_data_config, prepare

    try:
        prepared = prepare(as_data_config(config["data"]))
    except (OSError, ValueError) as error:
        raise RunInputError(f"the run's data cannot be prepared: {str(error).splitlines()[0]}") from None
    if prepared.tokenizer is None:
        raise RunInputError("the run has no text tokenizer (data.tokenizer=bpe on an indexed corpus)")
    return prepared
