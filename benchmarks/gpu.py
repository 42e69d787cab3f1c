"""The GPU path in one command: bf16 autocast, SDPA flash kernels, torch.compile, activation
checkpointing and the memory-lean MeSH, measured against transformers' GPT-NeoX and the GPU's own
bf16 matmul rate. Sized to finish in about 4 minutes on one H100/H200.

    python benchmarks/gpu.py                     # pythia-160m and pythia-410m shapes, seq 2048
    python benchmarks/gpu.py --device cpu --presets tiny --seq 128 --batch 2 --steps 2 --no-compile  # dry run

Needs only torch (and transformers for the HF rows); run from the repository root
(``PYTHONPATH=.`` when the package is not installed). Every number is from this one run.
"""

from __future__ import annotations

import argparse
import contextlib
import statistics
import sys
import time

import torch

sys.path.insert(0, ".")
from mesh_model import ModelConfig, build_model, count_parameters  # noqa: E402

VANILLA_LAYERS = {"tiny": "6", "mini": "12", "small": "12", "pythia-160m": "12", "pythia-410m": "24"}


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize()


def peak_memory_reset(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()


def peak_memory_gb(device: torch.device) -> float:
    return torch.cuda.max_memory_allocated() / 2**30 if device.type == "cuda" else float("nan")


def matmul_tflops(device: torch.device, dtype: torch.dtype, size: int) -> float:
    a, b = torch.randn(size, size, device=device, dtype=dtype), torch.randn(size, size, device=device, dtype=dtype)
    for _ in range(3):
        a @ b
    sync(device)
    start = time.perf_counter()
    for _ in range(10):
        a @ b
    sync(device)
    return 10 * 2 * size**3 / (time.perf_counter() - start) / 1e12


def build(preset: str, scheme: str, variant: str, seq: int, device: torch.device, kind: str = "ours"):
    layout = {"layout": VANILLA_LAYERS[preset]} if scheme == "vanilla" else {}
    config = ModelConfig.from_preset(
        preset, scheme="base" if scheme == "vanilla" else scheme, max_seq_len=seq, **layout
    )
    torch.manual_seed(0)
    with torch.device("cpu"):
        model = build_model(
            config,
            activation_checkpointing=variant == "checkpointing",
            mesh_buffer="explicit" if variant == "explicit-buffer" else "lean",
        )
    if kind == "hf":
        from mesh_model import to_hf_gpt_neox

        model.embedding_scale = 1.0
        model = to_hf_gpt_neox(model)
    return model.to(device).train(), config


def measure(
    model, config, kind: str, seq: int, batch: int, steps: int, device: torch.device, compile_model: bool = False
):
    """(median step seconds, peak GiB, compiles) of forward + backward + AdamW under bf16 autocast."""
    compiles = []
    forward = model
    if compile_model:
        from torch._inductor.compile_fx import compile_fx

        def counting_backend(graph, inputs):
            compiles.append(1)
            return compile_fx(graph, inputs)

        forward = torch.compile(model, backend=counting_backend)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4, fused=device.type == "cuda")
    autocast = torch.autocast(device.type, dtype=torch.bfloat16) if device.type == "cuda" else contextlib.nullcontext()
    ids = torch.randint(0, config.vocab_size, (batch, seq), device=device)
    peak_memory_reset(device)
    times = []
    for step in range(steps + 3):
        sync(device)
        start = time.perf_counter()
        with autocast:
            out = forward(ids, labels=ids) if kind == "hf" else forward(ids, labels=ids, return_logits=False)
        optimizer.zero_grad(set_to_none=True)
        out.loss.backward()
        optimizer.step()
        sync(device)
        if step >= 3:
            times.append(time.perf_counter() - start)
    return statistics.median(times), peak_memory_gb(device), len(compiles)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--presets", nargs="+", default=["pythia-160m", "pythia-410m"])
    parser.add_argument("--seq", type=int, default=2048)
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--no-compile", action="store_true")
    parser.add_argument("--no-hf", action="store_true")
    args = parser.parse_args()
    device = torch.device(args.device)
    if device.type == "cuda":
        torch.backends.cuda.matmul.allow_tf32 = True
        name = torch.cuda.get_device_name()
    else:
        name = "cpu"
    peak = matmul_tflops(
        device, torch.bfloat16 if device.type == "cuda" else torch.float32, 8192 if device.type == "cuda" else 512
    )
    print(f"# {name}, torch {torch.__version__}; command: python benchmarks/gpu.py {' '.join(sys.argv[1:])}")
    print(f"# measured matmul peak ({'bf16 8192^3' if device.type == 'cuda' else 'fp32 512^3'}): {peak:.1f} TFLOP/s")
    print(
        f"# seq {args.seq}, batch {args.batch}, median of {args.steps} steps after 3 warm-up steps, bf16 autocast, fused AdamW\n"
    )
    print("| preset | model | layout | ms/step | peak GiB | tokens/s | TFLOP/s | MFU | vs reference |")
    print("|---|---|---|---|---|---|---|---|---|")

    def row(preset, label, scheme, variant="", kind="ours", compile_model=False, reference=None):
        model, config = build(preset, scheme, variant, args.seq, device, kind)
        with torch.device("meta"):
            per_token = count_parameters(build_model(config), args.seq)["flops_per_token"]
        seconds, memory, compiles = measure(
            model, config, kind, args.seq, args.batch, args.steps, device, compile_model
        )
        tokens = args.batch * args.seq
        achieved = per_token * tokens / seconds / 1e12
        versus = ""
        if reference is not None:
            versus = f"time {seconds / reference[0]:.3f}x, memory {memory / reference[1]:.3f}x"
        if compile_model:
            versus += f" ({compiles} graph compiled for {args.steps + 3} steps)"
        print(
            f"| {preset} | {label} | {config.layout} | {seconds * 1e3:.1f} | {memory:.2f} | {tokens / seconds:,.0f} "
            f"| {achieved:.1f} | {100 * achieved / peak:.1f}% | {versus} |",
            flush=True,
        )
        del model
        peak_memory_reset(device)
        return seconds, memory

    for preset in args.presets:
        hf = None if args.no_hf else row(preset, "HF GPTNeoXForCausalLM (sdpa)", "vanilla", kind="hf")
        row(preset, "ours vanilla", "vanilla", reference=hf)
        base = row(preset, "ours base", "base")
        for label, scheme, variant in (
            ("ours mesh (lean)", "mesh", ""),
            ("ours mesh (explicit buffer)", "mesh", "explicit-buffer"),
            ("ours mesh + activation checkpointing", "mesh", "checkpointing"),
            ("ours base + activation checkpointing", "base", "checkpointing"),
        ):
            row(preset, label, scheme, variant, reference=base)
    if not args.no_compile:
        preset = args.presets[0]
        eager = row(preset, "ours mesh eager", "mesh")
        row(preset, "ours mesh torch.compile", "mesh", compile_model=True, reference=eager)


if __name__ == "__main__":
    main()
