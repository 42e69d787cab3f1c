"""Where each millisecond of a training step goes, and how far each part is from this machine's limit.

    .venv/bin/python benchmarks/step_profile.py            # tiny and mini x vanilla, base, mesh (seq 256, batch 4)
    .venv/bin/python benchmarks/step_profile.py --quick    # tiny only, 3 profiled steps, 5 pairs
    .venv/bin/python benchmarks/step_profile.py --presets mini --schemes mesh --optimizer loop

A step is the training's: forward on the training path (``return_logits=False``: the chunked
loss of ``mesh_model/loss.py``, its gradients formed in the forward), backward, and the AdamW of
``experiments.lit_module.adamw`` (the paper's parameter groups, betas and weight decay; fused on
the CPU, as training runs it; ``--optimizer`` picks another form). ``vanilla`` is the plain model
at the layout's compute depth (``ModelConfig.vanilla``), ``base`` and ``mesh`` the preset's looped
layout (MeSH with its default buffer, B = K+3). One torch thread by default, as the other CPU
benchmarks (``benchmarks/paired.py`` says why).

Per row, after 2 warm-up steps, ``--steps`` steps run under ``torch.profiler`` (CPU). Every
operator's self time (its time less that of the operators it calls) goes to one group:

* AdamW: every operator under the ``phase: AdamW`` region;
* else the outermost of the operator and the operators around it that names a kernel group:
  matmuls (``aten::linear``, ``matmul``, ``addmm``, ``mm``, ``bmm``: the layers, MeSH's routers,
  the LM head in the loss, and their backward), the attention kernel (SDPA's flash kernel and its
  backward; a matmul inside it stays attention), layer norm, GELU;
* else the loss: every other operator inside the loss's autograd Function (the profiler names
  its forward ``_LinearCrossEntropy`` and its backward node ``_LinearCrossEntropyBackward``):
  ``logsumexp`` (its ``amax``, ``sub``, ``exp_``, ``sum``, ``log_``), ``gather``, ``sub_``,
  ``exp_``, ``scatter_add_``, ``mul_``, the gradient buffers' ``fill_``, the masks, the
  gradients' scaling in backward;
* else "other elementwise ops and copies": residual adds, rotary (``FusedRotaryQKV``), MeSH's
  router softmaxes and buffer mixing, bias gradients, views, copies, the loss's shifted targets.

The time table gives each group's ms per step and its share of the UNPROFILED step's median
(timed by ``--clock``, CPU time by default, interleaved with the peak blocks); "autograd/Python
overhead" is the step less every operator's profiled self time: the autograd engine's
bookkeeping, Python and the dispatcher, everything between kernels. The profiler inflates each
operator a little, so this row is a lower bound, and it is printed as measured, negative or not.
The phases table gives the phases as profiled (ops included) against the unprofiled step, which
shows how much the profiler inflates a step, and the overhead's upper bound: the self time of the
regions between operators as profiled (phases, autograd nodes, ``Optimizer.step``), which
includes the profiler's own bookkeeping.

The limit table: model FLOPs per step by ``mesh_model.accounting.flops_per_token`` (PaLM's
convention: 6 x weights applied per token, every loop iteration and the LM head counted, plus
attention's QK^T and AV at 12 x layers run x seq x d_model per token, as if non-causal); the peak
is a 2048^3 fp32 matmul on the same threads (``benchmarks/mfu.py``), one block per round in
random order with one step (``--pairs`` rounds); MFU is taken per round with its bootstrap 95%
interval. "matmuls % of peak" is the matmul FLOPs over the matmul group's profiled self time,
against the median peak; "attention % of peak" the same for attention's FLOPs and its kernel.
The last column is the step if every matmul ran at the peak and the rest stayed.

Caveats: the profiler times by the wall clock, the step by its CPU time (``--clock``):
a thread descheduled by other jobs would inflate the groups, so with ``--clock cpu`` every
profiled time is scaled by the thread's CPU time over the wall time of the profiled steps (the
share of them it ran, printed; 1 on a quiet machine), which assumes the other jobs slowed every
operator alike; a few long preemptions still land on whichever operators they hit, so read the
small groups over several steps. One thread, so the peak is one core's. Attention's FLOPs count
the causal mask's upper half, whose key blocks the flash kernel skips (nearly half the work at
long sequences), so its real efficiency is up to half its column. An operator's self time includes its memory traffic, so the elementwise groups have no
FLOP limit here (their limit is bandwidth).
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import sys
import time
from dataclasses import dataclass

import torch
from mfu import matmul_block
from paired import CLOCKS, PairedRatio, interleave, load_average, paired_ratio
from step_time import train_step
from torch import Tensor
from torch.autograd.profiler_util import FunctionEvent
from torch.profiler import ProfilerActivity, profile

from experiments.config import OptimConfig
from experiments.lit_module import adamw, parameter_groups
from mesh_model import PRESETS, MeshTransformer, ModelConfig, build_model, count_parameters

WARMUP_STEPS = 2
PEAK_SIZE = 2048  # the square fp32 matmul whose FLOP/s is the machine's limit (as mfu.py)
ADAMW_PHASE = "phase: AdamW"
# The loss's autograd Function (mesh_model/loss.py): the profiler names its forward and its
# backward node as regions (``_LinearCrossEntropy``, ``_LinearCrossEntropyBackward``).
LOSS_FUNCTION = "_LinearCrossEntropy"

MATMULS = "matmuls (linear, LM head, backward)"
ATTENTION = "attention kernel (SDPA + backward)"
LOSS = "loss (linear_cross_entropy: logsumexp, exp_, scatter_add_, ...)"
OTHER = "other elementwise ops and copies"
OPTIMIZER = "optimizer (AdamW)"
# Kernel groups by operator name: the matmuls by exact name, the others by a fragment of it.
MATMUL_OPS = frozenset({"aten::linear", "aten::matmul", "aten::addmm", "aten::mm", "aten::bmm"})
KERNEL_FRAGMENTS = (
    (ATTENTION, ("scaled_dot_product", "flash_attention", "_efficient_attention")),
    ("layer norm", ("layer_norm",)),
    ("GELU", ("gelu",)),
)
# Table order, with each group's column heading.
GROUPS = (
    (MATMULS, "matmuls"),
    (ATTENTION, "attention"),
    (LOSS, "loss"),
    ("layer norm", "layer norm"),
    ("GELU", "GELU"),
    (OTHER, "other elementwise & copies"),
    (OPTIMIZER, "AdamW"),
)
OPTIMIZER_FORMS = ("fused", "foreach", "loop")


def model_config(preset: str, scheme: str, seq: int) -> ModelConfig:
    """The run's ModelConfig: ``vanilla`` is base at the layout's compute depth (as a run config)."""
    config = ModelConfig.from_preset(
        preset, scheme="base" if scheme == "vanilla" else scheme, max_seq_len=max(seq, 256)
    )
    return config.vanilla() if scheme == "vanilla" else config


def build_optimizer(model: torch.nn.Module, preset: str, scheme: str, form: str) -> torch.optim.AdamW:
    """The training's AdamW (``experiments.lit_module.adamw``, default OptimConfig, the preset's
    peak LR) in ``form``: fused (training's on CPU), foreach, or the for-loop (torch's CPU default)."""
    optim = OptimConfig()
    peak_lr = optim.peak_lr(scheme, PRESETS[preset].lr)
    if form == "foreach":  # adamw() offers fused or torch's default only; the same groups here
        groups = parameter_groups(model, optim.weight_decay, peak_lr, optim.router_lr_scale)
        return torch.optim.AdamW(groups, lr=peak_lr, betas=tuple(optim.betas), foreach=True)
    return adamw(model, optim, peak_lr, fused=form == "fused")


def describe_optimizer(optimizer: torch.optim.Optimizer) -> str:
    """The AdamW form that ``optimizer.step`` runs, read off its settings."""
    defaults = optimizer.defaults
    if defaults.get("fused"):
        return "fused (one _fused_adamw_ kernel)"
    return "foreach (multi-tensor ops)" if defaults.get("foreach") else "for-loop (per-parameter ops)"


def build(preset: str, scheme: str, args: argparse.Namespace) -> tuple[MeshTransformer, torch.optim.AdamW, Tensor]:
    """(model, optimizer, token ids) of one row, seeded as the other benchmarks."""
    torch.manual_seed(0)
    config = model_config(preset, scheme, args.seq)
    model = build_model(config)
    optimizer = build_optimizer(model, preset, scheme, args.optimizer)
    return model, optimizer, torch.randint(0, config.vocab_size, (args.batch, args.seq))


@dataclass(frozen=True)
class Flops:
    """Model FLOPs of one step, split as the accounting counts them."""

    total: float
    attention: float  # QK^T and AV, as if non-causal

    @property
    def matmul(self) -> float:
        return self.total - self.attention


def step_flops(model: MeshTransformer, seq: int, batch: int) -> Flops:
    """``flops_per_token`` x tokens, and its attention part. The accounting does not expose the
    split: attention is its own term, 12 x (layers run) x seq x d_model per token (forward 4,
    backward 8; every loop iteration's layers counted), and the matmuls are the rest (6 x weights
    applied per token, LM head included)."""
    config = model.config
    total = count_parameters(model, seq)["flops_per_token"] * batch * seq
    attention = 12 * config.compute_depth * seq * config.d_model * batch * seq
    return Flops(float(total), float(attention))


def is_operator(event: FunctionEvent) -> bool:
    """A dispatched operator (``aten::...``), not a region: the phases, the loss, ``Optimizer.step``,
    the autograd engine's nodes (``MmBackward0``, ``torch::autograd::AccumulateGrad``)."""
    return "::" in event.name and "autograd::" not in event.name


def kernel_group(name: str) -> str | None:
    """The kernel group an operator's name belongs to, if any."""
    if name in MATMUL_OPS:
        return MATMULS
    return next((group for group, parts in KERNEL_FRAGMENTS if any(p in name for p in parts)), None)


def classify(event: FunctionEvent) -> str:
    """The group of one operator's self time (see the module docstring): AdamW's phase first,
    then the outermost kernel group among it and the operators around it, then the loss."""
    chain = []
    node: FunctionEvent | None = event
    while node is not None:
        chain.append(node)
        node = node.cpu_parent
    names = [e.name for e in chain]
    if ADAMW_PHASE in names:
        return OPTIMIZER
    kernels = [kernel_group(e.name) for e in chain if is_operator(e)]
    outermost = next((g for g in reversed(kernels) if g is not None), None)
    if outermost is not None:
        return outermost
    return LOSS if any(n.startswith(LOSS_FUNCTION) for n in names) else OTHER


@dataclass(frozen=True)
class Profile:
    """Per step: each group's operators' self seconds, and each phase's seconds (ops included)."""

    ops: dict[str, dict[str, float]]  # group -> operator name -> self seconds per step
    phases: dict[str, float]
    running: float  # the scale applied: the thread's CPU time / wall time while profiling (or 1)
    between: float  # self seconds per step of the regions (phases, autograd nodes, Optimizer.step)

    def seconds(self, group: str) -> float:
        return sum(self.ops.get(group, {}).values())

    @property
    def operators(self) -> float:
        """Every operator's self seconds per step: the step less the autograd/Python overhead."""
        return sum(map(sum, (ops.values() for ops in self.ops.values())))


def profile_steps(
    model: MeshTransformer, optimizer: torch.optim.Optimizer, ids: Tensor, steps: int, clock: str
) -> Profile:
    """``steps`` profiled training steps (after warm-up), grouped per step. The profiler times
    by the wall clock; with ``clock`` cpu every time is scaled by the thread's CPU time over the
    wall time of the profiled steps, the share of them it ran (1 on a quiet machine), so that a
    thread descheduled by other jobs does not inflate the groups against the CPU-timed step."""
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        wall, cpu = time.perf_counter(), time.thread_time()
        for _ in range(steps):
            train_step("ours", model, optimizer, ids)
        wall, cpu = time.perf_counter() - wall, time.thread_time() - cpu
    running = cpu / wall if clock == "cpu" else 1.0
    scale = running / 1e6 / steps  # microseconds of the run to seconds per step
    ops: dict[str, dict[str, float]] = {}
    phases: dict[str, float] = {}
    between = 0.0
    for event in prof.events():
        if event.name.startswith("phase: "):
            phase = event.name.removeprefix("phase: ")
            phases[phase] = phases.get(phase, 0.0) + event.cpu_time_total * scale
        if not is_operator(event):
            between += event.self_cpu_time_total * scale
            continue
        group = ops.setdefault(classify(event), {})
        group[event.name] = group.get(event.name, 0.0) + event.self_cpu_time_total * scale
    return Profile(ops, phases, running, between)


@dataclass(frozen=True)
class Row:
    preset: str
    scheme: str
    optimizer: str  # the AdamW form that ran (describe_optimizer)
    step_s: float  # median unprofiled step seconds
    profile: Profile
    flops: Flops
    peak: float  # median FLOP/s of the peak blocks
    mfu: PairedRatio

    def overhead(self) -> float:
        """Autograd, Python and dispatch: the unprofiled step less every operator's self time."""
        return self.step_s - self.profile.operators

    def peak_share(self, flops: float, group: str) -> float:
        """The share of the peak that a group reaches: ``flops`` over its profiled self seconds."""
        seconds = self.profile.seconds(group)
        return flops / seconds / self.peak if seconds > 0 else float("nan")


def measure_row(preset: str, scheme: str, args: argparse.Namespace) -> Row:
    """Profile one configuration, then time its unprofiled step interleaved with the peak blocks."""
    model, optimizer, ids = build(preset, scheme, args)
    now = CLOCKS[args.clock]

    def step() -> float:
        start = now()
        train_step("ours", model, optimizer, ids)
        return now() - start

    for _ in range(WARMUP_STEPS):
        step_s = step()
    profiled = profile_steps(model, optimizer, ids, args.steps, args.clock)
    peak, peak_flops = matmul_block(PEAK_SIZE, PEAK_SIZE, PEAK_SIZE, step_s / 2, args.clock)
    flops = step_flops(model, args.seq, args.batch)
    times = interleave({"step": step, "peak": peak}, args.pairs, seed=args.seed, warmup=1)
    mfu = paired_ratio(times["peak"], times["step"], seed=args.seed).scaled(flops.total / peak_flops)
    return Row(
        preset,
        scheme,
        describe_optimizer(optimizer),
        statistics.median(times["step"]),
        profiled,
        flops,
        statistics.median(peak_flops / t for t in times["peak"]),
        mfu,
    )


def _ms(seconds: float) -> str:
    ms = seconds * 1e3
    return f"{ms:.1f}" if abs(ms) >= 10 else f"{ms:.2f}"


def _cell(seconds: float, step_s: float) -> str:
    return f"{_ms(seconds)} ({100 * seconds / step_s:.1f}%)"


def print_time_table(rows: list[Row]) -> None:
    print("\n## Where a step's time goes: ms/step (share of the unprofiled step)\n")
    headings = " | ".join(heading for _, heading in GROUPS)
    print(f"| preset | scheme | ms/step | {headings} | autograd/Python overhead |")
    print("|---|---|---|" + "---|" * (len(GROUPS) + 1))
    for row in rows:
        cells = " | ".join(_cell(row.profile.seconds(group), row.step_s) for group, _ in GROUPS)
        print(f"| {row.preset} | {row.scheme} | {_ms(row.step_s)} | {cells} | {_cell(row.overhead(), row.step_s)} |")


def print_limit_table(rows: list[Row]) -> None:
    print("\n## How far from the machine's limit: FLOPs against the fp32 matmul peak\n")
    print(
        "| preset | scheme | GFLOPs/step | model GFLOP/s | peak GFLOP/s | MFU [95% CI] | MFU spread "
        "| matmuls % of peak | attention % of peak | ms/step if every matmul ran at peak |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|")
    for row in rows:
        at_peak = row.step_s - row.profile.seconds(MATMULS) + row.flops.matmul / row.peak
        print(
            f"| {row.preset} | {row.scheme} | {row.flops.total / 1e9:.3f} | {row.flops.total / row.step_s / 1e9:.1f} "
            f"| {row.peak / 1e9:.1f} | {row.mfu.format(1, percent=True)} | {row.mfu.spread(1, percent=True)} "
            f"| {100 * row.peak_share(row.flops.matmul, MATMULS):.0f}% "
            f"| {100 * row.peak_share(row.flops.attention, ATTENTION):.0f}% | {_ms(at_peak)} |"
        )


def print_phases(rows: list[Row]) -> None:
    print("\n## Phases under the profiler (ops included, scaled to CPU time), ms/step\n")
    print(
        "| preset | scheme | forward | backward | AdamW | sum of phases | unprofiled step | profiled / unprofiled "
        "| between operators, profiled (overhead's upper bound) | CPU / wall while profiled |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|")
    for row in rows:
        phases = row.profile.phases
        total = sum(phases.values())
        cells = " | ".join(_ms(phases.get(p, 0.0)) for p in ("forward", "backward", "AdamW"))
        print(
            f"| {row.preset} | {row.scheme} | {cells} | {_ms(total)} | {_ms(row.step_s)} | {total / row.step_s:.3f} "
            f"| {_ms(row.profile.between)} | {row.profile.running:.3f} |"
        )


def print_largest_other(rows: list[Row], count: int = 8) -> None:
    print(f"\nThe {count} largest operators of '{OTHER}' (self ms/step):")
    for row in rows:
        largest = sorted(row.profile.ops.get(OTHER, {}).items(), key=lambda item: -item[1])[:count]
        print(f"- {row.preset} {row.scheme}: " + ", ".join(f"{name} {_ms(s)}" for name, s in largest))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="tiny only, --steps 3 --pairs 5")
    parser.add_argument("--presets", nargs="+", default=["tiny", "mini"])
    parser.add_argument("--schemes", nargs="+", default=["vanilla", "base", "mesh"])
    parser.add_argument("--batch", type=int, default=4)
    parser.add_argument("--seq", type=int, default=256)
    parser.add_argument("--steps", type=int, default=5, help="profiled steps per row, after 2 warm-up steps")
    parser.add_argument("--pairs", type=int, default=10, help="interleaved rounds (one step, one peak block) per row")
    parser.add_argument("--seed", type=int, default=0, help="seeds the order in each round and the bootstrap")
    parser.add_argument("--threads", type=int, default=1, help="torch threads (0: torch's default)")
    parser.add_argument("--clock", choices=tuple(CLOCKS), default="cpu", help="time the steps by CPU or wall time")
    parser.add_argument(
        "--optimizer", choices=OPTIMIZER_FORMS, default="fused", help="AdamW's form (default: the training's on CPU)"
    )
    args = parser.parse_args()
    if args.quick:
        args.presets, args.steps, args.pairs = ["tiny"], 3, 5
    if args.threads:
        torch.set_num_threads(args.threads)
    print(
        f"# machine: {platform.processor() or platform.machine()}, {os.cpu_count()} cores, torch {torch.__version__}, "
        f"threads {torch.get_num_threads()}; load average at the start {load_average()}"
    )
    print(f"# command: {sys.executable} {' '.join(sys.argv)}")
    print(
        f"# batch {args.batch}, seq {args.seq}; {args.steps} profiled steps per row after {WARMUP_STEPS} warm-up; "
        f"ms/step = median of {args.pairs} unprofiled steps ({args.clock} time), interleaved with {PEAK_SIZE}^3 "
        "fp32 matmul blocks (the peak); MFU = median of per-round MFU [bootstrap 95% interval], spread = min-max"
    )
    rows = [measure_row(preset, scheme, args) for preset in args.presets for scheme in args.schemes]
    forms = ", ".join(sorted({row.optimizer for row in rows}))
    print(f"# optimizer: experiments.lit_module.adamw's parameter groups and settings, {forms}")
    print_time_table(rows)
    print_limit_table(rows)
    print_phases(rows)
    print_largest_other(rows)
    print(f"\n# load average at the end {load_average()}")


if __name__ == "__main__":
    main()
