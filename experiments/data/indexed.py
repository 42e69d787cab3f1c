"""Megatron / GPT-NeoX ``MMapIndexedDataset``: pre-tokenized documents in ``prefix.bin`` + ``prefix.idx``.

Pythia's (deduplicated) Pile ships in this format with uint16 tokens. ``.bin`` is the raw tokens
of every sequence back to back. ``.idx`` is little-endian::

    b"MMIDIDX\\x00\\x00"      magic (9 bytes)
    <Q version = 1
    <B dtype code (DTYPES)
    <Q number of sequences, <Q length of doc_idx
    sizes     int32[sequences]   tokens per sequence
    pointers  int64[sequences]   byte offset of each sequence in .bin
    doc_idx   int64[documents+1] first sequence of each document (GPT data: one sequence per document)
"""

from __future__ import annotations

import struct
from collections.abc import Iterable, Sequence
from pathlib import Path

import numpy as np

from experiments.data.cache import atomic_path
from mesh_model.errors import ConfigError

MAGIC = b"MMIDIDX\x00\x00"
VERSION = 1
# Megatron-core's codes (gpt-neox's older table stores float64 under both 6 and 7).
DTYPES: dict[int, type[np.generic]] = {
    1: np.uint8,
    2: np.int8,
    3: np.int16,
    4: np.int32,
    5: np.int64,
    6: np.float64,
    7: np.float32,
    8: np.uint16,
}
CODES = {np.dtype(t): c for c, t in DTYPES.items()}


def _map(path: Path, dtype: type, offset: int, n: int) -> np.ndarray:
    """A read-only memmap of ``n`` items at ``offset`` (an empty array when n is 0: mmap refuses length 0)."""
    return np.memmap(path, dtype, "r", offset, (n,)) if n else np.zeros(0, dtype)


def _paths(prefix: str | Path) -> tuple[Path, Path]:
    prefix = str(prefix)
    return Path(prefix + ".bin"), Path(prefix + ".idx")


def write_indexed(
    prefix: str | Path, documents: Iterable[Sequence[int] | np.ndarray], dtype: type | np.dtype = np.uint16
) -> tuple[Path, Path]:
    """Write ``documents`` (token sequences, one per document) as ``prefix.bin``/``prefix.idx``."""
    dtype = np.dtype(dtype)
    if dtype not in CODES:
        raise ValueError(f"dtype={dtype} is invalid: one of {', '.join(str(np.dtype(t)) for t in DTYPES.values())}")
    bin_path, idx_path = _paths(prefix)
    sizes: list[int] = []
    with atomic_path(bin_path) as tmp, open(tmp, "wb") as f:
        for doc in documents:
            arr = np.asarray(doc)
            if arr.size and np.issubdtype(dtype, np.integer):
                info = np.iinfo(dtype)
                if arr.min() < info.min or arr.max() > info.max:
                    raise ValueError(f"a token id does not fit {dtype}: range {arr.min()}..{arr.max()}")
            f.write(arr.astype(dtype, copy=False).tobytes())
            sizes.append(int(arr.size))
    size_arr = np.asarray(sizes, dtype=np.int32)
    pointers = np.zeros(len(sizes), dtype=np.int64)
    np.cumsum(size_arr[:-1].astype(np.int64) * dtype.itemsize, out=pointers[1:])
    doc_idx = np.arange(len(sizes) + 1, dtype=np.int64)
    with atomic_path(idx_path) as tmp, open(tmp, "wb") as f:
        f.write(MAGIC)
        f.write(struct.pack("<Q", VERSION))
        f.write(struct.pack("<B", CODES[dtype]))
        f.write(struct.pack("<Q", len(sizes)))
        f.write(struct.pack("<Q", len(doc_idx)))
        f.write(size_arr.tobytes())
        f.write(pointers.tobytes())
        f.write(doc_idx.tobytes())
    return bin_path, idx_path


def check_indexed(prefix: str) -> None:
    """Refuse, in one line, a ``data.path`` that is not the prefix of a readable ``.bin``/``.idx``
    pair: checked when a run (or every cell of a grid) is planned, before anything starts."""
    allowed = "give the prefix of a Megatron .bin/.idx pair (data.path=DIR/NAME for DIR/NAME.bin and DIR/NAME.idx)"
    try:
        IndexedDataset(prefix)
    except FileNotFoundError:
        missing = [p.name for p in _paths(prefix) if not p.is_file()]
        raise ConfigError("data.path", prefix, f"{' and '.join(missing)} not found; {allowed}") from None
    except (OSError, ValueError) as error:
        raise ConfigError("data.path", prefix, f"{str(error).splitlines()[0]}; {allowed}") from None


class IndexedDataset:
    """Read-only view of ``prefix.bin``/``prefix.idx``; tokens stay memory-mapped on disk."""

    def __init__(self, prefix: str | Path) -> None:
        self.bin_path, self.idx_path = _paths(prefix)
        for p in (self.bin_path, self.idx_path):
            if not p.is_file():
                raise FileNotFoundError(f"data.path={str(prefix)!r} is invalid: {p} does not exist")
        with open(self.idx_path, "rb") as f:
            header = f.read(len(MAGIC) + 8 + 1 + 8 + 8)
        if len(header) < 34 or header[: len(MAGIC)] != MAGIC:
            raise ValueError(f"{self.idx_path} is not a Megatron MMapIndexedDataset index (bad magic)")
        version, code, n_seq, n_doc = struct.unpack("<QBQQ", header[len(MAGIC) :])
        if version != VERSION or code not in DTYPES:
            raise ValueError(f"{self.idx_path}: unsupported version {version} or dtype code {code}")
        self.dtype = np.dtype(DTYPES[code])
        offset = len(header)
        expected = offset + 12 * n_seq + 8 * n_doc
        if self.idx_path.stat().st_size < expected:
            raise ValueError(
                f"{self.idx_path} is truncated: {self.idx_path.stat().st_size} bytes, header needs {expected}"
            )
        self.sizes = _map(self.idx_path, np.int32, offset, n_seq)
        offset += 4 * n_seq
        self.pointers = _map(self.idx_path, np.int64, offset, n_seq)
        offset += 8 * n_seq
        self.doc_idx = _map(self.idx_path, np.int64, offset, n_doc)
        n_tokens = self.bin_path.stat().st_size // self.dtype.itemsize
        # np.memmap cannot map an empty file; an all-empty dataset gets an empty array.
        self._tokens = np.memmap(self.bin_path, self.dtype, "r") if n_tokens else np.zeros(0, self.dtype)

    def __len__(self) -> int:
        """Number of sequences (= documents for GPT data written one sequence per document)."""
        return len(self.sizes)

    def __getitem__(self, i: int) -> np.ndarray:
        if not -len(self) <= i < len(self):
            raise IndexError(f"sequence {i} out of range for {len(self)} sequences")
        start = int(self.pointers[i]) // self.dtype.itemsize
        return self._tokens[start : start + int(self.sizes[i])]

    @property
    def num_documents(self) -> int:
        return len(self.doc_idx) - 1

    def tokens(self, start: int = 0, stop: int | None = None) -> np.memmap | np.ndarray:
        """The flat token stream (every sequence back to back), or a ``[start, stop)`` slice of it.

        Returned as its own ``np.memmap`` with that offset, so it can be reopened in a worker.
        """
        total = len(self._tokens)
        stop = total if stop is None else stop
        if not 0 <= start <= stop <= total:
            raise IndexError(f"tokens [{start}, {stop}) out of range for {total} tokens")
        if start == stop:
            return np.zeros(0, self.dtype)
        return np.memmap(self.bin_path, self.dtype, "r", start * self.dtype.itemsize, (stop - start,))

    def document_token_start(self, doc: int) -> int:
        """Index in :meth:`tokens` where document ``doc`` starts (``num_documents`` gives the end)."""
        seq = int(self.doc_idx[doc])
        if seq == len(self):
            return len(self._tokens)
        return int(self.pointers[seq]) // self.dtype.itemsize
