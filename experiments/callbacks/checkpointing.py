"""Checkpoints that survive ``kill -9``: written under a temporary name, then renamed into place,
each with its content digest beside it (``<name>.ckpt.sha256``, as ``sha256sum`` writes it); a run
resumes from the newest one whose bytes match their digest, and SIGTERM saves one before the run stops."""

from __future__ import annotations

import errno
import os
import shutil
import signal
import sys
import threading
from collections.abc import Callable
from pathlib import Path

import lightning.pytorch as pl
from lightning.pytorch.trainer.states import TrainerFn

from experiments.checkpoint_digest import checkpoint_damage, digest_path, file_digest
from experiments.disk import fullest_filesystem


class NoSpaceLeft(OSError):
    """The disk filled while a checkpoint was written; the message is one line."""

    one_line = True  # a grid prints its message, not its traceback

    def __init__(self, path: Path, step: int, resumable: int) -> None:
        start = f"step {resumable}" if resumable > 0 else "the start (no checkpoint was saved)"
        super().__init__(
            errno.ENOSPC,
            f"no space left on {path} while saving step {step}; freed space lets the same command resume from {start}",
        )

    def __str__(self) -> str:
        return str(self.strerror)


def is_no_space(error: BaseException) -> bool:
    return isinstance(error, OSError) and error.errno in (errno.ENOSPC, errno.EDQUOT)


def atomic_save(trainer: pl.Trainer, path: str | Path, weights_only: bool = False) -> None:
    """``trainer.save_checkpoint`` to ``path`` such that readers only ever see a complete file,
    its digest written beside it; a write that fails leaves no ``.partial`` file behind (it would
    hold the space a retry needs).

    Order: the digest of the new bytes goes to ``<path>.sha256.partial``, the checkpoint is
    renamed into place, then its digest. A kill between the two renames leaves the new checkpoint
    with the old digest and the new one pending: :func:`checkpoint_damage` accepts the pending one."""
    path = str(path)
    partial = f"{path}.partial"
    pending = Path(f"{digest_path(path)}.partial")
    try:
        trainer.save_checkpoint(partial, weights_only)
        if trainer.is_global_zero and os.path.isfile(partial):  # a sharded (FSDP) folder has no digest
            pending.write_text(f"{file_digest(partial)}  {Path(path).name}\n")
    except BaseException:
        if os.path.isdir(partial):
            shutil.rmtree(partial, ignore_errors=True)
        elif os.path.exists(partial):
            os.unlink(partial)
        pending.unlink(missing_ok=True)
        raise
    if trainer.is_global_zero:
        if os.path.isdir(partial) and os.path.isdir(path):  # sharded (FSDP) checkpoints are folders
            shutil.rmtree(path)
        os.replace(partial, path)
        if pending.exists():
            os.replace(pending, digest_path(path))
    trainer.strategy.barrier("atomic_save")


class StepCheckpoint(pl.Callback):
    """``step<N>.ckpt`` and ``last.ckpt`` every ``every`` optimizer steps, atomically; only the
    newest ``step<N>.ckpt`` is kept.

    The checkpoint of step N is written at the start of step N+1, when everything step N does
    (its validation and its logging included) is over, so a run resumed from it repeats nothing
    and misses nothing. On SIGTERM (SLURM's preemption and time limit, ``kill``), Lightning stops
    with ``SIGTERMException`` at the end of the step in progress, its validation included
    (:class:`StopOnStepBoundary`); ``last.ckpt`` is saved then. When training ends, ``last.ckpt``
    is written (and ``step<N>.ckpt`` if N is a multiple of ``every``).

    Weights that are not finite are never saved (with ``check_finite``): the step raises
    :class:`~experiments.callbacks.divergence.Diverged` and the last good checkpoint stays. A
    full disk raises :class:`NoSpaceLeft`, which names the step the same command resumes from.
    """

    def __init__(self, dirpath: Path, every: int, check_finite: bool = True) -> None:
        self.dirpath = Path(dirpath)
        self.every = every
        self.check_finite = check_finite
        self._saved_step: int | None = None
        self._resumable = 0  # the step of the newest checkpoint on disk
        self._at_batch_start = False
        self._at_sigterm = False

    def on_train_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self._resumable = trainer.global_step  # resumed from a checkpoint of this step (0: none)

    @property
    def last(self) -> Path:
        return self.dirpath / "last.ckpt"

    def on_train_batch_start(self, trainer: pl.Trainer, *args: object) -> None:
        step = trainer.global_step
        if step > 0 and step % self.every == 0 and step != self._saved_step:
            self._at_batch_start = True
            try:
                self._save(trainer, step)
            finally:
                self._at_batch_start = False

    def on_save_checkpoint(self, trainer: pl.Trainer, pl_module: pl.LightningModule, checkpoint: dict) -> None:
        """Make a checkpoint taken after step N's end (from ``on_train_batch_start``, or on
        SIGTERM) read as one Lightning saves after step N's last hook. From the batch start: the
        next batch is not yet counted as fetched ("ready"). Either way, when step N was a
        validation step, Lightning restores it as "saved on validation end" and replays the end of
        step N (skipping the validation), which counts the logging step (``_batches_that_stepped``)
        once more: it is saved one behind for that. The exact-resume tests hold every case to the
        uninterrupted run, step by step (tests/test_faults_run.py)."""
        if not (self._at_batch_start or self._at_sigterm):
            return
        loop = checkpoint["loops"]["fit_loop"]
        if self._at_batch_start:
            for counter in ("total", "current"):
                loop["epoch_loop.batch_progress"][counter]["ready"] -= 1
        val_every = trainer.val_check_batch  # in batches: optimizer steps x accumulated micro-batches
        if isinstance(val_every, int) and trainer.global_step % (val_every // trainer.accumulate_grad_batches) == 0:
            loop["epoch_loop.state_dict"]["_batches_that_stepped"] -= 1

    def on_train_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        step = trainer.global_step
        if step == self._saved_step:
            return
        self._refuse_non_finite(trainer, pl_module)
        if step % self.every == 0:
            self._save(trainer, step)
        else:
            self._write(trainer, self.last, step)

    def on_exception(self, trainer: pl.Trainer, pl_module: pl.LightningModule, exception: BaseException) -> None:
        from lightning.pytorch.utilities.exceptions import SIGTERMException

        from experiments.callbacks.divergence import finite_weights

        if isinstance(exception, SIGTERMException) and (not self.check_finite or finite_weights(pl_module)):
            self._at_sigterm = True  # StopOnStepBoundary: Lightning stopped after the step's end
            try:
                self._write(trainer, self.last, trainer.global_step)
            finally:
                self._at_sigterm = False

    def _refuse_non_finite(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        from experiments.callbacks.divergence import Diverged, finite_weights

        if self.check_finite and not finite_weights(pl_module):
            raise Diverged(trainer.global_step, "the weights")

    def _write(self, trainer: pl.Trainer, path: Path, step: int) -> None:
        try:
            atomic_save(trainer, path)
        except OSError as error:
            if is_no_space(error):
                raise NoSpaceLeft(self.dirpath, step, self._resumable) from None
            raise
        self._resumable = step

    def _save(self, trainer: pl.Trainer, step: int) -> None:
        self._refuse_non_finite(trainer, trainer.lightning_module)
        path = self.dirpath / f"step{step}.ckpt"
        self._write(trainer, path, step)
        self._write(trainer, self.last, step)
        self._saved_step = step
        if trainer.is_global_zero:
            for old in self.dirpath.glob("step*.ckpt"):
                if old != path:
                    old.unlink(missing_ok=True)
                    digest_path(old).unlink(missing_ok=True)


class StopOnStepBoundary(pl.Callback):
    """A SIGTERM stops training at the end of a whole optimizer step, after that step's
    validation, on every rank at once.

    Lightning's own SIGTERM handler sets a flag that its loops read at three places: after each
    micro-batch, after each validation batch and after the step's end. Acted on at the first two,
    a stop falls part-way through a step (a checkpoint there loses the gradients accumulated so
    far while its data position counts them) or part-way through a validation (the resumed run
    redoes it from the middle and its metric is lost). So the handler here only notes the request
    (it takes the notifier's place in the handler Lightning composed), and the flag is raised by
    this callback alone: at the end of a step's last micro-batch, and, for a step that validates,
    held while the validation runs. The stop then always comes after the whole step, validation
    and logging included, whenever the signal landed.

    Under DDP (more than one rank) the request is agreed at the end of each step (any rank
    signalled) so that every rank raises the flag at the same step and the ``last.ckpt`` they save
    together is that step's; Lightning 2.6's own handler broadcasts inside the signal handler (PR
    #20825), and ranks signalled at different points then wait on each other forever."""

    def __init__(self) -> None:
        self._requested = False
        self._held = False
        self._ranks = 1

    def on_train_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self._ranks = trainer.world_size
        connector = trainer._signal_connector  # Lightning's SIGTERM flag lives there
        self._requested, connector.received_sigterm = connector.received_sigterm, False  # came during set-up
        _replace_sigterm_notifier(trainer, self._request)

    def _request(self, signum: int, frame: object) -> None:
        self._requested = True

    def on_train_batch_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule, *args: object) -> None:
        if trainer.fit_loop._should_accumulate():
            return  # the step is not over
        if self._ranks > 1:
            stop = trainer.strategy.reduce_boolean_decision(self._requested, all=False)
        else:
            stop = self._requested
        if stop:
            trainer._signal_connector.received_sigterm = True

    def on_validation_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        connector = trainer._signal_connector
        if trainer.state.fn == TrainerFn.FITTING and connector.received_sigterm:
            connector.received_sigterm, self._held = False, True

    def on_validation_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if self._held:
            trainer._signal_connector.received_sigterm, self._held = True, False


def _replace_sigterm_notifier(trainer: pl.Trainer, request: Callable[[int, object], None]) -> None:
    """In the SIGTERM handler Lightning composed (its notifier, then the handler found before it),
    put ``request`` in the notifier's place; Lightning restores the earlier handler at teardown."""
    composed = signal.getsignal(signal.SIGTERM)
    handlers = getattr(composed, "signal_handlers", None)
    notifier = trainer._signal_connector._sigterm_notifier_fn
    if isinstance(handlers, list) and notifier in handlers:
        composed.signal_handlers = [request if h == notifier else h for h in handlers]  # type: ignore[union-attr]
    elif threading.current_thread() is threading.main_thread():  # not Lightning's: our own all the same
        signal.signal(signal.SIGTERM, request)
    # else: a fit outside the main thread, where no handler can be set (Lightning sets none either)


def newest_intact_checkpoint(checkpoint_dir: Path) -> Path | None:
    """``last.ckpt`` or the newest ``step<N>.ckpt``, whichever was written last and is intact
    (:func:`checkpoint_damage`); a damaged one is reported in one line and passed over, and when
    none is intact the run starts over, said in one line."""
    if not checkpoint_dir.is_dir():
        return None
    candidates = [p for p in checkpoint_dir.iterdir() if p.suffix == ".ckpt"]
    for path in sorted(candidates, key=lambda p: p.stat().st_mtime_ns, reverse=True):
        damage = checkpoint_damage(path)
        if damage is None:
            return path
        print(f"[mesh-train] {path} is damaged ({damage}); trying an older one", file=sys.stderr)
    if candidates:
        print(f"[mesh-train] no intact checkpoint in {checkpoint_dir}; training from step 0", file=sys.stderr)
    return None


class DiskFull(OSError):
    """A disk filled while the run logged (metrics, params, artifacts) or wrote its files; the
    message is one line naming the fullest filesystem the run writes to and what was kept."""

    one_line = True

    def __init__(self, paths: list[Path], checkpoint_dir: Path, store: Path | None) -> None:
        mount, free = fullest_filesystem(paths)
        kept = _kept_checkpoint(checkpoint_dir)
        store_said = f"; the MLflow store {store} keeps every value logged before" if store is not None else ""
        resume = f"resume from step {kept[0]}" if kept else "start again from step 0"
        super().__init__(
            errno.ENOSPC,
            f"no space left on the filesystem at {mount} ({free} free) while the run logged or wrote its files: "
            f"kept {f'checkpoint step {kept[0]} ({kept[1]})' if kept else 'no checkpoint'}{store_said}; "
            f"freed space lets the same command {resume}",
        )

    def __str__(self) -> str:
        return str(self.strerror)


def _kept_checkpoint(checkpoint_dir: Path) -> tuple[int, Path] | None:
    """(step, path) of the newest intact checkpoint, found without a word."""
    import torch

    if not checkpoint_dir.is_dir():
        return None
    for path in sorted(checkpoint_dir.glob("*.ckpt"), key=lambda p: p.stat().st_mtime_ns, reverse=True):
        if checkpoint_damage(path) is None:
            try:
                state = torch.load(path, map_location="cpu", weights_only=True, mmap=True)
            except Exception:
                continue
            return int(state.get("global_step", 0)), path
    return None
