"""Everything decided and checked about a run before compute starts: :func:`plan_run`.

Each check answers in one line (``InputError``, ``ConfigError`` or ``TrackingError``, which
``mesh-train`` prints as ``error: ...`` with exit code 2), before any data is prepared or model built.
"""

from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

from omegaconf import DictConfig, OmegaConf

from experiments.budget import RunCost, StepBudget, run_cost, step_budget
from experiments.config import MAX_SEED, OptimConfig, TrainConfig, TrainerConfig
from experiments.data.config import DataConfig
from experiments.data.corpora import check_text_files
from experiments.data.indexed import check_indexed
from experiments.hardware import (
    available_memory,
    known_processes,
    launched_rank,
    processes_per_node,
    runs_on_accelerator,
)
from experiments.identity import config_hash, model_config_for, run_key, run_key_suffix
from experiments.store.check import check_runs_dir, check_tracking_uri, is_reading_only
from experiments.store.sqlite import check_store_intact, reading_uri, resolve_tracking_uri
from mesh_model import PRESETS, ConfigError, ModelConfig

if TYPE_CHECKING:  # torch is imported when a plan is made, not when a CLI starts
    from mesh_model.accounting import MemoryEstimate

GPT2_VOCAB = 50257  # the gpt2 tokenizer's vocabulary (data.tokenizer=gpt2)
# Strategies that shard parameters, gradients and optimizer state over the devices.
SHARDED_STRATEGIES = ("fsdp", "deepspeed")


class InputError(ValueError):
    """Bad user input found before any compute; the message is one line."""


@dataclass(frozen=True)
class MemoryLimit:
    """The memory a run's processes on one node may use where the run will execute, when that is
    not this machine (a batch job's node seen from a login node): ``free`` bytes, or None when it
    cannot be known from here (a GPU node's memory) and nothing is refused; ``where`` ends the
    refusal's line (`` per node (resources.mem_gb=16 GiB)``) and ``raise_with`` names the setting
    that asks for more."""

    free: float | None
    where: str
    raise_with: str | None = None


@dataclass
class RunPlan:
    """A checked run: its config (the validated dataclass, its budget resolved), model, store and identity."""

    train: TrainConfig  # the one source of every setting inside a run
    model_config: ModelConfig
    peak_lr: float
    tracking_uri: str
    config_hash: str
    runs_dir: Path  # ``train.runs_dir``, resolved
    run_dir: Path
    memory: MemoryEstimate  # one training step's estimate, per process
    budget: StepBudget  # the global batch, accumulation, steps and tokens
    alone: bool = False  # on an accelerator or several processes (DDP): never packed with other runs
    # the sha256 of a tokenizer other than the one its config's runs used (experiments/train.py)
    tokenizer_fork: str | None = None

    @property
    def config(self) -> dict[str, Any]:
        """The resolved config as a dict, derived from :attr:`train`: what the run logs, hashes and
        writes to ``config.yaml``."""
        return self.train.to_dict()

    @property
    def result_file(self) -> Path:
        """Written when the run finishes; its presence means the run is done."""
        return self.run_dir / "result.json"

    @property
    def checkpoint_dir(self) -> Path:
        return self.run_dir / "checkpoints"

    @property
    def last_checkpoint(self) -> Path:
        return self.checkpoint_dir / "last.ckpt"

    @property
    def data(self) -> DataConfig:
        return self.train.data

    @property
    def trainer(self) -> TrainerConfig:
        return self.train.trainer

    @property
    def optim(self) -> OptimConfig:
        return self.train.optim

    @property
    def experiment(self) -> str:
        return self.train.tracking.experiment


def plan_run(cfg: DictConfig, memory: MemoryLimit | None = None) -> RunPlan:
    """Validate every input (each dataclass's ``validate()``, once, the model, the step's memory,
    the user's data files, ``runs_dir`` and the store) and decide the run's identity; touches no
    model or data, creates nothing. The step's memory is checked against ``memory`` where the run
    executes elsewhere (a SLURM job), else against this machine's."""
    train, model_config, budget = _read_config(cfg)
    if train.data.seq_len > model_config.max_seq_len:
        raise InputError(
            f"data.seq_len={train.data.seq_len} is invalid: the model's max_seq_len is {model_config.max_seq_len} "
            f"(raise it with +model_overrides.max_seq_len=...)"
        )
    from mesh_model.loss import loss_backend

    estimate = check_memory(train, model_config, memory)
    try:  # $MESH_LOSS_BACKEND, checked here rather than at the first step
        loss_backend("cuda" if runs_on_accelerator(train.trainer) else "cpu")
    except ConfigError as error:
        raise InputError(str(error)) from None
    if train.data.check_path and train.data.corpus == "text":
        check_text_files(train.data.path or "")
    if train.data.check_path and train.data.corpus == "indexed":
        check_indexed(train.data.path or "")
    check_runs_dir(train.runs_dir)
    runs_dir = Path(train.runs_dir).expanduser().resolve()
    tracking_uri = resolve_tracking_uri(train.tracking.tracking_uri, runs_dir, os.environ)
    if is_reading_only() and (reading := reading_uri(tracking_uri)) != tracking_uri:
        tracking_uri = reading  # a store that cannot be written, opened read-only
        check_store_intact(tracking_uri)
    else:
        check_tracking_uri(tracking_uri, allow_damaged=train.tracking.rebuild_store)
    digest = config_hash(train.to_dict(), model_config)
    return RunPlan(
        train=train,
        model_config=model_config,
        peak_lr=train.optim.peak_lr(train.scheme, PRESETS[train.model].lr),
        tracking_uri=tracking_uri,
        config_hash=digest,
        runs_dir=runs_dir,
        run_dir=run_dir_for(runs_dir / train.tracking.experiment, model_config, train.seed, digest),
        memory=estimate,
        budget=budget,
        alone=runs_on_accelerator(train.trainer)
        or processes_per_node(train.trainer.devices, False) > 1
        or train.trainer.num_nodes > 1,
    )


def _read_config(cfg: DictConfig) -> tuple[TrainConfig, ModelConfig, StepBudget]:
    """(the run's dataclass with its budget resolved, the model, the step budget), every field checked.

    What the budget decides (``max_steps``, ``trainer.accumulate_grad_batches``) is the config from
    here on, and so the run's hash: a run of ``tokens=...`` is the run of the max_steps it comes to
    (``tokens`` and ``global_batch`` themselves are left out of the hash, experiments/identity.py)."""
    given = OmegaConf.to_object(cfg)
    assert isinstance(given, TrainConfig)
    try:
        given.validate()
        model_config = given.model_config()
        budget = step_budget(given, known_processes(given.trainer))
    except ConfigError as error:
        raise InputError(str(error)) from None
    trainer = dataclasses.replace(given.trainer, accumulate_grad_batches=budget.accumulate)
    train = dataclasses.replace(given, max_steps=budget.max_steps, trainer=trainer)
    return train, model_config, budget


def estimate_run(cfg: DictConfig) -> RunCost:
    """The run's cost by the FLOP model (:func:`~experiments.budget.run_cost`) from its config alone:
    its fields, model and budget checked as :func:`plan_run` checks them, but no memory, data or
    store check, so a grid can say what it costs before its cells are planned. The model has the
    vocabulary the run's tokenizer will give it, where that is known."""
    train, model_config, budget = _read_config(cfg)
    vocab = _expected_vocab(train)
    model_config = model_config.replace(vocab_size=vocab) if vocab else model_config
    param_bytes = precision_bytes(train.trainer.resolved_precision)[1]
    on_gpu = runs_on_accelerator(train.trainer)
    return run_cost(model_config, budget, on_gpu, param_bytes, train.checkpoint_every, train.loops)


def with_seed(plan: RunPlan, seed: int) -> RunPlan:
    """``plan``'s run at another seed, without planning it again: the seed enters no check (the
    model, memory, data, store), only the config, the hash and the run's folder. A grid plans
    each distinct config once this way (composing and checking took ~0.2 s per cell)."""
    if isinstance(seed, bool) or not isinstance(seed, int) or not 0 <= seed <= MAX_SEED:
        raise InputError(str(ConfigError("seed", seed, f"seeds are integers from 0 to {MAX_SEED}")))
    train = dataclasses.replace(plan.train, seed=seed)
    digest = config_hash(train.to_dict(), plan.model_config)
    run_dir = run_dir_for(plan.run_dir.parent, plan.model_config, seed, digest)
    return dataclasses.replace(plan, train=train, config_hash=digest, run_dir=run_dir)


def run_dir_for(experiment_dir: Path, model_config: ModelConfig, seed: int, digest: str) -> Path:
    """The run's folder in ``experiment_dir``: the one :func:`~experiments.identity.run_key` names
    or, where that does not exist, one an earlier naming gave the same run (same seed and hash:
    ``tiny-6-base-s0-<hash8>`` for what is now ``tiny-6-vanilla-s0-<hash8>``), so that a finished
    run is found finished and an interrupted one resumes instead of training again."""
    folder = experiment_dir / run_key(model_config, seed, digest)
    if folder.exists() or not experiment_dir.is_dir():
        return folder
    earlier = sorted(p for p in experiment_dir.glob(f"*{run_key_suffix(seed, digest)}") if p.is_dir())
    return earlier[0] if earlier else folder


@dataclass(frozen=True)
class OtherLength:
    """A run of the same config and seed as another one but for its length (``max_steps``)."""

    run_dir: Path
    max_steps: int
    finished: bool


def other_lengths(plan: RunPlan) -> list[OtherLength]:
    """The runs in ``plan``'s experiment folder that are ``plan``'s run at another ``max_steps``, shortest
    first (their ``config.yaml`` hashes as ``plan`` once given its ``max_steps``). A run is never extended:
    its LR warmup and cosine decay end at its ``max_steps``, which is part of its identity, so a
    longer run of the same config is a new run from step 0 (said by ``mesh-train``)."""
    seed = plan.train.seed
    prefix = run_key(plan.model_config, seed, "")  # ends "-s<seed>-": the hash follows
    found = []
    for folder in plan.run_dir.parent.glob(f"{prefix}*"):
        if folder == plan.run_dir or not (folder / "config.yaml").is_file():
            continue
        try:
            config = cast(
                "dict[str, Any]", OmegaConf.to_container(OmegaConf.load(folder / "config.yaml"), resolve=True)
            )
            steps = config["max_steps"]
            if steps == plan.train.max_steps:
                continue
            config["max_steps"] = plan.train.max_steps
            if config_hash(config, model_config_for(config)) == plan.config_hash:
                found.append(OtherLength(folder, int(steps), (folder / "result.json").is_file()))
        except Exception:  # a folder of an older version or edited by hand: not this run's
            continue
    return sorted(found, key=lambda other: other.max_steps)


def check_memory(
    train: TrainConfig, model_config: ModelConfig, available: int | MemoryLimit | None = None
) -> MemoryEstimate:
    """Refuse (one line) a run whose training step is estimated to need more memory than the
    machine has free (``mesh_model.accounting.estimate_step_memory``), unless ``allow_large``.

    ``available`` (bytes, or a :class:`MemoryLimit` of the node the run will execute on) defaults
    to :func:`available_memory`; where it is unknown (no CUDA on a GPU run, MPS, TPU) nothing is
    refused. CPU processes of one node (``trainer=ddp_cpu``) share the RAM.
    """
    from mesh_model.accounting import GB, estimate_step_memory

    trainer = train.trainer
    activation_bytes, param_bytes = precision_bytes(trainer.resolved_precision)
    vocab = _expected_vocab(train)
    config = model_config.replace(vocab_size=vocab) if vocab else model_config
    on_gpu = runs_on_accelerator(trainer)
    sharded = on_gpu and any(name in str(trainer.strategy).lower() for name in SHARDED_STRATEGIES)
    estimate = estimate_step_memory(
        config,
        train.data.batch_size,
        train.data.seq_len,
        activation_bytes=activation_bytes,
        param_bytes=param_bytes,
        activation_checkpointing=train.activation_checkpointing,
        accelerator=on_gpu,
        param_shards=(known_processes(trainer) or 1) if sharded else 1,
    )
    # Only the launching process (global rank 0) refuses: the others start once it has allocated,
    # and a refusal on one rank alone would leave the rest waiting for it.
    if train.allow_large or launched_rank() != 0:
        return estimate
    found: tuple[float, str] | None
    if available is None:
        found = available_memory("gpu" if on_gpu else trainer.accelerator)
    elif isinstance(available, MemoryLimit):
        found = None if available.free is None else (available.free, available.where)
    else:
        found = (available, "")
    if found is None:
        return estimate
    free, where = found
    processes = 1 if on_gpu else processes_per_node(trainer.devices, on_gpu)
    if processes * estimate.total <= free:
        return estimate
    per = f"{processes} processes x " if processes > 1 else ""
    fixes = "lower K, batch or seq_len" + (
        "" if train.activation_checkpointing else ", use activation_checkpointing=true"
    )
    if isinstance(available, MemoryLimit) and available.raise_with:
        fixes = f"raise {available.raise_with}, {fixes}"
    raise InputError(
        f"layout={model_config.layout}: the training step needs about {per}{estimate.describe()} but "
        f"{free / GB:.1f} GB are available{where}; {fixes}, or pass allow_large=true"
    )


def precision_bytes(precision: str) -> tuple[int, int]:
    """(bytes of an activation, bytes of a parameter) under a Lightning precision setting."""
    text = str(precision)
    if "mixed" in text:
        return 2, 4
    if text.startswith(("bf16", "16")):
        return 2, 2
    if text.startswith("64"):
        return 8, 8
    return 4, 4


def _expected_vocab(train: TrainConfig) -> int | None:
    """The vocabulary train.py will give the model (its tokenizer's, padded to 64) where it is
    known before the tokenizer exists; None keeps the preset's."""
    if "vocab_size" in (train.model_overrides or {}):
        return None
    data = train.data
    size = {"bpe": data.bpe_vocab_size, "gpt2": GPT2_VOCAB}.get(data.tokenizer)
    if size is None or (data.corpus == "indexed" and data.tokenizer == "bpe"):
        return None
    return padded_vocab(size)


def padded_vocab(vocab_size: int, multiple: int = 64) -> int:
    """The model's vocabulary for a tokenizer's: padded up to a multiple of 64."""
    return -(-vocab_size // multiple) * multiple
