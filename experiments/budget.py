"""What one optimizer step and the whole run see: the global batch, gradient accumulation, tokens
per step and the run's length, decided once from the config (:func:`step_budget`).

A step sees ``data.batch_size`` sequences on each of ``devices x num_nodes`` processes, for
``trainer.accumulate_grad_batches`` micro-batches. The paper's recipe (``recipe=pythia``) states the
other end instead: ``global_batch`` sequences per step and a budget of ``tokens``; the accumulation
and the step count follow from them, and whatever does not come out whole is refused in one line.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from experiments.config import TrainConfig
from experiments.loops import LoopsConfig
from experiments.schedule import warmup_steps
from mesh_model import ConfigError, ModelConfig

# The FLOP model of a run that has not run yet: sustained matmul FLOP/s (stated guesses).
CPU_FLOPS = 2e10  # per CPU core
GPU_FLOPS = 1e14  # per GPU (about a third of an A100's dense bf16 peak)
# A checkpoint holds every parameter and AdamW's two moments, each at the parameters' precision.
CHECKPOINT_COPIES = 3


@dataclass(frozen=True)
class StepBudget:
    """The run's batch and length, every number resolved."""

    batch_size: int  # sequences per micro-batch, per process
    accumulate: int  # micro-batches per optimizer step
    processes: int  # devices x nodes
    seq_len: int
    max_steps: int
    warmup_steps: int
    min_lr_ratio: float  # the LR at the last step, as a fraction of the peak

    @property
    def global_batch(self) -> int:
        """Sequences per optimizer step, over every process."""
        return self.batch_size * self.accumulate * self.processes

    @property
    def tokens_per_step(self) -> int:
        return self.global_batch * self.seq_len

    @property
    def total_tokens(self) -> int:
        return self.tokens_per_step * self.max_steps

    def describe(self) -> str:
        """One line: ``global batch 512 (8 x 4 accumulated x 16 processes) x 4096 tokens = 2,097,152
        tokens/step; 119,210 steps = 250.0B tokens; LR warmup 1,192 steps, cosine to 10% at step 119,210``."""
        parts = [str(self.batch_size)]
        if self.accumulate > 1:
            parts.append(f"{self.accumulate} accumulated")
        if self.processes > 1:
            parts.append(f"{self.processes} processes")
        split = f" ({' x '.join(parts)})" if len(parts) > 1 else ""
        return (
            f"global batch {self.global_batch}{split} x {self.seq_len} tokens = {self.tokens_per_step:,} tokens/step; "
            f"{self.max_steps:,} steps = {tokens_text(self.total_tokens)} tokens; LR warmup {self.warmup_steps:,} "
            f"steps, cosine to {self.min_lr_ratio * 100:g}% at step {self.max_steps:,}"
        )


def step_budget(train: TrainConfig, processes: int | None) -> StepBudget:
    """The budget of ``train`` on ``processes`` training processes (devices x nodes; None where
    ``trainer.devices`` is ``auto`` and cannot be counted here). Raises ConfigError (one line)
    when ``global_batch`` does not divide into whole micro-batches, or needs a process count that
    is not known."""
    data, trainer = train.data, train.trainer
    accumulate = trainer.accumulate_grad_batches
    if train.global_batch is not None:
        if processes is None:
            raise ConfigError(
                "trainer.devices",
                trainer.devices,
                f"global_batch={train.global_batch} needs the number of devices, which is not known here: "
                "give trainer.devices=N (or resources.gpus_per_node=N with mesh-sweep)",
            )
        per_step = data.batch_size * processes
        if train.global_batch % per_step:
            raise ConfigError(
                "global_batch",
                train.global_batch,
                f"must be a multiple of data.batch_size x processes = {data.batch_size} x {processes} = {per_step}",
            )
        derived = train.global_batch // per_step
        if accumulate not in (1, derived):
            raise ConfigError(
                "trainer.accumulate_grad_batches",
                accumulate,
                f"global_batch={train.global_batch} makes it {derived}: drop one of the two",
            )
        accumulate = derived
    processes = processes or 1
    per_step_tokens = data.batch_size * accumulate * processes * data.seq_len
    if train.tokens is not None:
        max_steps = max(1, math.ceil(train.tokens / per_step_tokens))
    else:
        max_steps = train.max_steps if train.max_steps is not None else TrainConfig.DEFAULT_MAX_STEPS
    optim = train.optim
    warmup = warmup_steps(max_steps, optim.warmup_fraction, optim.warmup_steps)
    if optim.warmup_steps is not None and warmup >= max_steps:
        raise ConfigError("optim.warmup_steps", warmup, f"must be fewer than the run's {max_steps} steps")
    return StepBudget(data.batch_size, accumulate, processes, data.seq_len, max_steps, warmup, optim.min_lr_ratio)


@dataclass(frozen=True)
class RunCost:
    """What a run will cost by the FLOP model: its training FLOPs, whether it trains on GPUs, and
    the bytes of checkpoints it leaves (``last.ckpt`` and the newest ``step<N>.ckpt``)."""

    flops: float
    on_gpu: bool
    disk_bytes: int

    @property
    def hours(self) -> float:
        """CPU core-hours (GPU-hours on GPUs): the FLOPs at :data:`CPU_FLOPS` per core (:data:`GPU_FLOPS` per GPU)."""
        return self.flops / (GPU_FLOPS if self.on_gpu else CPU_FLOPS) / 3600


def run_cost(
    model_config: ModelConfig,
    budget: StepBudget,
    on_gpu: bool,
    param_bytes: int,
    checkpoint_every: int,
    loops: LoopsConfig | None = None,
) -> RunCost:
    """The :class:`RunCost` of training ``model_config`` for ``budget``, its parameters held in
    ``param_bytes`` each, checkpointed every ``checkpoint_every`` steps, each step at the expected
    loop count of ``loops`` (experiments/loops.py; None: the layout's K)."""
    flops, parameters = model_size(model_config, budget.seq_len, loops)
    files = 2 if budget.max_steps >= checkpoint_every else 1
    return RunCost(flops * budget.total_tokens, on_gpu, files * CHECKPOINT_COPIES * param_bytes * parameters)


def flop_seconds(model_config: ModelConfig, budget: StepBudget, cores: int, loops: LoopsConfig | None = None) -> float:
    """One run's wall time on ``cores`` CPU cores by the FLOP model: its training FLOPs, counted as
    :func:`run_cost` counts them (at the budget's sequence length), / the cores' rate."""
    return model_size(model_config, budget.seq_len, loops)[0] * budget.total_tokens / (CPU_FLOPS * cores)


def model_size(
    model_config: ModelConfig, seq_len: int | None = None, loops: LoopsConfig | None = None
) -> tuple[float, int]:
    """(training FLOPs per token at ``seq_len``, parameters) of ``model_config``, built on the meta
    device: no memory, no initialisation. With ``loops``, a step runs its expected loop count and
    backpropagates through its expected truncated count (:meth:`LoopsConfig.expected`)."""
    import torch

    from mesh_model import MeshTransformer, flops_per_token

    with torch.device("meta"):
        model = MeshTransformer(model_config)
    parameters = sum(p.numel() for p in model.parameters())
    if loops is None or (not loops.sampled and loops.backprop is None):
        return flops_per_token(model, seq_len), parameters
    expected, grad = loops.expected(model_config.loops)
    return flops_per_token(model, seq_len, expected, grad), parameters


def tokens_text(count: float) -> str:
    """``250.0B``, ``409.6k``: a token count as a reader takes it in."""
    for size, suffix in ((1e12, "T"), (1e9, "B"), (1e6, "M"), (1e3, "k")):
        if count >= size:
            return f"{count / size:.1f}{suffix}"
    return f"{count:.0f}"
