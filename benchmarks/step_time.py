"""Training-step time and peak memory, as ratios measured in one run on this machine.

    .venv/bin/python benchmarks/step_time.py            # 3 sizes x seq 256/512/1024, every scheme
    .venv/bin/python benchmarks/step_time.py --quick    # fewer cells
    .venv/bin/python benchmarks/step_time.py --profile mini:512   # where ours and HF's step spend time

1. Our vanilla model against transformers' GPTNeoXForCausalLM with identical shapes and weights
   (``to_hf_gpt_neox``): forward + backward + AdamW step. Ours runs its training path
   (``return_logits=False``: the loss from the hidden states in chunks, no full logits); HF runs
   its standard ``model(ids, labels=ids)``.
2. Every state-passing scheme against ``base`` at the same layout: MeSH's real overhead, with
   the paper's explicit (B, N, L, D) buffer (``mesh_buffer="explicit"``) beside our lean form, and
   activation checkpointing per core iteration.

Each cell runs in a fresh spawned process, so peak memory is that process's peak RSS growth
over its state after building the model and optimizer (activations, gradients, optimizer
state); times are the median of the measured steps.
"""

from __future__ import annotations

import argparse
import multiprocessing
import platform
import resource
import statistics
import sys
import time

SIZES = {"tiny": "6", "mini": "12", "small": "12"}
SCHEMES = ("base", "residual", "anchor", "anchor_emb", "static", "dynamic", "mesh")
VARIANTS = ("mesh:explicit-buffer", "base:checkpointing", "mesh:checkpointing")


def _rss_mb() -> float:
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
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
    return model, optimizer, torch.randint(0, config.vocab_size, (batch, seq))


def measure(kind: str, preset: str, layout: str, scheme: str, seq: int, batch: int, steps: int) -> tuple[float, float]:
    """(median seconds per step, peak RSS growth in MB) of one configuration, in this process."""
    model, optimizer, ids = setup_step(kind, preset, layout, scheme, seq, batch)
    base_rss = _rss_mb()
    times = []
    for step in range(steps + 2):
        start = time.perf_counter()
        train_step(kind, model, optimizer, ids)
        if step >= 2:  # two warm-up steps
            times.append(time.perf_counter() - start)
    return statistics.median(times), _rss_mb() - base_rss


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


def in_fresh_process(*args) -> tuple[float, float]:
    with multiprocessing.get_context("spawn").Pool(1) as pool:
        return pool.apply(measure, args)


def best_of(repeats: int, *args) -> tuple[float, float]:
    """The fastest of ``repeats`` fresh-process measurements (the least disturbed one)."""
    results = [in_fresh_process(*args) for _ in range(repeats)]
    return min(r[0] for r in results), min(r[1] for r in results)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--batch", type=int, default=4)
    parser.add_argument("--repeats", type=int, default=2, help="fresh processes per cell; the fastest counts")
    parser.add_argument("--schemes-only", action="store_true", help="skip the comparison with HF")
    parser.add_argument("--profile", metavar="PRESET:SEQ", help="only profile ours and HF's vanilla step at one cell")
    args = parser.parse_args()
    import torch

    if args.profile:
        preset, _, seq = args.profile.partition(":")
        print(f"# command: {sys.executable} benchmarks/step_time.py --profile {args.profile} --batch {args.batch}")
        profile_step(preset, int(seq or 512), args.batch)
        return

    seqs = (256, 512) if args.quick else (256, 512, 1024)
    sizes = ("tiny", "mini") if args.quick else tuple(SIZES)
    print(
        f"# machine: {platform.processor() or platform.machine()}, torch {torch.__version__}, threads {torch.get_num_threads()}"
    )
    print(
        f"# command: {sys.executable} benchmarks/step_time.py {'--quick ' if args.quick else ''}"
        f"{'--schemes-only ' if args.schemes_only else ''}--steps {args.steps} --batch {args.batch} --repeats {args.repeats}"
    )
    if not args.schemes_only:
        compare_with_hf(sizes, seqs, args)
    compare_schemes(sizes[-1], seqs[-1], args)


def compare_with_hf(sizes: tuple[str, ...], seqs: tuple[int, ...], args: argparse.Namespace) -> None:
    print("\n## Vanilla: ours vs transformers GPTNeoXForCausalLM (same shapes and weights)\n")
    print(
        "| preset | layers | seq | ours ms/step | HF ms/step | time ours/HF | ours peak MB | HF peak MB | memory ours/HF |"
    )
    print("|---|---|---|---|---|---|---|---|---|")
    for preset in sizes:
        for seq in seqs:
            ours = best_of(args.repeats, "ours", preset, SIZES[preset], "base", seq, args.batch, args.steps)
            hf = best_of(args.repeats, "hf", preset, SIZES[preset], "base", seq, args.batch, args.steps)
            print(
                f"| {preset} | {SIZES[preset]} | {seq} | {ours[0] * 1e3:.1f} | {hf[0] * 1e3:.1f} | {ours[0] / hf[0]:.3f} "
                f"| {ours[1]:.0f} | {hf[1]:.0f} | {ours[1] / max(hf[1], 1e-9):.3f} |"
            )


def compare_schemes(preset: str, seq: int, args: argparse.Namespace) -> None:
    print(f"\n## Every scheme against base at the {preset} preset's layout\n")
    print("| preset | seq | scheme | ms/step | time / base | peak MB | memory / base |")
    print("|---|---|---|---|---|---|---|")
    base = best_of(args.repeats, "ours", preset, None, "base", seq, args.batch, args.steps)
    for scheme in (*SCHEMES, *VARIANTS):
        t, m = (
            base
            if scheme == "base"
            else best_of(args.repeats, "ours", preset, None, scheme, seq, args.batch, args.steps)
        )
        print(
            f"| {preset} | {seq} | {scheme} | {t * 1e3:.1f} | {t / base[0]:.3f} | {m:.0f} | {m / max(base[1], 1e-9):.3f} |"
        )


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
