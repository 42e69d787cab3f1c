"""A checkpoint's content digest: ``<name>.ckpt.sha256`` beside it, as ``sha256sum`` writes it
(``sha256sum -c`` checks it by hand), written with every checkpoint and checked before one is
loaded (experiments/callbacks/checkpointing.py, experiments/checkpoints.py). Nothing heavy is
imported here: ``mesh-probe`` and ``mesh-eval`` check a file before torch loads it."""

from __future__ import annotations

import hashlib
import os
import zipfile
from pathlib import Path

DIGEST_SUFFIX = ".sha256"


def digest_path(path: str | Path) -> Path:
    """Where the sha256 of checkpoint ``path`` is kept: ``<path>.sha256``."""
    return Path(f"{path}{DIGEST_SUFFIX}")


def file_digest(path: str | Path) -> str:
    """The sha256 of the file ``path``, in hex (benchmarks/checkpoint_digest.py: its cost)."""
    with open(path, "rb") as file:
        return hashlib.file_digest(file, "sha256").hexdigest()


def is_intact(path: Path) -> bool:
    """A torch checkpoint is a zip archive whose directory sits at its end: a truncated or
    overwritten file fails to open. (Reading every entry would cost as much as loading it.)"""
    if os.path.isdir(path):  # a sharded (FSDP) checkpoint
        return any(Path(path).iterdir())
    try:
        with zipfile.ZipFile(path) as archive:
            return bool(archive.namelist())
    except (OSError, zipfile.BadZipFile):
        return False


def checkpoint_damage(path: Path) -> str | None:
    """Why checkpoint ``path`` must not be loaded, or None when it may: not a readable zip archive
    (truncated, overwritten), or bytes that differ from the digest saved with them (damage inside
    an archive whose directory still reads: a weight or AdamW's state changed without a word).
    A checkpoint saved before digests were written has none, and only its archive is checked."""
    if not is_intact(path):
        return "truncated or not a checkpoint"
    recorded = digest_path(path)
    if os.path.isdir(path) or not recorded.is_file():
        return None
    actual = file_digest(path)
    if _recorded_digest(recorded) == actual:
        return None
    pending = Path(f"{recorded}.partial")  # killed between the checkpoint's rename and its digest's
    if pending.is_file() and _recorded_digest(pending) == actual:
        os.replace(pending, recorded)
        return None
    return f"its bytes do not match the sha256 in {recorded.name}"


def _recorded_digest(path: Path) -> str:
    try:
        return path.read_text().split(maxsplit=1)[0]
    except (OSError, IndexError, UnicodeDecodeError):
        return ""
