"""How close ``mesh_model.accounting.estimate_step_memory`` is to a measured training step.

    .venv/bin/python benchmarks/memory_estimate.py            # tiny K=2/20/100, base and MeSH, 1x16 and 4x64
    .venv/bin/python benchmarks/memory_estimate.py --quick    # K=2 and K=20 only

``mesh-train`` refuses a run whose estimate exceeds the memory available (``allow_large=true``
overrides), so the estimate must not be below what a step really takes. Each cell runs in a fresh
spawned process on the CPU: it resets the process's peak RSS once the inputs exist, then builds
the model and AdamW and runs two training steps as ``mesh-train`` does (chunked loss, backward,
``optimizer.step()``, gradients set to None); measured = peak RSS growth over that baseline.
The table prints estimate / measured, which must be >= 1 (and near 2 or below for the large cells).
"""

from __future__ import annotations

import argparse
import multiprocessing
import platform
import resource
import sys
from pathlib import Path

CELLS = [  # (layout, scheme, batch, seq_len, activation checkpointing)
    (layout, scheme, batch, seq, False)
    for layout in ("1+2R2+1", "1+2R20+1", "1+2R100+1")
    for scheme in ("base", "mesh")
    for batch, seq in ((1, 16), (4, 64))
] + [
    ("1+2R200+1", "base", 1, 16, False),
    ("1+2R200+1", "mesh", 1, 16, False),
    ("1+2R20+1", "base", 4, 64, True),
    ("1+2R20+1", "mesh", 4, 64, True),
    ("2+4R2+2", "base", 8, 256, False),
    ("2+4R2+2", "mesh", 8, 256, False),
]
QUICK = [cell for cell in CELLS if "R100" not in cell[0] and "R200" not in cell[0]]


def _peak_kb() -> int:
    """VmHWM (peak RSS) in kB; ``ru_maxrss`` where /proc is missing."""
    status = Path("/proc/self/status")
    if status.exists():
        for line in status.read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1])
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss


def _reset_peak() -> bool:
    """Reset VmHWM to the current RSS (Linux >= 4.0); False where that is not possible."""
    try:
        Path("/proc/self/clear_refs").write_text("5")
        return True
    except OSError:
        return False


def measure(cell: tuple, queue) -> None:
    import torch

    from mesh_model import ModelConfig, build_model

    layout, scheme, batch, seq, checkpointing = cell
    torch.manual_seed(0)
    torch.set_num_threads(1)
    preset = "tiny" if layout.startswith("1+") else "mini"
    config = ModelConfig.from_preset(preset, layout=layout, scheme=scheme)
    ids = torch.randint(0, config.vocab_size, (batch, seq))
    exact = _reset_peak()
    base = _peak_kb()
    model = build_model(config, activation_checkpointing=checkpointing)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
    for _ in range(2):
        model(ids, labels=ids, return_logits=False).loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
    queue.put(((_peak_kb() - base) * 1024, exact))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="skip the K=100 cells")
    args = parser.parse_args(argv)
    from mesh_model import ModelConfig
    from mesh_model.accounting import estimate_step_memory

    context = multiprocessing.get_context("spawn")
    print(f"# {platform.processor() or platform.machine()}, {platform.python_version()}, fp32 on the CPU")
    print("| model | layout | scheme | batch x seq | ckpt | estimate MB (MeSH coef.) | measured MB | ratio |")
    print("|---|---|---|---|---|---|---|---|")
    worst = float("inf")
    for cell in QUICK if args.quick else CELLS:
        layout, scheme, batch, seq, checkpointing = cell
        queue = context.Queue()
        process = context.Process(target=measure, args=(cell, queue))
        process.start()
        measured, exact = queue.get()
        process.join()
        preset = "tiny" if layout.startswith("1+") else "mini"
        config = ModelConfig.from_preset(preset, layout=layout, scheme=scheme)
        estimate = estimate_step_memory(config, batch, seq, activation_checkpointing=checkpointing)
        ratio = estimate.total / measured
        worst = min(worst, ratio)
        print(
            f"| {preset} | {layout} | {scheme} | {batch}x{seq} | {'yes' if checkpointing else 'no'} "
            f"| {estimate.total / 1e6:.1f} ({estimate.mesh_coefficients / 1e6:.1f}) "
            f"| {measured / 1e6:.1f}{'' if exact else ' (process peak)'} | {ratio:.2f} |",
            flush=True,
        )
    print(f"lowest estimate/measured: {worst:.2f} ({'conservative' if worst >= 1 else 'UNDER-ESTIMATES'})")
    return 0 if worst >= 1 else 1


if __name__ == "__main__":
    sys.exit(main())
