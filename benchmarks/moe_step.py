"""The MoE training step against the dense step with the same active parameters, as a paired ratio.

    .venv/bin/python benchmarks/moe_step.py              # tiny and mini, seq 256 and 512 (~4 min)
    .venv/bin/python benchmarks/moe_step.py --quick      # tiny, seq 256 and 512 (~2 min)
    .venv/bin/python benchmarks/moe_step.py --no-loop    # without the per-expert-loop fallback row
    .venv/bin/python benchmarks/moe_step.py --quick --experts 64 --top-k 8   # OLMoE's granularity

Step = forward + backward + AdamW on the training path (``return_logits=False``), the MoE step's
loss being the LM loss plus ``aux_loss``. The dense model is the preset (``tiny``, ``mini``); the
MoE model is its ``-moe`` preset: the same shape with E=8 experts of half the MLP width, top-2,
so a token applies the dense MLP's weights (plus the router). The target is MoE <= 1.5x dense.
``--experts`` and ``--top-k`` change the MoE model's E and k (expert width 4 d_model / k, so the
active weights stay the dense MLP's).

A third model, the same MoE with the per-expert loop instead of the grouped matmul (the fallback
where ``torch._grouped_mm`` does not run), shows what the grouping buys.

Time: every round runs one step of each model in a fresh random order, and the ratio is the
median of the per-round ratios with a bootstrap 95% interval (``benchmarks/paired.py``); one
torch thread timed by its CPU time by default, which is what stays meaningful on a busy 2-core
machine (``--threads 0 --clock wall`` on a quiet one).
"""

from __future__ import annotations

import argparse
import multiprocessing
import platform
import statistics
import sys
import time

from paired import CLOCKS, Measure, interleave, load_average, paired_ratio, verdict

TARGET = 1.5


def timed_step(preset: str, seq: int, batch: int, clock: str, loop: bool = False, **moe: int) -> Measure:
    """One configuration as a :data:`paired.Measure`: each call runs one step, returns its seconds.
    ``loop`` makes the MoE layers take the per-expert loop instead of the grouped matmul; ``moe``
    overrides the preset's ``moe_*`` fields."""
    import torch

    import mesh_model.moe as moe_module
    from mesh_model import ModelConfig, build_model

    torch.manual_seed(0)
    model = build_model(ModelConfig.from_preset(preset, max_seq_len=max(seq, 256), **moe))
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
    ids = torch.randint(0, model.config.vocab_size, (batch, seq))
    now, grouped = CLOCKS[clock], moe_module.grouped_mm_available

    def step() -> float:
        if loop:
            moe_module.grouped_mm_available = lambda *args: False
        try:
            start = now()
            out = model(ids, labels=ids, return_logits=False)
            loss = out.loss if out.aux_loss is None else out.loss + out.aux_loss
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()
            return now() - start
        finally:
            moe_module.grouped_mm_available = grouped

    return step


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="tiny only")
    parser.add_argument("--pairs", type=int, default=15, help="interleaved rounds per row (one step of each model)")
    parser.add_argument("--warmup", type=int, default=2, help="interleaved warm-up rounds, not counted")
    parser.add_argument("--batch", type=int, default=4)
    parser.add_argument("--seqs", default="256,512", help="comma-separated sequence lengths")
    parser.add_argument("--seed", type=int, default=0, help="seeds the step order and the bootstrap")
    parser.add_argument("--threads", type=int, default=1, help="torch threads (0: torch's default)")
    parser.add_argument("--clock", choices=tuple(CLOCKS), default="cpu", help="time a step by CPU or wall time")
    parser.add_argument("--no-loop", action="store_true", help="skip the per-expert-loop MoE")
    parser.add_argument("--experts", type=int, default=None, help="E of the MoE model (default: the preset's, 8)")
    parser.add_argument("--top-k", type=int, default=None, help="k of the MoE model (default: the preset's, 2)")
    args = parser.parse_args(argv)
    import torch

    from mesh_model.moe import grouped_mm_available

    if args.threads:
        torch.set_num_threads(args.threads)
    print(
        f"# machine: {platform.processor() or platform.machine()}, {multiprocessing.cpu_count()} cores, "
        f"torch {torch.__version__}, threads {torch.get_num_threads()}, grouped matmul on CPU fp32: "
        f"{grouped_mm_available('cpu', torch.float32)}; load average at the start {load_average()}"
    )
    print(f"# command: {sys.executable} benchmarks/moe_step.py {' '.join(sys.argv[1:] if argv is None else argv)}")
    print(
        f"# {args.pairs} interleaved rounds per row after {args.warmup} warm-up rounds, batch {args.batch}, "
        f"{args.clock} time; ratio = median of per-round ratios [bootstrap 95% interval], spread = min-max"
    )
    moe = {}
    if args.experts or args.top_k:
        moe = {"moe_experts": args.experts or 8, "moe_top_k": args.top_k or 2, "moe_hidden": None}
    header = "| dense | MoE | seq | dense ms | MoE ms | MoE / dense [95% CI] | spread | <= 1.5x? |"
    if not args.no_loop:
        header += " loop MoE ms | loop / dense [95% CI] | loop spread |"
    print("\n" + header)
    print("|" + "---|" * (header.count("|") - 1))
    start = time.perf_counter()
    for dense in ("tiny",) if args.quick else ("tiny", "mini"):
        for seq in (int(s) for s in args.seqs.split(",")):
            measures = {
                "dense": timed_step(dense, seq, args.batch, args.clock),
                "moe": timed_step(f"{dense}-moe", seq, args.batch, args.clock, **moe),
            }
            if not args.no_loop:
                measures["loop"] = timed_step(f"{dense}-moe", seq, args.batch, args.clock, loop=True, **moe)
            times = interleave(measures, args.pairs, seed=args.seed, warmup=args.warmup)
            ratio = paired_ratio(times["moe"], times["dense"], seed=args.seed)
            ms = {name: 1000 * statistics.median(t) for name, t in times.items()}
            label = f"{dense}-moe" + (f" E={moe['moe_experts']} k={moe['moe_top_k']}" if moe else "")
            row = (
                f"| {dense} | {label} | {seq} | {ms['dense']:.1f} | {ms['moe']:.1f} | {ratio.format()} | "
                f"{ratio.spread()} | {verdict(ratio, at_most=TARGET)} |"
            )
            if not args.no_loop:
                loop = paired_ratio(times["loop"], times["dense"], seed=args.seed)
                row += f" {ms['loop']:.1f} | {loop.format()} | {loop.spread()} |"
            print(row, flush=True)
    print(f"\n# wall time {time.perf_counter() - start:.0f} s; load average at the end {load_average()}")


if __name__ == "__main__":
    main()
