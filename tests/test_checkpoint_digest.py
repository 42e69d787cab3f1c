"""A checkpoint's sha256 (experiments/checkpoint_digest.py) on real files: the digest written by a
kill between the two renames is accepted, every checkpoint damaged starts the run over in one
line, and ``mesh-eval``/``mesh-probe``'s loader refuses a damaged checkpoint of a real run. The
resume itself, with a real kill, is in tests/test_faults_run.py."""

from __future__ import annotations

import shutil
import zipfile
from pathlib import Path

import pytest
import torch

from experiments.callbacks.checkpointing import newest_intact_checkpoint
from experiments.checkpoint_digest import checkpoint_damage, digest_path, file_digest
from experiments.checkpoints import RunInputError, load_model


def saved(path: Path, value: float) -> Path:
    torch.save({"weight": torch.full((64,), value)}, path)
    digest_path(path).write_text(f"{file_digest(path)}  {path.name}\n")
    return path


def damage_inside(path: Path) -> None:
    with zipfile.ZipFile(path) as archive:
        entry = max(archive.infolist(), key=lambda info: info.file_size)
    data = bytearray(path.read_bytes())
    at = entry.header_offset + 30 + len(entry.filename) + entry.file_size // 2
    data[at : at + 8] = bytes(8) if data[at : at + 8] != bytes(8) else b"\xff" * 8
    path.write_bytes(bytes(data))


def test_a_digest_left_pending_by_a_kill_between_the_renames_is_taken_when_it_matches(tmp_path):
    last = saved(tmp_path / "last.ckpt", 1.0)
    old_digest = digest_path(last).read_text()
    saved(last, 2.0)  # the new checkpoint in place; its digest was written beside, not yet renamed
    digest_path(last).rename(f"{digest_path(last)}.partial")
    digest_path(last).write_text(old_digest)
    assert checkpoint_damage(last) is None
    assert digest_path(last).read_text() != old_digest and not Path(f"{digest_path(last)}.partial").exists()


def test_when_every_checkpoint_is_damaged_the_run_starts_over_in_one_line(tmp_path, capsys):
    for name in ("step10.ckpt", "last.ckpt"):
        damage_inside(saved(tmp_path / name, 3.0))
    assert newest_intact_checkpoint(tmp_path) is None
    lines = capsys.readouterr().err.splitlines()
    assert len(lines) == 3 and all("is damaged (its bytes do not match the sha256 in" in line for line in lines[:2])
    assert lines[2] == f"[mesh-train] no intact checkpoint in {tmp_path}; training from step 0"


def test_a_checkpoint_without_a_digest_is_checked_as_before(tmp_path):
    path = saved(tmp_path / "last.ckpt", 4.0)
    digest_path(path).unlink()
    assert checkpoint_damage(path) is None
    path.write_bytes(path.read_bytes()[:100])
    assert checkpoint_damage(path) == "truncated or not a checkpoint"


def test_mesh_eval_s_loader_refuses_a_damaged_checkpoint_of_a_real_run(tiny_run, tmp_path):
    folder = tmp_path / "checkpoints"
    folder.mkdir()
    for name in ("last.ckpt", "last.ckpt.sha256"):
        shutil.copy(tiny_run.run_dir / "checkpoints" / name, folder / name)
    checkpoint = folder / "last.ckpt"
    load_model(checkpoint)  # intact: loads
    damage_inside(checkpoint)
    with pytest.raises(RunInputError) as refused:
        load_model(checkpoint)
    assert str(refused.value) == (
        f"{checkpoint} is damaged (its bytes do not match the sha256 in last.ckpt.sha256); "
        "use an older checkpoint of the run"
    )
