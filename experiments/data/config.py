"""DataConfig: which text, which tokenizer, how it is cut into batches.

Only plain field types (str, int, float, bool, optional ones, list[str]) so Hydra can register it
as a structured config. :meth:`DataConfig.validate` fails with one line naming the field (a
``ConfigError``); the training path calls it once, from ``plan_run``, and readers of a saved
config through :func:`as_data_config`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from mesh_model.errors import ConfigError

CORPORA = ("shakespeare", "kjv", "docs", "cpython", "text", "hf", "indexed")
# Corpora that need nothing but a name, so they can serve as extra validation sets.
NAMED_CORPORA = ("shakespeare", "kjv", "docs", "cpython")


@dataclass
class DataConfig:
    """Data settings; see ``experiments/data/__init__.py`` for what each corpus and tokenizer is."""

    corpus: str = "shakespeare"
    path: str | None = None
    hf_dataset: str | None = None
    hf_config: str | None = None
    hf_split: str = "train"
    hf_text_field: str = "text"
    tokenizer: str = "bpe"
    bpe_vocab_size: int = 2048
    seq_len: int = 128
    batch_size: int = 16
    val_fraction: float = 0.1
    val_batches: int = 8
    extra_val: list[str] = field(default_factory=list)
    num_workers: int = 0
    cache_dir: str | None = None
    # Check data.path (text, indexed) when the run or grid is planned, on the machine that plans it;
    # false for data that only exists where the job runs (staged to a node's local disk).
    check_path: bool = True
    # corpus=text: read invalid UTF-8 as U+FFFD (the count is said per file) instead of stopping
    replace_invalid_utf8: bool = False

    def validate(self) -> None:
        """Raise a one-line ``ConfigError`` (a ValueError) for the first bad field."""
        if self.corpus not in CORPORA:
            raise ConfigError("data.corpus", self.corpus, f"known corpora: {', '.join(CORPORA)}")
        if self.corpus in ("text", "indexed") and not self.path:
            what = "a text file or folder" if self.corpus == "text" else "the .bin/.idx prefix"
            raise ConfigError("data.path", self.path, f"corpus={self.corpus} needs data.path ({what})")
        if self.corpus == "hf" and not self.hf_dataset:
            raise ConfigError("data.hf_dataset", self.hf_dataset, "corpus=hf needs a dataset name, e.g. wikitext")
        for name in ("seq_len", "batch_size", "bpe_vocab_size"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ConfigError(f"data.{name}", value, "must be a positive integer")
        if self.bpe_vocab_size < 257:
            raise ConfigError(
                "data.bpe_vocab_size", self.bpe_vocab_size, "must be at least 257 (256 bytes + <|endoftext|>)"
            )
        if not 0.0 < self.val_fraction < 1.0:
            raise ConfigError("data.val_fraction", self.val_fraction, "must be in (0, 1)")
        if self.val_batches < 0:
            raise ConfigError("data.val_batches", self.val_batches, "must be >= 0 (0 = the whole split)")
        if self.num_workers < 0:
            raise ConfigError("data.num_workers", self.num_workers, "must be >= 0")
        if not self.tokenizer:
            raise ConfigError("data.tokenizer", self.tokenizer, "bpe, gpt2, a path to tokenizer.json or hub:<name>")
        extra = list(self.extra_val)
        for name in extra:
            if name not in NAMED_CORPORA or name == self.corpus:
                allowed = f"extra validation corpora are among {', '.join(NAMED_CORPORA)}, other than data.corpus"
                raise ConfigError("data.extra_val", extra, allowed)
        if len(set(extra)) != len(extra):
            raise ConfigError("data.extra_val", extra, "each corpus may appear once")


def as_data_config(cfg: object) -> DataConfig:
    """A validated DataConfig from a DataConfig, a Hydra/OmegaConf node or a mapping."""
    if isinstance(cfg, DataConfig):
        cfg.validate()
        return cfg
    names = DataConfig.__dataclass_fields__
    if hasattr(cfg, "keys"):
        unknown = sorted(set(cfg.keys()) - set(names))
        if unknown:
            raise ConfigError("data", unknown[0], f"unknown field; known fields: {', '.join(names)}")
    get = cfg.get if isinstance(cfg, dict) else lambda key, default=None: getattr(cfg, key, default)
    values: dict[str, Any] = {name: get(name) for name in names if get(name) is not None}
    if "extra_val" in values:
        values["extra_val"] = [str(v) for v in values["extra_val"]]
    config = DataConfig(**values)
    config.validate()
    return config
