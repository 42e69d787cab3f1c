"""The GPU path in one command: the issue's GPU targets, each measured as interleaved pairs.

    python benchmarks/gpu.py        # pythia-160m and pythia-410m shapes, seq 2048, batch 8 (a few minutes)
    python benchmarks/gpu.py --device cpu --presets tiny --seq 128 --batch 2 --pairs 4 --no-compile  # dry run

Rows (bf16 autocast on CUDA, fused AdamW, SDPA flash kernels):

* eager step, ours vanilla vs transformers' GPTNeoXForCausalLM (same shapes and weights), at
  every preset; target ours/HF <= 0.9;
* eager step, MeSH vs base at the first preset's paper layout; target <= 1.03;
* eager step, our loss on Liger's kernel vs the chunked torch loss at the first preset (where
  liger-kernel is installed): what the fused kernel buys;
* compiled MFU of MeSH at the last preset: model FLOP/s over the GPU's own bf16 matmul FLOP/s,
  a block of 8192^3 matmuls lasting about one step measured between steps; target >= 55%.

Both sides of a row live on the GPU at once; every round runs one step of each (one step and
one matmul block for MFU) in a random order, and the row reports the median of the per-round
ratios with a bootstrap 95% interval (``benchmarks/paired.py``). "met?" is judged on the
interval. Memory is each model's step alone: its own parameters, gradients and optimizer state
plus the allocator's peak growth during one step, so both models on the GPU do not mix.

Needs torch (and transformers for the HF rows); run from the repository root.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import statistics
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import torch

sys.path.insert(0, ".")
from paired import Measure, PairedRatio, interleave, paired_ratio, verdict  # noqa: E402

from mesh_model import ModelConfig, build_model, count_parameters  # noqa: E402
from mesh_model.loss import BACKEND_ENV, BACKENDS, loss_backend  # noqa: E402

VANILLA_LAYERS = {"tiny": "6", "mini": "12", "small": "12", "pythia-160m": "12", "pythia-410m": "24"}
TARGETS = {"ours/HF": 0.9, "mesh/base": 1.03, "MFU": 0.55}


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize()


@contextlib.contextmanager
def loss_backend_env(backend: str | None) -> Iterator[None]:
    """Run with ``$MESH_LOSS_BACKEND`` set to ``backend`` (None: leave it as it is)."""
    previous = os.environ.get(BACKEND_ENV)
    if backend is not None:
        os.environ[BACKEND_ENV] = backend
    try:
        yield
    finally:
        if previous is None:
            os.environ.pop(BACKEND_ENV, None)
        else:
            os.environ[BACKEND_ENV] = previous


@dataclass
class Subject:
    """One model under test: a step as a :data:`paired.Measure`, its memory alone, its FLOPs."""

    label: str
    layout: str
    step: Measure
    memory_gib: float
    step_flops: float
    compiles: list[int]


def build(preset: str, scheme: str, seq: int, device: torch.device, kind: str = "ours"):
    """Ours (``scheme='vanilla'``: base at the preset's plain depth) or HF's with the same weights."""
    layout = {"layout": VANILLA_LAYERS[preset]} if scheme == "vanilla" else {}
    config = ModelConfig.from_preset(
        preset, scheme="base" if scheme == "vanilla" else scheme, max_seq_len=seq, **layout
    )
    torch.manual_seed(0)
    with torch.device("cpu"):
        model = build_model(config)
    if kind == "hf":
        from mesh_model import to_hf_gpt_neox

        model.embedding_scale = 1.0
        model = to_hf_gpt_neox(model)
    return model.to(device).train(), config


def state_bytes(model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> int:
    """Bytes of the parameters, their gradients and the optimizer state: what stays between steps."""
    tensors = list(model.parameters()) + [p.grad for p in model.parameters() if p.grad is not None]
    tensors += [t for state in optimizer.state.values() for t in state.values() if torch.is_tensor(t)]
    return sum(t.numel() * t.element_size() for t in tensors)


def subject(
    label: str,
    preset: str,
    scheme: str,
    args: argparse.Namespace,
    device: torch.device,
    kind: str = "ours",
    compile_model: bool = False,
    backend: str | None = None,
) -> Subject:
    """Build a model, warm it up (compiling, if asked) and measure its memory alone."""
    model, config = build(preset, scheme, args.seq, device, kind)
    compiles: list[int] = []
    forward: Callable = model
    if compile_model:
        from torch._inductor.compile_fx import compile_fx

        def counting_backend(graph, inputs):
            compiles.append(1)
            return compile_fx(graph, inputs)

        forward = torch.compile(model, backend=counting_backend)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4, fused=device.type == "cuda")
    autocast = torch.autocast("cuda", dtype=torch.bfloat16) if device.type == "cuda" else contextlib.nullcontext()
    ids = torch.randint(0, config.vocab_size, (args.batch, args.seq), device=device)

    def step() -> float:
        sync(device)
        start = time.perf_counter()
        with loss_backend_env(backend), autocast:
            out = forward(ids, labels=ids) if kind == "hf" else forward(ids, labels=ids, return_logits=False)
        optimizer.zero_grad(set_to_none=True)
        out.loss.backward()
        optimizer.step()
        sync(device)
        return time.perf_counter() - start

    for _ in range(args.warmup):
        step()
    memory = step_memory_gib(step, model, optimizer, device)
    with torch.device("meta"):
        per_token = count_parameters(build_model(config), args.seq)["flops_per_token"]
    return Subject(label, config.layout, step, memory, per_token * args.batch * args.seq, compiles)


def step_memory_gib(step: Measure, model, optimizer, device: torch.device) -> float:
    """The model's own state plus the allocator's peak growth over one step (NaN off CUDA)."""
    if device.type != "cuda":
        return float("nan")
    torch.cuda.reset_peak_memory_stats()
    before = torch.cuda.memory_allocated()
    step()
    return (state_bytes(model, optimizer) + torch.cuda.max_memory_allocated() - before) / 2**30


def matmul_block(device: torch.device, seconds: float) -> tuple[Measure, float]:
    """Square matmuls (bf16 8192^3 on CUDA, fp32 512^3 elsewhere) for about ``seconds``; the block's FLOPs."""
    size, dtype = (8192, torch.bfloat16) if device.type == "cuda" else (512, torch.float32)
    a, b = torch.randn(size, size, device=device, dtype=dtype), torch.randn(size, size, device=device, dtype=dtype)

    def run(repeats: int) -> float:
        sync(device)
        start = time.perf_counter()
        for _ in range(repeats):
            a @ b
        sync(device)
        return time.perf_counter() - start

    run(3)
    repeats = max(1, round(seconds / run(1)))
    return (lambda: run(repeats)), 2.0 * size**3 * repeats


@dataclass(frozen=True)
class Pair:
    comparison: str
    preset: str
    a: Subject
    b: Subject
    ratio: PairedRatio
    a_s: float
    b_s: float


def pair(comparison: str, preset: str, a: Subject, b: Subject, args: argparse.Namespace) -> Pair:
    times = interleave({"a": a.step, "b": b.step}, args.pairs, seed=args.seed)
    ratio = paired_ratio(times["a"], times["b"], seed=args.seed)
    return Pair(comparison, preset, a, b, ratio, statistics.median(times["a"]), statistics.median(times["b"]))


def print_pair(row: Pair) -> None:
    target = TARGETS.get(row.comparison)
    met = verdict(row.ratio, at_most=target) if target is not None else ""
    memory = row.a.memory_gib / row.b.memory_gib
    print(
        f"| {row.comparison} | {row.preset} | {row.a.label} vs {row.b.label} | {row.a.layout} vs {row.b.layout} "
        f"| {row.a_s * 1e3:.1f} | {row.b_s * 1e3:.1f} | {row.ratio.format()} | {row.ratio.spread()} "
        f"| {row.a.memory_gib:.2f} | {row.b.memory_gib:.2f} | {memory:.3f} "
        f"| {'<= ' + str(target) if target is not None else ''} | {met} |",
        flush=True,
    )


def compiled_mfu(preset: str, args: argparse.Namespace, device: torch.device) -> None:
    """MFU of the compiled MeSH step, each step paired with a matmul block measured beside it."""
    compiled = subject("ours mesh torch.compile", preset, "mesh", args, device, compile_model=True)
    step_s = statistics.median(compiled.step() for _ in range(3))
    peak, peak_flops = matmul_block(device, step_s)
    times = interleave({"step": compiled.step, "peak": peak}, args.pairs, seed=args.seed)
    mfu = paired_ratio(times["peak"], times["step"], seed=args.seed).scaled(compiled.step_flops / peak_flops)
    step_ms = statistics.median(times["step"]) * 1e3
    peak_tflops = statistics.median(peak_flops / t for t in times["peak"]) / 1e12
    print(
        "\n| comparison | preset | model | layout | ms/step | peak TFLOP/s | MFU [95% CI] | spread "
        "| graphs compiled | target | met? |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    print(
        f"| compiled MFU | {preset} | {compiled.label} | {compiled.layout} | {step_ms:.1f} | {peak_tflops:.4g} "
        f"| {mfu.format(1, percent=True)} | {mfu.spread(1, percent=True)} | {len(compiled.compiles)} "
        f"| >= {TARGETS['MFU']:.0%} | {verdict(mfu, at_least=TARGETS['MFU'])} |",
        flush=True,
    )


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--presets", nargs="+", default=["pythia-160m", "pythia-410m"])
    parser.add_argument("--seq", type=int, default=2048)
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--pairs", type=int, default=30, help="interleaved rounds per row")
    parser.add_argument("--warmup", type=int, default=3, help="steps per model before the rounds")
    parser.add_argument("--seed", type=int, default=0, help="seeds the order in each round and the bootstrap")
    parser.add_argument("--loss-backend", choices=BACKENDS, help=f"sets ${BACKEND_ENV} for the run")
    parser.add_argument("--no-compile", action="store_true")
    parser.add_argument("--no-hf", action="store_true")
    args = parser.parse_args(argv)
    if args.loss_backend:
        os.environ[BACKEND_ENV] = args.loss_backend
    device = torch.device(args.device)
    if device.type == "cuda":
        torch.backends.cuda.matmul.allow_tf32 = True
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu (dry run: fp32, no autocast)"
    print(f"# {name}, torch {torch.__version__}; command: python benchmarks/gpu.py {' '.join(sys.argv[1:])}")
    print(
        f"# seq {args.seq}, batch {args.batch}, {args.pairs} interleaved pairs per row after {args.warmup} warm-up "
        f"steps per model; eager loss backend: {loss_backend(device)} (${BACKEND_ENV}={os.environ.get(BACKEND_ENV)})"
    )
    print("# ratio = median of per-pair ratios [bootstrap 95% interval]; spread = min-max of the pairs\n")
    print(
        "| comparison | preset | A vs B | layouts | A ms/step | B ms/step | A/B [95% CI] | spread | A GiB | B GiB "
        "| memory A/B | target | met? |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    for preset in [] if args.no_hf else args.presets:
        ours = subject("ours vanilla", preset, "vanilla", args, device)
        hf = subject("HF GPTNeoXForCausalLM (sdpa)", preset, "vanilla", args, device, kind="hf")
        print_pair(pair("ours/HF", preset, ours, hf, args))
        del ours, hf  # free the GPU before the next pair is built
    first = args.presets[0]
    mesh, base = (subject(f"ours {s}", first, s, args, device) for s in ("mesh", "base"))
    print_pair(pair("mesh/base", first, mesh, base, args))
    del mesh, base
    if loss_backend(device, "auto") == "liger":
        liger, chunked = (subject(f"loss {b}", first, "vanilla", args, device, backend=b) for b in ("liger", "chunked"))
        print_pair(pair("liger/chunked", first, liger, chunked, args))
        del liger, chunked
    if not args.no_compile:
        compiled_mfu(args.presets[-1], args, device)


if __name__ == "__main__":
    main()
