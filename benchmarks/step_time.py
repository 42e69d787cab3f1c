"""Training-step time and peak memory, as ratios measured in one run on this machine.

    .venv/bin/python benchmarks/step_time.py            # 3 sizes x seq 256/512/1024, schemes at mini/512
    .venv/bin/python benchmarks/step_time.py --quick    # tiny/mini x seq 256/512, schemes at tiny/512
    .venv/bin/python benchmarks/step_time.py --profile mini:512   # where ours and HF's step spend time

1. Our vanilla model against transformers' GPTNeoXForCausalLM with identical shapes and weights
   (``to_hf_gpt_neox``): forward + backward + AdamW step. Ours runs its training path
   (``return_logits=False``: the loss from the hidden states in chunks, no full logits); HF runs
   its standard ``model(ids, labels=ids)``.
2. Every state-passing scheme against ``base`` at the same layout: MeSH's real overhead, with
   the paper's explicit (B, N, L, D) buffer (``mesh_buffer="explicit"``) beside our lean form, and
   activation checkpointing per core iteration.

Time: both models of a comparison live in one process and their steps alternate, one step each
per round in a random order (``benchmarks/paired.py``); the ratio is the median of the per-round
ratios with a bootstrap 95% interval, so a machine that slows down (other jobs) slows both sides
of a pair and cancels. By default one torch thread, timed by the process's CPU time: on a busy
2-core machine that is what stays meaningful (``--threads 0 --clock wall`` on a quiet one).

Memory: peak RSS growth needs a process of its own, so every variant is measured once more,
alone, in a fresh spawned process: the peak RSS of two steps above the RSS after building the
model and optimizer (activations, gradients, optimizer state).
"""

from __future__ import annotations

import argparse
import multiprocessing
import platform
import resource
import statistics
import sys
import time

from paired import CLOCKS, Measure, PairedRatio, interleave, load_average, paired_ratio

SIZES = {"tiny": "6", "mini": "12", "small": "12"}
SCHEMES = ("base", "residual", "anchor", "anchor_emb", "static", "dynamic", "mesh")
VARIANTS = ("mesh:explicit-buffer", "base:checkpointing", "mesh:checkpointing")
MEMORY_STEPS = 2


def _status_mb(field: str) -> float:
    with open("/proc/self/status") as status:
        return next(int(line.split()[1]) / 1024 for line in status if line.startswith(field + ":"))


def _peak_rss_baseline() -> float:
    """Reset this process's peak RSS to its current RSS (Linux) and return it. ``ru_maxrss`` will
    not do here: a spawned child inherits its parent's high-water mark across exec."""
    try:
        with open("/proc/self/clear_refs", "w") as clear_refs:
            clear_refs.write("5")
        return _status_mb("VmRSS")
    except OSError:
        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def _peak_rss() -> float:
    try:
        return _status_mb("VmHWM")
    except OSError:
        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def setup_step(kind: str, preset: str, layout: str | None, scheme: str, seq: int, batch: int):
    """(model, AdamW, token ids) of one configuration: ours, or HF's with the same weights.
    ``scheme`` may carry a variant: ``mesh:explicit-buffer``, ``base:checkpointing``."""
    import torch

    from mesh_model import ModelConfig, build_model, to_hf_gpt_neox

    torch.manual_seed(0)
    scheme, _, variant = scheme.partition(":")
    layout_override = {"layout": layout} if layout else {}
    config = ModelConfig.from_preset(preset, scheme=scheme, max_seq_len=max(seq, 256), **layout_override)
    model = build_model(
        config.replace(scale_embeddings=False) if kind == "hf" else config,
        activation_checkpointing=variant == "checkpointing",
        mesh_buffer="explicit" if variant == "explicit-buffer" else "lean",
    )
    if kind == "hf":
        model = to_hf_gpt_neox(model).train()
    # Each side's trainer's AdamW on CPU: fused (experiments.lit_module.adamw; HF's Trainer
    # defaults to adamw_torch_fused from torch 2.8).
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4, fused=True)
    return model, optimizer, torch.randint(0, config.vocab_size, (batch, seq))


def train_step(kind: str, model, optimizer, ids) -> None:
    """Forward + backward + AdamW: ours on its training path (no full logits), HF's standard call.
    The three phases are named regions for the profiler (free when it is off)."""
    from torch.profiler import record_function

    with record_function("phase: forward"):
        out = model(ids, labels=ids) if kind == "hf" else model(ids, labels=ids, return_logits=False)
    optimizer.zero_grad(set_to_none=True)
    with record_function("phase: backward"):
        out.loss.backward()
    with record_function("phase: AdamW"):
        optimizer.step()


def timed_step(
    kind: str, preset: str, layout: str | None, scheme: str, seq: int, batch: int, clock: str = "cpu"
) -> Measure:
    """A built configuration as a :data:`paired.Measure`: each call runs one step, returns its
    seconds on ``clock`` (cpu or wall, see :data:`paired.CLOCKS`)."""
    model, optimizer, ids = setup_step(kind, preset, layout, scheme, seq, batch)
    now = CLOCKS[clock]

    def step() -> float:
        start = now()
        train_step(kind, model, optimizer, ids)
        return now() - start

    return step


def peak_rss_growth(kind: str, preset: str, layout: str | None, scheme: str, seq: int, batch: int) -> float:
    """Peak RSS in MB over ``MEMORY_STEPS`` steps above the RSS after building, in this (fresh) process."""
    model, optimizer, ids = setup_step(kind, preset, layout, scheme, seq, batch)
    base_rss = _peak_rss_baseline()
    for _ in range(MEMORY_STEPS):
        train_step(kind, model, optimizer, ids)
    return _peak_rss() - base_rss


def memory_in_fresh_process(threads: int, *args) -> float:
    import torch

    with multiprocessing.get_context("spawn").Pool(1, torch.set_num_threads, (threads,)) as pool:
        return pool.apply(peak_rss_growth, args)


def compare(a: Measure, b: Measure, args: argparse.Namespace) -> tuple[float, float, PairedRatio]:
    """(median seconds of a, of b, paired ratio a/b) over ``args.pairs`` interleaved rounds."""
    times = interleave({"a": a, "b": b}, args.pairs, seed=args.seed, warmup=args.warmup)
    ratio = paired_ratio(times["a"], times["b"], seed=args.seed)
    return statistics.median(times["a"]), statistics.median(times["b"]), ratio


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="tiny/mini x seq 256/512, schemes at tiny (a few minutes)")
    parser.add_argument("--pairs", type=int, default=15, help="interleaved rounds per comparison (one step each)")
    parser.add_argument("--warmup", type=int, default=2, help="interleaved warm-up rounds, not counted")
    parser.add_argument("--batch", type=int, default=4)
    parser.add_argument("--seed", type=int, default=0, help="seeds the step order and the bootstrap")
    parser.add_argument("--threads", type=int, default=1, help="torch threads (0: torch's default)")
    parser.add_argument("--clock", choices=tuple(CLOCKS), default="cpu", help="time a step by CPU or wall time")
    parser.add_argument("--no-memory", action="store_true", help="skip the fresh-process memory measurements")
    parser.add_argument("--schemes-only", action="store_true", help="skip the comparison with HF")
    parser.add_argument("--hf-only", action="store_true", help="skip the schemes")
    parser.add_argument("--profile", metavar="PRESET:SEQ", help="only profile ours and HF's vanilla step at one cell")
    args = parser.parse_args()
    import torch

    if args.threads:
        torch.set_num_threads(args.threads)
    if args.profile:
        preset, _, seq = args.profile.partition(":")
        print(f"# command: {sys.executable} benchmarks/step_time.py --profile {args.profile} --batch {args.batch}")
        profile_step(preset, int(seq or 512), args.batch)
        return

    seqs = (256, 512) if args.quick else (256, 512, 1024)
    sizes = ("tiny", "mini") if args.quick else tuple(SIZES)
    print(
        f"# machine: {platform.processor() or platform.machine()}, {multiprocessing.cpu_count()} cores, torch {torch.__version__}, "
        f"threads {torch.get_num_threads()}; load average at the start {load_average()}"
    )
    print(f"# command: {sys.executable} {' '.join(sys.argv)}")
    print(
        f"# {args.pairs} interleaved pairs of steps per row after {args.warmup} warm-up rounds, batch {args.batch}, "
        f"{args.clock} time; ratio = median of per-pair ratios [bootstrap 95% interval], spread = min-max of the pairs"
    )
    start = time.perf_counter()
    if not args.schemes_only:
        compare_with_hf(sizes, seqs, args)
    if not args.hf_only:
        compare_schemes("tiny" if args.quick else "mini", 512, args)
    print(f"\n# wall time {time.perf_counter() - start:.0f} s; load average at the end {load_average()}")


def _memory(args: argparse.Namespace, *cell) -> float:
    """Peak RSS growth of one cell in a fresh process with this process's torch threads."""
    import torch

    return float("nan") if args.no_memory else memory_in_fresh_process(torch.get_num_threads(), *cell, args.batch)


def compare_with_hf(sizes: tuple[str, ...], seqs: tuple[int, ...], args: argparse.Namespace) -> None:
    print("\n## Vanilla: ours vs transformers GPTNeoXForCausalLM (same shapes and weights)\n")
    print(
        "| preset | layers | seq | ours ms/step | HF ms/step | time ours/HF [95% CI] | spread | "
        "ours peak MB | HF peak MB | memory ours/HF |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|")
    for preset in sizes:
        for seq in seqs:
            cell = (preset, SIZES[preset], "base", seq, args.batch)
            ours, hf, ratio = compare(timed_step("ours", *cell, args.clock), timed_step("hf", *cell, args.clock), args)
            ours_mb, hf_mb = _memory(args, "ours", *cell[:-1]), _memory(args, "hf", *cell[:-1])
            print(
                f"| {preset} | {SIZES[preset]} | {seq} | {ours * 1e3:.1f} | {hf * 1e3:.1f} | {ratio.format()} "
                f"| {ratio.spread()} | {ours_mb:.0f} | {hf_mb:.0f} | {ours_mb / max(hf_mb, 1e-9):.3f} |",
                flush=True,
            )


def compare_schemes(preset: str, seq: int, args: argparse.Namespace) -> None:
    """Each scheme interleaved with one base model, built once and reused for every row."""
    print(f"\n## Every scheme against base at the {preset} preset's layout, seq {seq}\n")
    print(
        "| preset | seq | scheme | ms/step | base ms/step | time / base [95% CI] | spread | peak MB | memory / base |"
    )
    print("|---|---|---|---|---|---|---|---|---|")
    base = timed_step("ours", preset, None, "base", seq, args.batch, args.clock)
    base_mb = _memory(args, "ours", preset, None, "base", seq)
    for scheme in (*SCHEMES[1:], *VARIANTS):
        variant = timed_step("ours", preset, None, scheme, seq, args.batch, args.clock)
        t, base_t, ratio = compare(variant, base, args)
        mb = _memory(args, "ours", preset, None, scheme, seq)
        print(
            f"| {preset} | {seq} | {scheme} | {t * 1e3:.1f} | {base_t * 1e3:.1f} | {ratio.format()} "
            f"| {ratio.spread()} | {mb:.0f} | {mb / max(base_mb, 1e-9):.3f} |",
            flush=True,
        )
    print(f"\nbase peak MB: {base_mb:.0f}")


# Operator groups of a profile: the first pattern an op's name contains decides its group.
OP_GROUPS = (
    ("attention (SDPA flash kernel + backward)", ("scaled_dot_product", "flash_attention", "_efficient_attention")),
    ("matmuls (linear, LM head, their backward)", ("addmm", "mm", "bmm", "matmul", "linear")),
    (
        "loss softmax (HF: log_softmax, nll; ours: logsumexp, exp_, scatter_add_)",
        ("cross_entropy", "log_softmax", "nll_loss", "logsumexp", "softmax", "aten::exp_", "scatter_add"),
    ),
    ("layer norm", ("layer_norm",)),
    ("GELU", ("gelu",)),
)


def profile_step(preset: str, seq: int, batch: int) -> None:
    """Self CPU time of ours and HF's vanilla step by operator group (torch.profiler, 3 steps)."""
    from torch.profiler import ProfilerActivity, profile

    print(f"\n## Where a training step's time goes: {preset}, seq {seq}, batch {batch}, 3 profiled steps\n")
    shares, largest, phases = {}, {}, {}
    for kind in ("ours", "hf"):
        model, optimizer, ids = setup_step(kind, preset, SIZES[preset], "base", seq, batch)
        for _ in range(2):
            train_step(kind, model, optimizer, ids)
        with profile(activities=[ProfilerActivity.CPU]) as prof:
            for _ in range(3):
                train_step(kind, model, optimizer, ids)
        groups: dict[str, float] = {}
        rest: dict[str, float] = {}
        for event in prof.key_averages():
            name = event.key.lower()
            if name.startswith("phase: "):
                phases.setdefault(event.key.removeprefix("phase: "), {})[kind] = event.cpu_time_total / 3e3
                continue
            group = next((g for g, patterns in OP_GROUPS if any(p in name for p in patterns)), "everything else")
            groups[group] = groups.get(group, 0.0) + event.self_cpu_time_total / 3e3
            if group == "everything else":
                rest[event.key] = event.self_cpu_time_total / 3e3
        shares[kind] = groups
        largest[kind] = sorted(rest.items(), key=lambda item: -item[1])[:6]
    print("| phase (wall, ops included) | ours ms/step | HF ms/step | ours/HF |")
    print("|---|---|---|---|")
    for phase, ms in phases.items():
        print(f"| {phase} | {ms['ours']:.1f} | {ms['hf']:.1f} | {ms['ours'] / ms['hf']:.3f} |")
    print("\nOperators by their own (self) time; AdamW's elementwise ops fall under everything else.\n")
    names = [g for g, _ in OP_GROUPS] + ["everything else"]
    total = {kind: sum(groups.values()) for kind, groups in shares.items()}
    print("| operator group | ours ms/step | share | HF ms/step | share | ours/HF |")
    print("|---|---|---|---|---|---|")
    for name in names:
        o, h = shares["ours"].get(name, 0.0), shares["hf"].get(name, 0.0)
        print(
            f"| {name} | {o:.1f} | {100 * o / total['ours']:.1f}% | {h:.1f} | {100 * h / total['hf']:.1f}% "
            f"| {o / h if h else float('nan'):.3f} |"
        )
    print(
        f"| total (self CPU time) | {total['ours']:.1f} | | {total['hf']:.1f} | | {total['ours'] / total['hf']:.3f} |"
    )
    for kind, label in (("ours", "ours"), ("hf", "HF")):
        ops = ", ".join(f"{name} {ms:.1f}" for name, ms in largest[kind])
        print(f"\nlargest of everything else, {label} (ms/step): {ops}")


if __name__ == "__main__":
    main()
