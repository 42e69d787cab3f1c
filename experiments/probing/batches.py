"""The held-out batches every probe reads: the first batches of the main validation split, and what
``probes.json`` records about them."""

from __future__ import annotations

from typing import Any

from torch import Tensor
from torch.utils.data import DataLoader

from experiments.data.config import DataConfig
from experiments.data.datamodule import TokenWindows
from experiments.data.prepare import PreparedData


def held_out_batches(data: DataConfig, prepared: PreparedData, num_batches: int, seq_len: int) -> list[Tensor]:
    """The first ``num_batches`` batches of ``data.batch_size`` samples of ``seq_len`` tokens of the
    main validation split (fewer if the split is short; an error if it holds not even one)."""
    tokens = prepared.val["val"]
    windows = TokenWindows(tokens, seq_len, limit=num_batches * data.batch_size)
    if len(windows) == 0:
        raise ValueError(f"probes.seq_len={seq_len} is invalid: the validation split has only {len(tokens)} tokens")
    return list(DataLoader(windows, batch_size=data.batch_size))


def describe_batches(data: DataConfig, batches: list[Tensor]) -> dict[str, Any]:
    """What ``probes.json`` records about the held-out set: ``seq_len`` is the rows of a sample,
    ``window`` the length the model read them in."""
    split = {"split": f"{data.corpus}/val", "num_batches": len(batches)}
    return {**split, "batch_size": data.batch_size, "seq_len": batches[0].shape[1], "window": data.seq_len}


__all__ = ["describe_batches", "held_out_batches"]
