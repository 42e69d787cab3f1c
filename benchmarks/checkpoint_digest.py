"""What a checkpoint's sha256 costs: per save (hash the file just written) and per load (hash it
before torch reads it), beside the save and load themselves, on the tiny and mini presets.

    .venv/bin/python benchmarks/checkpoint_digest.py [--repeats 5]

The checkpoint is what ``mesh-train`` writes (experiments/callbacks/checkpointing.py): the model's
weights and AdamW's two moments (about three times the weights), in torch's zip format, on the
disk under ``--dir`` (default: a temporary folder). Times are medians of ``--repeats``, wall clock;
the file is in the page cache, as it is right after a save and on a resume soon after one.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))


def _median_s(fn, repeats: int) -> float:
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def measure(preset: str, folder: Path, repeats: int) -> dict[str, float]:
    import torch

    from experiments.checkpoint_digest import file_digest
    from mesh_model import ModelConfig, build_model

    model = build_model(ModelConfig.from_preset(preset, scheme="mesh"))
    optimizer = torch.optim.AdamW(model.parameters())
    for p in model.parameters():
        p.grad = torch.zeros_like(p)
    optimizer.step()  # AdamW's state exists, as in a real checkpoint
    state = {"state_dict": model.state_dict(), "optimizer_states": [optimizer.state_dict()]}
    path = folder / f"{preset}.ckpt"
    save = _median_s(lambda: torch.save(state, path), repeats)
    digest = _median_s(lambda: file_digest(path), repeats)
    load = _median_s(lambda: torch.load(path, map_location="cpu", weights_only=True), repeats)
    return {"mb": path.stat().st_size / 1e6, "save": save, "load": load, "digest": digest}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--dir", type=Path, default=None, help="where the checkpoints are written")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(dir=args.dir) as folder:
        print(f"{'preset':<6} {'size':>8} {'save':>9} {'load':>9} {'sha256':>9} {'per save':>9} {'per load':>9}")
        for preset in ("tiny", "mini"):
            m = measure(preset, Path(folder), args.repeats)
            print(
                f"{preset:<6} {m['mb']:>6.1f}MB {m['save'] * 1e3:>7.1f}ms {m['load'] * 1e3:>7.1f}ms "
                f"{m['digest'] * 1e3:>7.1f}ms {m['digest'] / m['save']:>8.1%} {m['digest'] / m['load']:>8.1%}"
            )


if __name__ == "__main__":
    main()
