"""The training order, resumable exactly: a seeded permutation per epoch and a loader whose
position is saved in every checkpoint.

Epoch ``e`` visits the windows in ``randperm(n, seed=hash(seed, e))``, so the order depends only
on the run's seed and the epoch, never on how many processes came before. The position is the
number of batches taken (optimizer steps x accumulated micro-batches): a checkpoint after ``s``
batches resumes at epoch ``s // batches_per_epoch``, batch ``s % batches_per_epoch``, and the
resumed run sees exactly the batches the uninterrupted one would have seen. With accumulation an
epoch is cut to whole optimizer steps, so no step straddles two epochs (Lightning would step
early at an epoch's end, on fewer micro-batches).

Under data parallelism every rank draws the same permutation and takes every ``world``-th window
of it, from its rank on (the Trainer runs with ``use_distributed_sampler=False``: Lightning's
``DistributedSampler`` would replace this one and its position).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import torch
from torch.utils.data import DataLoader, Dataset, Sampler

STATE_VERSION = 1


class EpochPermutation(Sampler[int]):
    """A permutation of ``range(n)`` per epoch, from ``(seed, epoch)``; it can start part-way."""

    def __init__(self, n: int, seed: int, batch_size: int, batches_per_step: int = 1) -> None:
        self.n = n
        self.seed = seed
        self.batch_size = batch_size
        self.batches_per_step = batches_per_step
        self.epoch = 0
        self._skip_batches = 0

    def set_epoch(self, epoch: int) -> None:
        """Lightning calls this at every epoch start; a resume position set for the same epoch stays."""
        if epoch != self.epoch:
            self.epoch = epoch
            self._skip_batches = 0

    def resume_at(self, epoch: int, batches: int) -> None:
        self.epoch = epoch
        self._skip_batches = batches

    def order(self, epoch: int) -> torch.Tensor:
        generator = torch.Generator().manual_seed(self.seed * 1_000_003 + epoch)
        return torch.randperm(self.n, generator=generator)

    def __iter__(self) -> Iterator[int]:
        rank, world = _rank_and_world()
        mine = self.order(self.epoch)[rank::world][: len(self)]
        start = self._skip_batches * self.batch_size
        self._skip_batches = 0  # the next epoch starts at its beginning
        yield from mine[start:].tolist()

    def __len__(self) -> int:
        """This rank's samples per epoch, in whole optimizer steps."""
        per_step = self.batch_size * self.batches_per_step
        return self.n // _rank_and_world()[1] // per_step * per_step


def _rank_and_world() -> tuple[int, int]:
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        return torch.distributed.get_rank(), torch.distributed.get_world_size()
    return 0, 1


class ResumableLoader(DataLoader):
    """The training DataLoader with Lightning's ``state_dict`` / ``load_state_dict`` interface.

    ``steps_taken`` says how many batches training has consumed (the trainer's global step times
    ``batches_per_step``, the gradient accumulation): the loader itself cannot know, because
    Lightning fetches one batch ahead of the step it runs.
    """

    def __init__(
        self,
        dataset: Dataset,
        batch_size: int,
        seed: int,
        steps_taken: Callable[[], int],
        batches_per_step: int = 1,
        **kwargs: Any,
    ) -> None:
        sampler = EpochPermutation(len(dataset), seed, batch_size, batches_per_step)  # type: ignore[arg-type]
        super().__init__(dataset, batch_size=batch_size, sampler=sampler, drop_last=True, **kwargs)
        self.steps_taken = steps_taken

    def state_dict(self) -> dict[str, Any]:
        return {"version": STATE_VERSION, "steps": int(self.steps_taken()), "batches_per_epoch": len(self)}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        per_epoch = len(self)
        if state.get("batches_per_epoch") != per_epoch:
            raise ValueError(
                f"the checkpoint's data position is for {state.get('batches_per_epoch')} batches per epoch, "
                f"this run has {per_epoch}: the data or batch settings changed since it was saved"
            )
        steps = int(state["steps"])
        self.sampler.resume_at(steps // per_epoch, steps % per_epoch)  # type: ignore[attr-defined]
