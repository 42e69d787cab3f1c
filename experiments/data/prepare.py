"""``prepare(cfg)``: corpus -> tokenizer -> cached token streams, without Lightning.

Callers that must know the vocabulary before building the model call this directly; the
datamodule calls it too. The first call downloads, trains the BPE and tokenizes; later calls only
memory-map the cached files.
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from experiments.data.cache import atomic_path, cache_root, digest
from experiments.data.config import DataConfig, as_data_config
from experiments.data.corpora import Corpus, load_corpus
from experiments.data.indexed import IndexedDataset
from experiments.data.token_cache import TokenStats, cached_tokens, recorded_replacements
from experiments.data.tokenizer import TextTokenizer, load_tokenizer
from mesh_model.errors import ConfigError

log = logging.getLogger(__name__)

TOKEN_FORMAT = "tokens-v1"  # bump to invalidate every token cache


@dataclass
class PreparedData:
    """Flat token streams (read-only memmaps) of the training split and each validation set.

    ``val`` has "val" (the corpus's held-out documents) first, then each ``extra_val`` corpus by
    name. ``tokenizer`` is None only for an indexed corpus read without one (``tokenizer=bpe``).
    """

    train: np.ndarray
    val: dict[str, np.ndarray]
    vocab_size: int
    eos_id: int | None
    tokenizer: TextTokenizer | None
    corpus: str
    identity: str
    stats: dict[str, TokenStats] = field(default_factory=dict)  # splits tokenized by this call
    # U+FFFD characters per split ("shakespeare/train"...), from the token caches' records; None
    # where a cache predates the count (an indexed corpus has none)
    replacement_chars: dict[str, int | None] = field(default_factory=dict)

    @property
    def total_replacement_chars(self) -> int | None:
        """U+FFFD characters over every split tokenized, None when a split's count is unknown."""
        counts = list(self.replacement_chars.values())
        return None if any(c is None for c in counts) else sum(c for c in counts if c is not None)

    @property
    def train_tokens(self) -> int:
        return len(self.train)

    @property
    def val_tokens(self) -> dict[str, int]:
        return {name: len(tokens) for name, tokens in self.val.items()}

    def describe(self) -> dict[str, str | int]:
        """Flat summary for logs and MLflow params."""
        out: dict[str, str | int] = {
            "data.corpus": self.corpus,
            "data.identity": self.identity,
            "data.tokenizer": self.tokenizer.identity if self.tokenizer else "none",
            "data.vocab_size": self.vocab_size,
            "data.train_tokens": self.train_tokens,
        }
        out |= {f"data.{name}_tokens": n for name, n in self.val_tokens.items()}
        return out


def token_path(cfg: DataConfig, corpus: Corpus, tokenizer: TextTokenizer, split: str) -> Path:
    """Cache file of one split, keyed by (corpus identity, val_fraction, tokenizer identity)."""
    key = digest(corpus.identity, cfg.val_fraction, tokenizer.identity, TOKEN_FORMAT)
    return cache_root(cfg.cache_dir) / "tokens" / f"{corpus.name}-{key}" / f"{split}.bin"


def _text_split(
    cfg: DataConfig,
    corpus: Corpus,
    tokenizer: TextTokenizer,
    split: str,
    stats: dict[str, TokenStats],
    replacements: dict[str, int | None],
) -> np.ndarray:
    texts = (text for _, text in corpus.split_documents(split, cfg.val_fraction))
    label = f"{corpus.name}/{split}"
    path = token_path(cfg, corpus, tokenizer, split)
    tokens, built = cached_tokens(path, texts, tokenizer, label, corpus.content_digest)
    if built is not None:
        stats[label] = built
    replacements[label] = built.replacement_chars if built is not None else recorded_replacements(path)
    return tokens


def prepare(cfg: DataConfig | object) -> PreparedData:
    """Fetch, tokenize and cache as needed; return memory-mapped train/validation tokens."""
    cfg = as_data_config(cfg)
    if cfg.corpus == "indexed":
        return _prepare_indexed(cfg)
    corpus = load_corpus(cfg)
    tokenizer = load_tokenizer(cfg.tokenizer, corpus, cfg.val_fraction, cfg.bpe_vocab_size, cfg.cache_dir)
    stats: dict[str, TokenStats] = {}
    replaced: dict[str, int | None] = {}
    train = _text_split(cfg, corpus, tokenizer, "train", stats, replaced)
    val = {"val": _text_split(cfg, corpus, tokenizer, "val", stats, replaced)}
    for name in cfg.extra_val:
        val[name] = _text_split(cfg, load_corpus(cfg, name), tokenizer, "val", stats, replaced)
    return PreparedData(
        train, val, tokenizer.vocab_size, tokenizer.eos_id, tokenizer, corpus.name, corpus.identity, stats, replaced
    )


def _prepare_indexed(cfg: DataConfig) -> PreparedData:
    """Pre-tokenized data: the last ``val_fraction`` of documents are held out.

    Not the hash rule: the token stream is used in place (Pythia's Pile is ~300B tokens, too big
    to copy), so each split must be one contiguous range. Pythia's documents are already shuffled.
    """
    data = IndexedDataset(cfg.path or "")
    n_docs = data.num_documents
    if n_docs < 2:
        raise ConfigError("data.path", cfg.path, f"{n_docs} documents; a train/validation split needs at least 2")
    k = min(n_docs - 1, max(1, round(cfg.val_fraction * n_docs)))
    cut = data.document_token_start(n_docs - k)
    train, val_tokens = data.tokens(0, cut), data.tokens(cut)
    bin_stat = data.bin_path.stat()
    identity = f"indexed-{digest(str(data.bin_path.resolve()), bin_stat.st_size, bin_stat.st_mtime_ns, length=12)}"
    tokenizer = None
    if cfg.tokenizer != "bpe":
        tokenizer = load_tokenizer(cfg.tokenizer, cache_dir=cfg.cache_dir)
    elif cfg.extra_val:
        raise ConfigError(
            "data.extra_val",
            list(cfg.extra_val),
            "corpus=indexed has no text to train bpe on; set data.tokenizer (gpt2, a tokenizer.json or hub:<name>)",
        )
    vocab_size = tokenizer.vocab_size if tokenizer else _max_token_id(cfg, data, identity) + 1
    val = {"val": val_tokens}
    stats: dict[str, TokenStats] = {}
    for name in cfg.extra_val:
        assert tokenizer is not None
        val[name] = _text_split(cfg, load_corpus(cfg, name), tokenizer, "val", stats)
    eos_id = tokenizer.eos_id if tokenizer else None
    return PreparedData(train, val, vocab_size, eos_id, tokenizer, "indexed", identity, stats)


def _max_token_id(cfg: DataConfig, data: IndexedDataset, identity: str) -> int:
    """The largest token id in the .bin, scanned once in chunks and cached."""
    path = cache_root(cfg.cache_dir) / "indexed" / f"{identity}.json"
    if path.is_file():
        return int(json.loads(path.read_text())["max_token_id"])
    tokens = data.tokens()
    chunk = 1 << 26
    top = max((int(tokens[i : i + chunk].max()) for i in range(0, len(tokens), chunk)), default=0)
    with atomic_path(path) as tmp:
        tmp.write_text(json.dumps({"max_token_id": top, "bin": str(data.bin_path)}) + "\n")
    log.info("indexed %s: max token id %d (no tokenizer given; vocab_size = %d)", data.bin_path, top, top + 1)
    return top
