"""``TokenDataModule``: fixed-length windows of the cached token streams for Lightning.

A sample is ``seq_len`` consecutive token ids (int64), cut from the flat stream at multiples of
``seq_len`` (non-overlapping; documents run into each other, separated by EOS). The model shifts
labels itself, so there is no separate target.
"""

from __future__ import annotations

import mmap
from typing import Any

import numpy as np
import torch
from lightning.pytorch import LightningDataModule
from torch.utils.data import DataLoader, Dataset

from experiments.data.config import DataConfig, as_data_config
from experiments.data.prepare import PreparedData, prepare
from experiments.data.sampler import ResumableLoader
from mesh_model.errors import ConfigError


class TokenWindows(Dataset):
    """Window ``i`` is ``tokens[i*seq_len : (i+1)*seq_len]`` as int64; ``limit`` keeps the first windows."""

    def __init__(self, tokens: np.ndarray, seq_len: int, limit: int | None = None) -> None:
        self.tokens = tokens
        self.seq_len = seq_len
        n = len(tokens) // seq_len
        self.n = n if limit is None else min(n, limit)

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> torch.Tensor:
        if not 0 <= i < self.n:
            raise IndexError(i)
        start = i * self.seq_len
        return torch.from_numpy(self.tokens[start : start + self.seq_len].astype(np.int64))

    def __getstate__(self) -> dict[str, Any]:
        # Pickling a memmap would copy the whole file into every spawned worker; send its address instead.
        state = self.__dict__.copy()
        t = self.tokens
        if isinstance(t, np.memmap) and isinstance(t.base, mmap.mmap) and t.filename is not None:
            state["tokens"] = ("memmap", t.filename, t.dtype.str, t.offset, t.shape)
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        t = state["tokens"]
        if isinstance(t, tuple) and t[0] == "memmap":
            _, filename, dtype, offset, shape = t
            state["tokens"] = np.memmap(filename, np.dtype(dtype), "r", offset, shape)
        self.__dict__.update(state)


class TokenDataModule(LightningDataModule):
    """Train/validation loaders from a :class:`DataConfig`.

    ``val_dataloader()`` returns one loader per validation set, in the order of ``val_names``
    ("val" first, then each ``extra_val`` corpus). ``seed`` fixes the training order, and the
    training loader resumes exactly where a checkpoint left it. Pass
    ``prepared`` (from :func:`prepare` on the same config) to reuse what a caller already loaded.
    """

    def __init__(self, cfg: DataConfig | object, seed: int = 0, prepared: PreparedData | None = None) -> None:
        super().__init__()
        self.cfg = as_data_config(cfg)
        self.seed = seed
        self._data = prepared
        self.val_names: list[str] = ["val", *self.cfg.extra_val]

    def prepare_data(self) -> None:
        """Download, train the tokenizer and tokenize (Lightning runs this on one process per node)."""
        if self._data is None:
            prepare(self.cfg)

    def setup(self, stage: str | None = None) -> None:
        """Memory-map the cached splits and check that each holds at least one window."""
        data = self.data
        cfg = self.cfg
        for name, tokens in [("train", data.train), *data.val.items()]:
            if len(tokens) < cfg.seq_len:
                raise ConfigError(
                    "data.seq_len",
                    cfg.seq_len,
                    f"the {name!r} split has only {len(tokens):,} tokens, fewer than one window; "
                    "lower seq_len or raise val_fraction",
                )
        windows = len(data.train) // cfg.seq_len
        if windows < cfg.batch_size:
            raise ConfigError(
                "data.batch_size",
                cfg.batch_size,
                f"the train split has only {windows} windows of seq_len={cfg.seq_len}, fewer than one batch",
            )

    @property
    def data(self) -> PreparedData:
        """The prepared token streams (prepared on first access)."""
        if self._data is None:
            self._data = prepare(self.cfg)
        return self._data

    @property
    def vocab_size(self) -> int:
        return self.data.vocab_size

    def train_dataloader(self) -> ResumableLoader:
        """A seeded permutation per epoch whose position checkpoints keep (experiments/data/sampler.py)."""
        workers = self.cfg.num_workers
        return ResumableLoader(
            TokenWindows(self.data.train, self.cfg.seq_len),
            batch_size=self.cfg.batch_size,
            seed=self.seed,
            steps_taken=self._steps_taken,
            batches_per_step=self._accumulation(),
            num_workers=workers,
            persistent_workers=workers > 0,
            pin_memory=torch.cuda.is_available(),
        )

    def _accumulation(self) -> int:
        trainer = getattr(self, "trainer", None)
        return trainer.accumulate_grad_batches if trainer is not None else 1

    def _steps_taken(self) -> int:
        """Micro-batches consumed: the optimizer steps taken x the micro-batches of each."""
        trainer = getattr(self, "trainer", None)
        return trainer.global_step * trainer.accumulate_grad_batches if trainer is not None else 0

    def val_dataloader(self) -> list[DataLoader]:
        limit = self.cfg.val_batches * self.cfg.batch_size or None
        return [self._loader(TokenWindows(self.data.val[n], self.cfg.seq_len, limit)) for n in self.val_names]

    def _loader(self, dataset: TokenWindows) -> DataLoader:
        workers = self.cfg.num_workers
        return DataLoader(
            dataset,
            batch_size=self.cfg.batch_size,
            num_workers=workers,
            persistent_workers=workers > 0,
            pin_memory=torch.cuda.is_available(),
        )
