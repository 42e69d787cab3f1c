import struct

import numpy as np
import pytest
import torch

from experiments.data import DataConfig, IndexedDataset, prepare, write_indexed
from experiments.data.datamodule import TokenDataModule


@pytest.mark.parametrize("dtype", [np.uint16, np.int32, np.uint8, np.int64])
def test_round_trip(tmp_path, dtype):
    rng = np.random.default_rng(0)
    top = min(np.iinfo(dtype).max, 50_000)
    docs = [rng.integers(0, top, size=n) for n in (5, 0, 17, 1, 300)]
    write_indexed(tmp_path / "ds", docs, dtype)
    ds = IndexedDataset(tmp_path / "ds")
    assert len(ds) == 5 and ds.num_documents == 5 and ds.dtype == np.dtype(dtype)
    assert ds.sizes.tolist() == [5, 0, 17, 1, 300]
    assert ds.doc_idx.tolist() == [0, 1, 2, 3, 4, 5]
    for i, doc in enumerate(docs):
        assert ds[i].dtype == np.dtype(dtype) and ds[i].tolist() == doc.tolist()
    assert ds[1].size == 0 and ds[-1].tolist() == docs[-1].tolist()
    assert ds.tokens().tolist() == np.concatenate(docs).tolist()
    assert ds.document_token_start(2) == 5 and ds.document_token_start(5) == 323
    with pytest.raises(IndexError):
        ds[5]


def test_header_bytes_are_megatrons(tmp_path):
    write_indexed(tmp_path / "ds", [[1, 2, 3], [4]], np.uint16)
    raw = (tmp_path / "ds.idx").read_bytes()
    assert raw[:9] == b"MMIDIDX\x00\x00"
    assert struct.unpack("<QBQQ", raw[9:34]) == (1, 8, 2, 3)  # version 1, uint16 is code 8, 2 sequences, 3 doc_idx
    assert np.frombuffer(raw[34:42], np.int32).tolist() == [3, 1]  # sizes
    assert np.frombuffer(raw[42:58], np.int64).tolist() == [0, 6]  # byte pointers
    assert np.frombuffer(raw[58:82], np.int64).tolist() == [0, 1, 2]  # doc_idx
    assert len(raw) == 82
    assert (tmp_path / "ds.bin").read_bytes() == np.array([1, 2, 3, 4], np.uint16).tobytes()


def test_bad_files_and_values(tmp_path):
    with pytest.raises(ValueError, match="does not fit uint8"):
        write_indexed(tmp_path / "ds", [[1, 300]], np.uint8)
    with pytest.raises(FileNotFoundError, match="data.path="):
        IndexedDataset(tmp_path / "missing")
    (tmp_path / "x.bin").write_bytes(b"")
    (tmp_path / "x.idx").write_bytes(b"TNTIDX\x00\x00" + bytes(40))
    with pytest.raises(ValueError, match="bad magic"):
        IndexedDataset(tmp_path / "x")
    write_indexed(tmp_path / "empty", [], np.uint16)
    assert len(IndexedDataset(tmp_path / "empty")) == 0 and IndexedDataset(tmp_path / "empty").tokens().size == 0


def test_prepare_and_datamodule_on_an_indexed_corpus(tmp_path):
    rng = np.random.default_rng(1)
    docs = [np.append(rng.integers(1, 1000, size=rng.integers(50, 150)), 0) for _ in range(40)]  # eod = 0
    write_indexed(tmp_path / "pile", docs, np.uint16)
    cfg = DataConfig(corpus="indexed", path=str(tmp_path / "pile"), seq_len=16, batch_size=4, cache_dir=str(tmp_path))
    data = prepare(cfg)
    # The last 10% of documents (4 of 40) are held out, as one contiguous range used in place.
    assert data.val_tokens == {"val": sum(len(d) for d in docs[36:])}
    assert data.train_tokens == sum(len(d) for d in docs[:36])
    assert data.train.tolist() == np.concatenate(docs[:36]).tolist()
    assert isinstance(data.train, np.memmap) and isinstance(data.val["val"], np.memmap)
    expected_vocab = int(max(d.max() for d in docs)) + 1
    assert data.vocab_size == expected_vocab and data.tokenizer is None and data.eos_id is None
    assert prepare(cfg).vocab_size == expected_vocab  # from the cached scan
    dm = TokenDataModule(cfg)
    dm.setup("fit")
    batch = next(iter(dm.train_dataloader()))
    assert batch.shape == (4, 16) and batch.dtype == torch.int64 and int(batch.max()) < expected_vocab
    gpt2 = prepare(DataConfig(corpus="indexed", path=str(tmp_path / "pile"), tokenizer="gpt2"))
    assert gpt2.vocab_size == 50257 and gpt2.eos_id == 50256
