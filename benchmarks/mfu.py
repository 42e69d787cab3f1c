"""CPU "MFU": the model FLOP/s of a training step against this machine's own matmul FLOP/s.

    .venv/bin/python benchmarks/mfu.py                  # mini preset, seq 512 (the target cell), + tiny/small
    .venv/bin/python benchmarks/mfu.py --presets mini   # just the target cell

The machine's limit is the best FLOP/s of a large square fp32 matmul, measured here with the same
torch threads. Model FLOPs follow ``mesh_model.accounting.flops_per_token`` (PaLM's convention:
6 x weights applied per token, every loop iteration counted, plus attention counted as if
non-causal); the step is forward + backward + AdamW on our training path. Both in one run.
"""

from __future__ import annotations

import argparse
import platform
import statistics
import sys
import time

import torch


def matmul_flops_per_s(m: int = 2048, k: int = 2048, n: int = 2048, repeats: int = 10) -> float:
    """Best FLOP/s of an (m, k) @ (k, n) fp32 matmul over ``repeats`` tries."""
    a, b = torch.randn(m, k), torch.randn(k, n)
    for _ in range(3):
        a @ b
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        a @ b
        best = min(best, time.perf_counter() - start)
    return 2 * m * k * n / best


def step_flops_per_s(preset: str, scheme: str, seq: int, batch: int, steps: int) -> tuple[float, float, int]:
    """(model FLOP/s, median step seconds, FLOPs per token) of our training step."""
    from mesh_model import ModelConfig, build_model, count_parameters

    torch.manual_seed(0)
    config = ModelConfig.from_preset(preset, scheme=scheme, max_seq_len=max(seq, 256))
    model = build_model(config)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
    ids = torch.randint(0, config.vocab_size, (batch, seq))
    per_token = int(count_parameters(model, seq)["flops_per_token"])
    times = []
    for step in range(steps + 2):
        start = time.perf_counter()
        loss = model(ids, labels=ids, return_logits=False).loss
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        if step >= 2:
            times.append(time.perf_counter() - start)
    step_s = statistics.median(times)
    return per_token * batch * seq / step_s, step_s, per_token


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--presets", nargs="+", default=["tiny", "mini", "small"])
    parser.add_argument("--scheme", default="base")
    parser.add_argument("--seq", type=int, default=512)
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--steps", type=int, default=5)
    args = parser.parse_args()
    print(
        f"# machine: {platform.processor() or platform.machine()}, torch {torch.__version__}, threads {torch.get_num_threads()}"
    )
    print(
        f"# command: {sys.executable} benchmarks/mfu.py --presets {' '.join(args.presets)} --scheme {args.scheme} "
        f"--seq {args.seq} --batch {args.batch} --steps {args.steps}"
    )
    from mesh_model import PRESETS

    before = matmul_flops_per_s()
    rows = []
    for preset in args.presets:
        achieved, step_s, per_token = step_flops_per_s(preset, args.scheme, args.seq, args.batch, args.steps)
        d = PRESETS[preset].d_model
        # The model's own largest GEMM (the MLP's up-projection of every token): what the
        # matmul library reaches at this width, an upper bound on the step's efficiency.
        shaped = matmul_flops_per_s(args.batch * args.seq, d, 4 * d)
        rows.append((preset, achieved, step_s, per_token, shaped))
    after = matmul_flops_per_s()
    peak = max(before, after)
    print(
        f"\nmachine matmul (fp32 2048^3, best of 10): {before / 1e9:.1f} GFLOP/s before the steps, "
        f"{after / 1e9:.1f} after (a drift means a busy machine); MFU is against the higher, {peak / 1e9:.1f}\n"
    )
    print(
        "| preset | scheme | seq | batch | GFLOPs/token | ms/step | model GFLOP/s | MFU | MLP GEMM at this width GFLOP/s (% of peak) |"
    )
    print("|---|---|---|---|---|---|---|---|---|")
    for preset, achieved, step_s, per_token, shaped in rows:
        print(
            f"| {preset} | {args.scheme} | {args.seq} | {args.batch} | {per_token / 1e9:.4f} | {step_s * 1e3:.0f} "
            f"| {achieved / 1e9:.1f} | {100 * achieved / peak:.1f}% | {shaped / 1e9:.1f} ({100 * shaped / peak:.0f}%) |"
        )


if __name__ == "__main__":
    main()
