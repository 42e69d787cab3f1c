"""The docs corpus: Debian packages fetched by URL, read without dpkg, verified, split by document.

The packages here are real ``.deb`` files built by ``dpkg-deb`` (xz, like Debian's), laid out as
linux-doc-6.1 and python3.11-doc are, and served from ``file://`` URLs; the real packages are
50 MB and are fetched by ``make data-large``.
"""

from __future__ import annotations

import gzip
import hashlib
import importlib
import subprocess
from pathlib import Path

import pytest

from experiments.data.config import DataConfig
from experiments.data.corpora import load_corpus
from experiments.data.fetch import ChecksumError, DebianPackage, deb_data_members, download_deb

# The module, not the package's re-exported fetch() of the same name.
fetch_module = importlib.import_module("experiments.data.fetch")

LINUX_FILES = {
    "index.rst": "The Linux kernel documentation\n==============================\n",
    "admin-guide/README.rst": "Linux kernel release notes. Read this before you build a kernel.\n",
    "process/howto.rst": "HOWTO do Linux kernel development.\n",
    "memory-barriers.txt": "LINUX KERNEL MEMORY BARRIERS\n",
    "translations/zh_CN/index.rst": "Chinese text, left out\n",
    "devicetree/bindings/example.yaml": "a schema, left out\n",
}
PYTHON_FILES = {
    "tutorial/index.rst.txt": "The Python Tutorial\n*******************\n",
    "library/os.rst.txt": ":mod:`os` --- Miscellaneous operating system interfaces\n",
    "contents.rst.txt": "Python Documentation contents\n",
}


def build_deb(tmp_path: Path, name: str, files: dict[str, bytes]) -> Path:
    """A real .deb (dpkg-deb, xz) holding ``files`` (paths from the filesystem root)."""
    root = tmp_path / f"{name}-root"
    (root / "DEBIAN").mkdir(parents=True)
    control = f"Package: {name}\nVersion: 1.0\nArchitecture: all\nMaintainer: t <t@t>\nDescription: test\n"
    (root / "DEBIAN" / "control").write_text(control)
    for path, data in files.items():
        target = root / path
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(data)
    deb = tmp_path / f"{name}_1.0_all.deb"
    subprocess.run(["dpkg-deb", "-Zxz", "--root-owner-group", "--build", str(root), str(deb)], check=True)
    return deb


def package(deb: Path, *urls: str) -> DebianPackage:
    return DebianPackage(deb.name, urls or (deb.as_uri(),), hashlib.sha256(deb.read_bytes()).hexdigest())


@pytest.fixture
def docs_packages(tmp_path, monkeypatch):
    """linux-doc and python-doc look-alikes, pinned in place of the real ones."""
    linux = {
        f"usr/share/doc/linux-doc-6.1/Documentation/{name}.gz": gzip.compress(text.encode())
        for name, text in LINUX_FILES.items()
    }
    linux["usr/share/doc/linux-doc-6.1/copyright"] = b"GPL-2.0\n"
    python = {f"usr/share/doc/python3.11/html/_sources/{n}": t.encode() for n, t in PYTHON_FILES.items()}
    python["usr/share/doc/python3.11/html/index.html"] = b"<html></html>"
    linux_pkg = package(build_deb(tmp_path, "linux-doc-6.1", linux))
    python_pkg = package(build_deb(tmp_path, "python3.11-doc", python))
    monkeypatch.setattr(fetch_module, "LINUX_DOC", linux_pkg)
    monkeypatch.setattr(fetch_module, "PYTHON_DOC", python_pkg)
    return linux_pkg, python_pkg


def test_deb_members_are_read_without_dpkg(tmp_path):
    deb = build_deb(tmp_path, "pkg", {"usr/share/a.txt": b"alpha\n", "usr/share/sub/b.txt": b"beta\n"})
    assert dict(deb_data_members(deb)) == {"usr/share/a.txt": b"alpha\n", "usr/share/sub/b.txt": b"beta\n"}


def test_a_file_that_is_not_a_deb_is_refused_in_one_line(tmp_path):
    fake = tmp_path / "fake.deb"
    fake.write_bytes(b"PK\x03\x04 a zip file")
    with pytest.raises(ValueError, match="not a Debian package"):
        list(deb_data_members(fake))


def test_the_next_url_is_tried_when_one_fails_and_a_wrong_file_is_refused(tmp_path):
    deb = build_deb(tmp_path, "pkg", {"usr/share/a.txt": b"alpha\n"})
    gone = (tmp_path / "superseded" / deb.name).as_uri()
    got = download_deb(package(deb, gone, deb.as_uri()), tmp_path / "dl")
    assert got.read_bytes() == deb.read_bytes()

    with pytest.raises(RuntimeError, match=r"failed at every URL \(.*superseded"):
        download_deb(package(deb, gone), tmp_path / "dl2")

    wrong = DebianPackage(deb.name, (deb.as_uri(),), "0" * 64)
    with pytest.raises(ChecksumError, match="checksum mismatch"):
        download_deb(wrong, tmp_path / "dl3")


def test_docs_corpus_keeps_the_english_sources_and_splits_by_document(tmp_path, docs_packages):
    cfg = DataConfig(corpus="docs", cache_dir=str(tmp_path / "cache"))
    corpus = load_corpus(cfg)
    assert corpus.names == (
        "linux/admin-guide/README.rst",
        "linux/index.rst",
        "linux/memory-barriers.txt",
        "linux/process/howto.rst",
        "python/contents.rst",
        "python/library/os.rst",
        "python/tutorial/index.rst",
    )
    assert corpus.read("linux/process/howto.rst") == LINUX_FILES["process/howto.rst"]  # gunzipped
    assert corpus.read("python/library/os.rst") == PYTHON_FILES["library/os.rst.txt"]
    train, val = corpus.split(0.3)
    assert len(val) == 2 and not set(train) & set(val) and sorted(train + val) == list(corpus.names)
    assert [n for n, _ in corpus.split_documents("val", 0.3)] == val

    # Cached: the same identity without downloading again (the URLs are gone now).
    for pkg in docs_packages:
        Path(pkg.urls[0].removeprefix("file://")).unlink()
    again = load_corpus(cfg)
    assert again.identity == corpus.identity and again.content_digest == corpus.content_digest


def test_an_edited_cached_document_is_fetched_again(tmp_path, docs_packages, capfd):
    cfg = DataConfig(corpus="docs", cache_dir=str(tmp_path / "cache"))
    corpus = load_corpus(cfg)
    edited = tmp_path / "cache" / "corpora" / "docs" / "python" / "library" / "os.rst"
    edited.write_text("damaged\n")
    again = load_corpus(cfg)
    err = capfd.readouterr().err
    assert "os.rst differs from its recorded sha256" in err and "fetching python3.11-doc" in err
    assert again.read("python/library/os.rst") == PYTHON_FILES["library/os.rst.txt"]
    assert again.content_digest == corpus.content_digest


def test_the_pinned_packages_name_a_permanent_fallback():
    for pkg in (fetch_module.LINUX_DOC, fetch_module.PYTHON_DOC):
        assert pkg.urls[0].startswith("https://deb.debian.org/") and pkg.urls[0].endswith(pkg.filename)
        assert pkg.urls[-1].startswith("https://snapshot.debian.org/file/")
        assert len(pkg.sha256) == 64
