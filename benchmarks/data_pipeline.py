"""Data pipeline: first-time tokenization against cached loading, and the loader against the step.

    .venv/bin/python benchmarks/data_pipeline.py                 # embedded Shakespeare, BPE-2048
    .venv/bin/python benchmarks/data_pipeline.py --corpus kjv --preset mini

1. ``prepare()`` into an empty cache (the corpus files are copied from the default cache, so
   nothing is downloaded): BPE training + tokenization, tokens per second of the tokenizer.
2. ``prepare()`` again: the cached path (memory-mapped token files), tokens per second.
3. The training loader (batches as Lightning gets them) against our training step at the same
   batch shape: the fetch's share of a step, measured over the same number of batches, and a
   torch.profiler table of fetch + step showing where the time goes.
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

from experiments.data.cache import cache_root
from experiments.data.config import DataConfig
from experiments.data.datamodule import TokenDataModule
from experiments.data.prepare import prepare


def timed_prepare(cfg: DataConfig) -> tuple[float, object]:
    start = time.perf_counter()
    data = prepare(cfg)
    return time.perf_counter() - start, data


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--corpus", default="shakespeare")
    parser.add_argument("--preset", default="tiny")
    parser.add_argument("--batches", type=int, default=20)
    args = parser.parse_args()
    print(
        f"# command: {sys.executable} benchmarks/data_pipeline.py --corpus {args.corpus} --preset {args.preset} --batches {args.batches}"
    )
    with tempfile.TemporaryDirectory() as cache:
        source = cache_root() / "corpora"
        if source.exists():
            shutil.copytree(source, Path(cache) / "corpora")
        cfg = DataConfig(corpus=args.corpus, cache_dir=cache)
        first_s, first = timed_prepare(cfg)
        tokens = first.train_tokens + sum(first.val_tokens.values())
        tokenize_s = sum(s.seconds for s in first.stats.values())
        tokenized = sum(s.tokens for s in first.stats.values())
        cached_s, cached = timed_prepare(cfg)
        assert cached.train_tokens == first.train_tokens and not cached.stats  # nothing re-tokenized
        print(f"\n{args.corpus}: {tokens:,} tokens (train {first.train_tokens:,}), vocab {first.vocab_size}\n")
        print("| path | seconds | tokens/s |")
        print("|---|---|---|")
        print(
            f"| first prepare (BPE training + tokenization + writing the cache) | {first_s:.2f} | {tokens / first_s:,.0f} |"
        )
        print(f"| of which tokenization | {tokenize_s:.2f} | {tokenized / max(tokenize_s, 1e-9):,.0f} |")
        print(f"| cached prepare (memory-map) | {cached_s:.4f} | {tokens / cached_s:,.0f} |")
        print(f"\ncached / first: {first_s / cached_s:,.0f}x faster")
        loader_vs_step(cfg, args.preset, args.batches)


def loader_vs_step(cfg: DataConfig, preset: str, batches: int) -> None:
    from mesh_model import ModelConfig, build_model

    datamodule = TokenDataModule(cfg, seed=0)
    datamodule.setup("fit")
    model = build_model(ModelConfig.from_preset(preset, vocab_size=datamodule.vocab_size))
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)

    def step(batch: torch.Tensor) -> None:
        loss = model(batch, labels=batch, return_logits=False).loss
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()

    iterator = iter(datamodule.train_dataloader())
    step(next(iterator))  # warm-up
    fetch, compute = [], []
    for _ in range(batches):
        start = time.perf_counter()
        batch = next(iterator)
        middle = time.perf_counter()
        step(batch)
        fetch.append(middle - start)
        compute.append(time.perf_counter() - middle)
    tokens = batch.numel()
    f, c = statistics.median(fetch), statistics.median(compute)
    print(f"\n## Loader against the {preset} training step (batch {cfg.batch_size} x seq {cfg.seq_len})\n")
    print("| part | median ms/batch | tokens/s |")
    print("|---|---|---|")
    print(f"| fetch (DataLoader, cached tokens) | {f * 1e3:.3f} | {tokens / f:,.0f} |")
    print(f"| training step | {c * 1e3:.1f} | {tokens / c:,.0f} |")
    print(f"\nfetch share of a step: {100 * f / (f + c):.2f}%")
    from torch.profiler import ProfilerActivity, profile, record_function

    with profile(activities=[ProfilerActivity.CPU]) as prof:
        for _ in range(5):
            with record_function("data: next(loader)"):
                batch = next(iterator)
            with record_function("step: forward+backward+AdamW"):
                step(batch)
    rows = [e for e in prof.key_averages() if e.key.startswith(("data:", "step:"))]
    total = sum(e.cpu_time_total for e in rows)
    print("\n| profiled region (5 batches) | CPU ms | share |")
    print("|---|---|---|")
    for e in sorted(rows, key=lambda e: -e.cpu_time_total):
        print(f"| {e.key} | {e.cpu_time_total / 1e3:.1f} | {100 * e.cpu_time_total / total:.2f}% |")


if __name__ == "__main__":
    main()
