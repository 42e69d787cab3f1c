"""``python -m experiments.data``: fetch the data ahead of time, or show what a config gives.

python -m experiments.data fetch                                  # the shakespeare corpus
python -m experiments.data fetch --corpus shakespeare kjv --tokenizer gpt2
python -m experiments.data info --corpus kjv --tokenizer bpe      # split, vocab, token counts
"""

from __future__ import annotations

import argparse
import logging
import sys
import time
from collections.abc import Sequence

from experiments.data.cache import cache_root
from experiments.data.config import CORPORA, DataConfig
from experiments.data.corpora import load_corpus
from experiments.data.fetch import fetch
from experiments.data.prepare import prepare
from mesh_model.cli_text import parser_for


def _fetch(args: argparse.Namespace) -> int:
    start = time.perf_counter()
    for path in fetch(args.corpus, args.tokenizer, args.cache_dir):
        print(path)
    print(f"fetched in {time.perf_counter() - start:.1f}s (cache: {cache_root(args.cache_dir)})")
    return 0


def _info(args: argparse.Namespace) -> int:
    cfg = DataConfig(
        corpus=args.corpus,
        path=args.path,
        tokenizer=args.tokenizer,
        bpe_vocab_size=args.bpe_vocab_size,
        val_fraction=args.val_fraction,
        extra_val=args.extra_val,
        cache_dir=args.cache_dir,
    )
    cfg.validate()
    start = time.perf_counter()
    data = prepare(cfg)
    print(f"cache: {cache_root(cfg.cache_dir)}")
    if cfg.corpus != "indexed":
        corpus = load_corpus(cfg)
        train, val = corpus.split(cfg.val_fraction) if len(corpus.names) > 1 else (corpus.names, corpus.names)
        print(f"documents: {len(corpus.names)} ({len(train)} train, {len(val)} val)")
        print(f"validation documents: {', '.join(val)}")
    for key, value in data.describe().items():
        print(f"{key}: {f'{value:,}' if isinstance(value, int) else value}")
    for label, stats in data.stats.items():
        print(
            f"tokenized {label}: {stats.tokens:,} tokens in {stats.seconds:.2f}s ({stats.tokens_per_s:,.0f} tokens/s)"
        )
    print(f"prepared in {time.perf_counter() - start:.2f}s")
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    parser = parser_for("python -m experiments.data", __doc__)
    parser.add_argument("--cache-dir", default=None, help="default: $MESH_CACHE_DIR or ~/.cache/mesh-recursive")
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("fetch", help="download and cache corpora and tokenizer files (idempotent)")
    p.add_argument("--corpus", nargs="*", default=["shakespeare"], choices=CORPORA)
    p.add_argument("--tokenizer", nargs="*", default=[], choices=["gpt2"])
    p.set_defaults(run=_fetch)
    p = sub.add_parser("info", help="prepare a config (tokenizing if needed) and print its split and sizes")
    p.add_argument("--corpus", default="shakespeare", choices=CORPORA)
    p.add_argument("--path", default=None)
    p.add_argument("--tokenizer", default="bpe")
    p.add_argument("--bpe-vocab-size", type=int, default=2048)
    p.add_argument("--val-fraction", type=float, default=0.1)
    p.add_argument("--extra-val", nargs="*", default=[])
    p.set_defaults(run=_info)
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    try:
        return args.run(args)
    except (ValueError, RuntimeError, OSError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
