import pickle

import numpy as np
import pytest
import torch

from experiments.data import DataConfig, prepare
from experiments.data.datamodule import TokenDataModule, TokenWindows
from mesh_model.errors import ConfigError


@pytest.fixture(scope="module")
def dm():
    module = TokenDataModule(DataConfig(seq_len=64, batch_size=8, val_batches=3, extra_val=["kjv"]), seed=7)
    module.prepare_data()
    module.setup("fit")
    return module


def test_default_shakespeare_bpe_2048_splits():
    data = prepare(DataConfig())
    assert data.vocab_size == 2048 and data.eos_id == 0 and data.corpus == "shakespeare"
    assert isinstance(data.train, np.memmap) and data.train.dtype == np.uint16
    assert 1_500_000 < data.train_tokens < 1_900_000 and 150_000 < data.val_tokens["val"] < 250_000
    assert int((np.asarray(data.train) == data.eos_id).sum()) == 38  # one EOS after each training play
    assert int((np.asarray(data.val["val"]) == data.eos_id).sum()) == 4
    assert data.tokenizer.decode(data.val["val"][:6].tolist()).startswith("KING HENRY IV")
    assert data.describe()["data.vocab_size"] == 2048


def test_batches_have_the_configured_shape(dm):
    assert dm.vocab_size == 2048 and dm.val_names == ["val", "kjv"]
    batch = next(iter(dm.train_dataloader()))
    assert batch.shape == (8, 64) and batch.dtype == torch.int64
    assert int(batch.min()) >= 0 and int(batch.max()) < dm.vocab_size
    loaders = dm.val_dataloader()
    assert len(loaders) == 2
    for loader in loaders:
        batches = list(loader)
        assert len(batches) == 3 and all(b.shape == (8, 64) for b in batches)
    # Validation windows are sequential: the first is the split's first 64 tokens.
    assert next(iter(loaders[0]))[0].tolist() == dm.data.val["val"][:64].tolist()
    assert next(iter(loaders[1]))[0].tolist() == dm.data.val["kjv"][:64].tolist()
    full = TokenDataModule(DataConfig(seq_len=64, batch_size=8, val_batches=0))
    assert len(full.val_dataloader()[0].dataset) == full.data.val_tokens["val"] // 64


def test_same_seed_same_order(dm):
    first = next(iter(dm.train_dataloader()))
    assert torch.equal(first, next(iter(dm.train_dataloader())))
    same = TokenDataModule(dm.cfg, seed=7)
    assert torch.equal(first, next(iter(same.train_dataloader())))
    reused = TokenDataModule(dm.cfg, seed=7, prepared=dm.data)
    assert reused.data is dm.data and torch.equal(first, next(iter(reused.train_dataloader())))
    other = TokenDataModule(dm.cfg, seed=8)
    assert not torch.equal(first, next(iter(other.train_dataloader())))
    # The train loader drops the last partial batch and covers each window at most once per epoch.
    loader = dm.train_dataloader()
    assert len(loader) == (dm.data.train_tokens // 64) // 8


def test_windows_pickle_without_their_tokens(dm):
    windows = TokenWindows(dm.data.train, 64)
    blob = pickle.dumps(windows)
    assert len(blob) < 1000  # the memmap's address, not its 3 MB of tokens
    clone = pickle.loads(blob)
    assert len(clone) == len(windows) and torch.equal(clone[123], windows[123])
    assert torch.equal(windows[0], torch.from_numpy(dm.data.train[:64].astype(np.int64)))
    small = TokenWindows(np.arange(10, dtype=np.uint16), 4)
    assert len(small) == 2 and pickle.loads(pickle.dumps(small))[1].tolist() == [4, 5, 6, 7]
    with pytest.raises(IndexError):
        small[2]


def test_a_window_longer_than_a_split_is_one_line(tmp_path):
    folder = tmp_path / "docs"
    folder.mkdir()
    for i in range(4):
        (folder / f"{i}.txt").write_text(f"document {i} " * 40)
    cfg = DataConfig(corpus="text", path=str(folder), bpe_vocab_size=300, seq_len=512, cache_dir=str(tmp_path))
    with pytest.raises(ConfigError) as info:
        TokenDataModule(cfg).setup("fit")
    message = str(info.value)
    assert "\n" not in message and message.startswith("data.seq_len=512 is invalid: the 'train' split has only ")
    cfg = DataConfig(
        corpus="text", path=str(folder), bpe_vocab_size=300, seq_len=4, batch_size=10_000, cache_dir=str(tmp_path)
    )
    with pytest.raises(ConfigError, match=r"^data.batch_size=10000 is invalid: the train split has only \d+ windows"):
        TokenDataModule(cfg).setup("fit")
