import logging
import threading

import numpy as np
import pytest

from experiments.data import token_dtype, train_bpe
from experiments.data.cache import atomic_dir
from experiments.data.token_cache import cached_tokens, load_tokens


def test_tokens_are_cached_as_a_memmap(tmp_path, caplog):
    texts = ["Now is the winter of our discontent\n", "Made glorious summer by this sun of York;\n"] * 50
    tok = train_bpe(texts, 300)
    path = tmp_path / "tokens" / "train.bin"
    with caplog.at_level(logging.INFO, logger="experiments.data.token_cache"):
        tokens, stats = cached_tokens(path, iter(texts), tok, "toy/train")
    expected = [i for t in texts for i in [*tok.encode(t), tok.eos_id]]
    assert tokens.tolist() == expected and tokens.dtype == np.uint16
    assert stats.documents == 100 and stats.tokens == len(expected) and stats.characters == sum(map(len, texts))
    assert stats.tokens_per_s > 0 and "tokens/s" in caplog.text and "toy/train: 100 documents" in caplog.text
    assert tok.decode(tokens[: len(tok.encode(texts[0])) + 1].tolist()) == texts[0] + "<|endoftext|>"
    assert (tmp_path / "tokens" / "train.bin.json").is_file()

    def no_texts():
        raise AssertionError("the text was read although the tokens are cached")
        yield

    again, stats = cached_tokens(path, no_texts(), tok)
    assert stats is None and isinstance(again, np.memmap) and again.tolist() == expected
    assert not any(p.name.endswith(".tmp") for p in path.parent.iterdir())


def test_dtype_widens_for_big_vocabularies(tmp_path):
    assert token_dtype(2048) == np.uint16 and token_dtype(65536) == np.uint16
    assert token_dtype(65537) == np.uint32 and token_dtype(151_936) == np.uint32
    assert load_tokens(tmp_path / "missing.bin", 2048) is None


def test_racing_writers_leave_one_good_file(tmp_path):
    texts = [f"Line {i}: the rest is silence.\n" * (i % 7 + 1) for i in range(200)]
    tok = train_bpe(texts, 300)
    path = tmp_path / "race" / "val.bin"
    barrier = threading.Barrier(4)
    results = []

    def run():
        barrier.wait()
        results.append(cached_tokens(path, iter(texts), tok)[0].tolist())

    threads = [threading.Thread(target=run) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    expected = [i for t in texts for i in [*tok.encode(t), tok.eos_id]]
    assert len(results) == 4 and all(r == expected for r in results)
    assert sorted(p.name for p in path.parent.iterdir()) == ["val.bin", "val.bin.json"]
    assert load_tokens(path, tok.vocab_size).tolist() == expected


def test_atomic_dir_keeps_the_first_published_copy(tmp_path):
    target = tmp_path / "corpus"
    with atomic_dir(target) as a, atomic_dir(target) as b:
        (a / "x.txt").write_text("first")
        (b / "x.txt").write_text("second")
    assert (target / "x.txt").read_text() == "second"  # b was published first (inner context exits first)
    assert [p.name for p in tmp_path.iterdir()] == ["corpus"]


def test_empty_documents_are_refused(tmp_path):
    tok = train_bpe(["some text to learn from\n"] * 10, 300)
    with pytest.raises(ValueError, match=r"^empty/train has no text: 3 documents, all empty$"):
        cached_tokens(tmp_path / "empty.bin", iter(["", "", ""]), tok, "empty/train")
    assert not list(tmp_path.iterdir())
