"""Train one model: ``mesh-train model=tiny layout=1+2R3+1 scheme=mesh``.

:func:`train` is the pure entry point (tests and sweepers import it); :func:`main` is the thin
``@hydra.main`` wrapper that returns the objective (final validation loss).

A run lives in ``<runs_dir>/<experiment>/<run key>/``: ``checkpoints/last.ckpt``, the MLflow run
id (``mlflow_run_id``), the resolved ``config.yaml`` and, once finished, ``result.json``.
Running the same command again resumes from ``last.ckpt`` into the same MLflow run, or, if
the run already finished, returns its result without training.
"""

from __future__ import annotations

import hashlib
import json
import os
import sys
import time
import warnings
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import hydra
from omegaconf import DictConfig, OmegaConf

from experiments.compose import register_all
from experiments.config import OptimConfig, TrainerConfig
from experiments.data.config import DataConfig
from experiments.overrides import OverrideError, check_overrides
from experiments.tracking import (
    TrackingError,
    check_tracking_uri,
    flatten,
    git_commit,
    is_local_store,
    isolated_tracking_uri,
    open_run,
    prepare_sqlite_store,
    resolve_tracking_uri,
)
from mesh_model import PRESETS, ConfigError, ModelConfig

PROJECT_ROOT = Path(__file__).resolve().parent.parent
# Keys that change where a run is logged or how fast it loads data, not what it computes.
# Keys that do not change what a run computes (activation checkpointing recomputes the same math).
HASH_EXCLUDED = (
    "tracking",
    "runs_dir",
    "resume",
    "data.num_workers",
    "data.cache_dir",
    "probes",
    "search",
    "activation_checkpointing",
)


class InputError(ValueError):
    """Bad user input found before any compute; the message is one line."""


@dataclass
class RunPlan:
    """Everything decided and checked before compute starts."""

    config: dict[str, Any]
    model_config: ModelConfig
    data: DataConfig
    trainer: TrainerConfig
    optim: OptimConfig
    peak_lr: float
    tracking_uri: str
    config_hash: str
    run_dir: Path

    @property
    def result_file(self) -> Path:
        """Written when the run finishes; its presence means the run is done."""
        return self.run_dir / "result.json"


def config_hash(config: dict[str, Any]) -> str:
    pruned = json.loads(json.dumps(config, default=str))
    for dotted in HASH_EXCLUDED:
        *parents, leaf = dotted.split(".")
        node = pruned
        for key in parents:
            node = node.get(key, {})
        node.pop(leaf, None)
    return hashlib.sha256(json.dumps(pruned, sort_keys=True).encode()).hexdigest()[:12]


def run_key(model_config: ModelConfig, seed: int, digest: str) -> str:
    scheme = model_config.scheme.replace("*", "x").replace("+", "_")
    slots = f"-B{model_config.slots}" if model_config.slots else ""
    return f"{model_config.preset}-{model_config.layout}-{scheme}{slots}-s{seed}-{digest[:8]}"


def process_rank() -> int:
    """Global rank from the launcher's environment (Lightning's order), known before DDP starts."""
    for key in ("RANK", "LOCAL_RANK", "SLURM_PROCID", "JSM_NAMESPACE_RANK"):
        if key in os.environ:
            return int(os.environ[key])
    return 0


def padded_vocab(vocab_size: int, multiple: int = 64) -> int:
    return -(-vocab_size // multiple) * multiple


def model_config_for(cfg: DictConfig | dict, vocab_size: int | None = None) -> ModelConfig:
    """The run's ModelConfig. ``scheme=vanilla`` means the plain model at the compute depth of
    the layout (so a grid over schemes includes its compute-matched baseline)."""
    if cfg["model"] not in PRESETS:
        raise ConfigError("model", cfg["model"], f"known presets: {', '.join(PRESETS)}")
    overrides: dict[str, Any] = dict(cfg.get("model_overrides") or {})
    vanilla = cfg["scheme"] == "vanilla"
    overrides["scheme"] = "base" if vanilla else cfg["scheme"]
    overrides["buffer_slots"] = None if vanilla else cfg["buffer_slots"]
    if cfg["layout"] is not None:
        overrides["layout"] = str(cfg["layout"])
    if vocab_size is not None:
        overrides.setdefault("vocab_size", vocab_size)
    config = ModelConfig.from_preset(cfg["model"], **overrides)
    return config.vanilla() if vanilla else config


def plan_run(cfg: DictConfig) -> RunPlan:
    """Validate every input and decide the run's identity; touches no model or data."""
    config = OmegaConf.to_container(cfg, resolve=True)
    assert isinstance(config, dict)
    data: DataConfig = OmegaConf.to_object(cfg.data)  # type: ignore[assignment]
    trainer: TrainerConfig = OmegaConf.to_object(cfg.trainer)  # type: ignore[assignment]
    optim: OptimConfig = OmegaConf.to_object(cfg.optim)  # type: ignore[assignment]
    try:
        data.validate()
    except ValueError as error:
        raise InputError(str(error)) from None
    model_config = model_config_for(config)
    if data.seq_len > model_config.max_seq_len:
        raise InputError(
            f"data.seq_len={data.seq_len} is invalid: the model's max_seq_len is {model_config.max_seq_len} "
            f"(raise it with +model_overrides.max_seq_len=...)"
        )
    for name in ("max_steps", "val_every", "log_every", "checkpoint_every"):
        if config[name] < 1:
            raise InputError(f"{name}={config[name]} is invalid: must be >= 1")
    # probes (experiments/probing.py)
    for name, low in (("num_batches", 1), ("every_n_validations", 0)):
        if config["probes"][name] < low:
            raise InputError(f"probes.{name}={config['probes'][name]} is invalid: must be >= {low}")
    runs_dir = Path(config["runs_dir"]).expanduser().resolve()
    tracking_uri = resolve_tracking_uri(config["tracking"]["tracking_uri"], runs_dir, os.environ)
    check_tracking_uri(tracking_uri)
    digest = config_hash(config)
    experiment = config["tracking"]["experiment"]
    return RunPlan(
        config=config,
        model_config=model_config,
        data=data,
        trainer=trainer,
        optim=optim,
        peak_lr=optim.lr if optim.lr is not None else PRESETS[config["model"]].lr,
        tracking_uri=tracking_uri,
        config_hash=digest,
        run_dir=runs_dir / experiment / run_key(model_config, config["seed"], digest),
    )


def _mlflow_run(plan: RunPlan, model_config: ModelConfig, client: Any) -> tuple[str, bool]:
    """The run's MLflow id: the stored one when resuming, else a new run. True when new."""
    id_file = plan.run_dir / "mlflow_run_id"
    if plan.config["resume"] and id_file.exists():
        return id_file.read_text().strip(), False
    tags = {
        "scheme": "vanilla" if model_config.parsed_layout.is_vanilla else model_config.scheme,
        "layout": model_config.layout,
        "preset": str(model_config.preset),
        "seed": str(plan.config["seed"]),
        "buffer_slots": str(model_config.slots or ""),
        "config_hash": plan.config_hash,
        "git_commit": git_commit(PROJECT_ROOT),
        "run_dir": str(plan.run_dir),
    }
    if plan.config["tracking"]["sweep"]:
        tags["sweep"] = plan.config["tracking"]["sweep"]
    tags.update({str(k): str(v) for k, v in plan.config["tracking"]["tags"].items()})
    artifacts = (plan.run_dir.parent / "mlartifacts").as_uri() if is_local_store(plan.tracking_uri) else None
    tracking = plan.config["tracking"]
    run_id = open_run(
        client,
        tracking["experiment"],
        tracking["run_name"] or plan.run_dir.name,
        tags,
        artifacts,
        tracking["parent_run_id"],
    )
    id_file.write_text(run_id)
    return run_id, True


def train(cfg: DictConfig) -> dict[str, Any]:
    """Train (or resume, or return the finished result of) the run ``cfg`` describes."""
    plan = plan_run(cfg)
    if plan.config["resume"] and plan.result_file.exists():
        result = json.loads(plan.result_file.read_text())
        print(f"[mesh-train] already finished: {plan.run_dir}", file=sys.stderr)
        return result
    started = time.perf_counter()
    with isolated_tracking_uri():
        return _train(plan, started)


def _train(plan: RunPlan, started: float) -> dict[str, Any]:

    from experiments.data.prepare import prepare

    try:  # corpus and tokenizer problems (unreadable, empty) surface here, before Lightning loads
        prepared = prepare(plan.data)
    except (OSError, ValueError) as error:
        raise InputError(str(error).splitlines()[0] if str(error) else repr(error)) from None

    # Heavy imports only once the inputs are known to be good.
    warnings.filterwarnings("ignore", message=r".*LeafSpec.*")  # Lightning 2.6 on torch >= 2.10
    import lightning.pytorch as pl
    import mlflow
    from lightning.pytorch.loggers import MLFlowLogger

    from experiments.checkpointing import AtomicModelCheckpoint, atomic_save
    from experiments.data.datamodule import TokenDataModule
    from experiments.lit_module import MeshLitModule
    from experiments.probing import probe_callbacks
    from experiments.timing import RunTimer
    from mesh_model import count_parameters

    model_config = model_config_for(plan.config, padded_vocab(prepared.vocab_size))
    plan.run_dir.mkdir(parents=True, exist_ok=True)
    (plan.run_dir / "config.yaml").write_text(OmegaConf.to_yaml(OmegaConf.create(plan.config)))

    # Only the global rank 0 process owns the MLflow run; under DDP/SLURM every process runs this
    # function, and Lightning's MLFlowLogger is a no-op on the other ranks.
    lead = process_rank() == 0
    prepare_sqlite_store(plan.tracking_uri)
    client = mlflow.MlflowClient(plan.tracking_uri)
    run_id, is_new = _mlflow_run(plan, model_config, client) if lead else (None, False)
    checkpoint_dir = plan.run_dir / "checkpoints"
    last_ckpt = checkpoint_dir / "last.ckpt"
    resume_from = str(last_ckpt) if plan.config["resume"] and last_ckpt.exists() else None

    try:
        pl.seed_everything(plan.config["seed"], workers=True, verbose=False)
        datamodule = TokenDataModule(plan.data, seed=plan.config["seed"], prepared=prepared)
        # Metrics name each validation set by its corpus: val/shakespeare/loss, val/cpython/ppl...
        val_names = [plan.data.corpus if name == "val" else name for name in datamodule.val_names]
        module = MeshLitModule(
            model_config=model_config.to_dict(),
            optim=plan.optim,
            peak_lr=plan.peak_lr,
            max_steps=plan.config["max_steps"],
            val_names=val_names,
            compile=plan.config["compile"],
            activation_checkpointing=plan.config["activation_checkpointing"],
        )
        if is_new:
            _log_run_facts(client, run_id, plan, model_config, count_parameters(module.model), prepared)
        logger = MLFlowLogger(
            experiment_name=plan.config["tracking"]["experiment"], tracking_uri=plan.tracking_uri, run_id=run_id
        )
        checkpoint = AtomicModelCheckpoint(
            dirpath=checkpoint_dir,
            filename="step{step}",
            every_n_train_steps=plan.config["checkpoint_every"],
            save_last=True,
            save_top_k=1,
            auto_insert_metric_name=False,
        )
        timer = RunTimer(started)
        trainer = pl.Trainer(
            plugins=_cluster_plugins(),
            accelerator=plan.trainer.accelerator,
            devices=plan.trainer.devices,
            num_nodes=plan.trainer.num_nodes,
            strategy=plan.trainer.strategy,
            precision=plan.trainer.precision or ("bf16-mixed" if plan.trainer.accelerator == "gpu" else "32-true"),
            deterministic=plan.trainer.deterministic,
            max_steps=plan.config["max_steps"],
            val_check_interval=plan.config["val_every"],
            check_val_every_n_epoch=None,
            log_every_n_steps=plan.config["log_every"],
            gradient_clip_val=plan.optim.grad_clip,
            logger=logger,
            callbacks=[
                timer,
                checkpoint,
                *probe_callbacks(plan.config["probes"], plan.run_dir),
                *_search_callbacks(plan, val_names),
            ],
            enable_progress_bar=sys.stderr.isatty(),
            enable_model_summary=False,
            num_sanity_val_steps=0,
            default_root_dir=str(plan.run_dir),
        )
        trainer.fit(module, datamodule=datamodule, ckpt_path=resume_from)
        if trainer.global_step % plan.config["val_every"] != 0:
            trainer.validate(module, datamodule=datamodule, verbose=False)
        atomic_save(trainer, last_ckpt)
    except BaseException as error:
        if lead:
            _mark_failed(client, run_id, error)
        raise
    metrics = {k: float(v) for k, v in trainer.callback_metrics.items() if k.startswith(("val/", "train/"))}
    main_val = val_names[0]
    result = {
        **metrics,
        "val_loss": metrics[f"val/{main_val}/loss"],
        "val_ppl": metrics[f"val/{main_val}/ppl"],
        "objective": metrics[f"val/{main_val}/loss"],
        "steps": trainer.global_step,
        "run_id": run_id,
        "run_dir": str(plan.run_dir),
    }
    if lead:
        client.log_metric(run_id, "val_loss", result["val_loss"], step=trainer.global_step)
        from mlflow.entities import Metric

        timing = timer.finish()
        result["timing"] = asdict(timing)
        client.log_batch(
            run_id,
            metrics=[
                Metric(k, v, int(time.time() * 1000), trainer.global_step) for k, v in timing.as_metrics().items()
            ],
        )
        client.set_terminated(run_id, "FINISHED")
        plan.result_file.write_text(json.dumps(result, indent=2))
    return result


def _cluster_plugins() -> list:
    """Under SLURM, submitit owns requeue (see experiments/launchers.py): Lightning's own
    SIGUSR1 auto-requeue is switched off so a preempted job is requeued exactly once."""
    from lightning.pytorch.plugins.environments import SLURMEnvironment

    return [SLURMEnvironment(auto_requeue=False)] if SLURMEnvironment.detect() else []


def _log_run_facts(client: Any, run_id: str, plan: RunPlan, model_config: ModelConfig, counts: dict, prepared) -> None:
    from mlflow.entities import Metric, Param

    params = flatten(plan.config)
    params.update({f"model_config.{k}": str(v) for k, v in model_config.to_dict().items()})
    params["config_hash"] = plan.config_hash
    params["peak_lr"] = str(plan.peak_lr)
    items = [Param(k, v[:6000]) for k, v in sorted(params.items())]
    for start in range(0, len(items), 100):
        client.log_batch(run_id, params=items[start : start + 100])
    facts = {
        "params_total": counts["total"],
        "params_non_embedding": counts["non_embedding"],
        "params_router": counts["router"],
        "params_pct_of_vanilla": counts["pct_of_vanilla"],
        "flops_per_token": counts["flops_per_token"],
        "data_train_tokens": prepared.train_tokens,
    }
    client.log_batch(run_id, metrics=[Metric(k, float(v), 0, 0) for k, v in facts.items()])
    client.log_artifact(run_id, str(plan.run_dir / "config.yaml"))


def _search_callbacks(plan: RunPlan, val_names: list[str]) -> list:
    """Optuna pruning for a trial of a search (experiments/search.py)."""
    search = plan.config["search"]
    if search["trial_id"] is None:
        return []
    from experiments.search import OptunaPruning

    return [OptunaPruning(search, f"val/{val_names[0]}/loss")]


def _mark_failed(client: Any, run_id: str, error: BaseException) -> None:
    """FAILED with the error as a tag; KILLED for an interrupt or a pruned search trial."""
    pruned = type(error).__name__ == "TrialPruned"
    try:
        client.set_tag(run_id, "pruned" if pruned else "error", f"{type(error).__name__}: {error}"[:5000])
        client.set_terminated(run_id, "KILLED" if pruned or isinstance(error, KeyboardInterrupt) else "FAILED")
    except Exception:  # the store itself may be what failed; the original error matters more
        pass


register_all()


@hydra.main(version_base="1.3", config_path="conf", config_name="train")
def main(cfg: DictConfig) -> float:
    try:
        result = train(cfg)
    except (ConfigError, InputError, TrackingError) as error:
        print(f"error: {error}", file=sys.stderr)
        sys.exit(2)
    if result["run_id"] is None:  # a non-zero DDP rank: rank 0 reports
        return result["objective"]
    print(
        f"[mesh-train] val loss {result['val_loss']:.4f} ppl {result['val_ppl']:.2f} after {result['steps']} steps; "
        f"MLflow run {result['run_id']}; run dir {result['run_dir']}"
    )
    return result["objective"]


HYDRA_VALUE_FLAGS = ("--config-dir", "-cd", "--config-name", "-cn", "--config-path", "-cp", "--info", "-i")


def cli() -> None:
    """Console script: one-line errors for bad override keys, then Hydra."""
    overrides, skip = [], False
    for arg in sys.argv[1:]:
        if skip or arg.startswith("-"):
            skip = arg in HYDRA_VALUE_FLAGS
            continue
        overrides.append(arg)
    try:
        check_overrides(overrides)
    except OverrideError as error:
        print(f"error: {error}", file=sys.stderr)
        sys.exit(2)
    main()


if __name__ == "__main__":
    cli()
