"""CPU "MFU": the model FLOP/s of a training step against this machine's own matmul FLOP/s.

    .venv/bin/python benchmarks/mfu.py                  # tiny, mini (the target cell), small at seq 512
    .venv/bin/python benchmarks/mfu.py --presets mini   # just the target cell

The machine's limit is the FLOP/s of a large square fp32 matmul with the same torch threads (one
by default, timed by CPU time, for the reasons in ``benchmarks/paired.py``),
measured in alternation with the steps (``benchmarks/paired.py``): every round runs one step, one
block of 2048^3 matmuls and one block of the model's own MLP GEMM, each lasting about half a step,
in a random order. MFU is taken per round (that step's FLOP/s over that block's) and reported as
the median with a bootstrap 95% interval, so a machine slowed by other jobs lowers both. Model
FLOPs follow ``mesh_model.accounting.flops_per_token`` (PaLM's convention: 6 x weights applied
per token, every loop iteration counted, plus attention counted as if non-causal); the step is
forward + backward + AdamW on our training path.
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import sys
from dataclasses import dataclass

import torch
from paired import CLOCKS, Measure, PairedRatio, interleave, load_average, paired_ratio


def matmul_block(m: int, k: int, n: int, seconds: float, clock: str) -> tuple[Measure, float]:
    """A :data:`paired.Measure` running (m, k) @ (k, n) fp32 matmuls for about ``seconds`` on
    ``clock``, and the FLOPs of one block."""
    a, b = torch.randn(m, k), torch.randn(k, n)
    now = CLOCKS[clock]

    def run(repeats: int) -> float:
        start = now()
        for _ in range(repeats):
            a @ b
        return now() - start

    run(3)
    repeats = max(1, round(seconds / run(1)))
    return (lambda: run(repeats)), 2.0 * m * k * n * repeats


def training_step(preset: str, scheme: str, seq: int, batch: int, clock: str) -> tuple[Measure, float]:
    """Our training step as a :data:`paired.Measure`, and its model FLOPs."""
    from mesh_model import ModelConfig, build_model, count_parameters

    torch.manual_seed(0)
    config = ModelConfig.from_preset(preset, scheme=scheme, max_seq_len=max(seq, 256))
    model = build_model(config)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4, fused=True)  # the training's form on CPU
    ids = torch.randint(0, config.vocab_size, (batch, seq))
    now = CLOCKS[clock]

    def step() -> float:
        start = now()
        loss = model(ids, labels=ids, return_logits=False).loss
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        return now() - start

    return step, count_parameters(model, seq)["flops_per_token"] * batch * seq


@dataclass(frozen=True)
class Row:
    preset: str
    per_token: float  # model FLOPs per token
    step_s: float  # median step seconds
    peak: float  # median FLOP/s of the 2048^3 blocks
    gemm: float  # median FLOP/s of the MLP GEMM blocks
    mfu: PairedRatio
    gemm_share: PairedRatio  # the MLP GEMM's FLOP/s over the peak's, per round


def measure_preset(preset: str, args: argparse.Namespace) -> Row:
    """One row: step, peak-matmul and MLP-GEMM blocks interleaved; MFU and GEMM share per round."""
    from mesh_model import PRESETS

    step, step_flops = training_step(preset, args.scheme, args.seq, args.batch, args.clock)
    for _ in range(2):  # warm up before sizing the blocks to a step
        step_s = step()
    d = PRESETS[preset].d_model
    peak, peak_flops = matmul_block(2048, 2048, 2048, step_s / 2, args.clock)
    # The model's own largest GEMM (the MLP's up-projection of every token): what the matmul
    # library reaches at this width, an upper bound on the step's efficiency.
    gemm, gemm_flops = matmul_block(args.batch * args.seq, d, 4 * d, step_s / 2, args.clock)
    times = interleave({"step": step, "peak": peak, "gemm": gemm}, args.pairs, seed=args.seed, warmup=1)
    # MFU_i = (step FLOPs / step s) / (peak FLOPs / peak s): a time ratio times a constant.
    mfu = paired_ratio(times["peak"], times["step"], seed=args.seed).scaled(step_flops / peak_flops)
    gemm_share = paired_ratio(times["peak"], times["gemm"], seed=args.seed).scaled(gemm_flops / peak_flops)
    return Row(
        preset,
        step_flops / (args.batch * args.seq),
        statistics.median(times["step"]),
        statistics.median(peak_flops / t for t in times["peak"]),
        statistics.median(gemm_flops / t for t in times["gemm"]),
        mfu,
        gemm_share,
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--presets", nargs="+", default=["tiny", "mini", "small"])
    parser.add_argument("--scheme", default="base")
    parser.add_argument("--seq", type=int, default=512)
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--pairs", type=int, default=15, help="interleaved rounds (step, peak, GEMM) per preset")
    parser.add_argument("--seed", type=int, default=0, help="seeds the order in each round and the bootstrap")
    parser.add_argument("--threads", type=int, default=1, help="torch threads (0: torch's default)")
    parser.add_argument("--clock", choices=tuple(CLOCKS), default="cpu", help="time by CPU or wall time")
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    print(
        f"# machine: {platform.processor() or platform.machine()}, {os.cpu_count()} cores, torch {torch.__version__}, "
        f"threads {torch.get_num_threads()}; load average at the start {load_average()}"
    )
    print(f"# command: {sys.executable} {' '.join(sys.argv)}")
    print(
        f"# {args.pairs} interleaved rounds per row, {args.clock} time; MFU = median of per-round MFU [bootstrap 95% interval], "
        "spread = min-max; peak = fp32 2048^3 matmul\n"
    )
    print(
        "| preset | scheme | seq | batch | GFLOPs/token | ms/step | model GFLOP/s | peak GFLOP/s | MFU [95% CI] "
        "| MFU spread | MLP GEMM at this width GFLOP/s | GEMM % of peak [95% CI] |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|---|---|")
    for preset in args.presets:
        row = measure_preset(preset, args)
        print(
            f"| {preset} | {args.scheme} | {args.seq} | {args.batch} | {row.per_token / 1e9:.4f} "
            f"| {row.step_s * 1e3:.0f} | {row.per_token * args.batch * args.seq / row.step_s / 1e9:.1f} "
            f"| {row.peak / 1e9:.1f} | {row.mfu.format(1, percent=True)} | {row.mfu.spread(1, percent=True)} "
            f"| {row.gemm / 1e9:.1f} | {row.gemm_share.format(0, percent=True)} |",
            flush=True,
        )
    print(f"\n# load average at the end {load_average()}")


if __name__ == "__main__":
    main()
