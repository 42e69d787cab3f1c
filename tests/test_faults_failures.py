"""A run that fails on its own (its loss diverges, its disk fills) ends FAILED with one line, keeps its
last good checkpoint, and (for the disk) the same command resumes once there is space again.

Each case trains the tiny model a few steps against a real sqlite store and real checkpoint files.
"""

from __future__ import annotations

import errno
import json
import os
import subprocess
import sys
from pathlib import Path

import mlflow
import pytest
import torch
from helpers import run_tool

from experiments.callbacks.checkpointing import NoSpaceLeft
from experiments.callbacks.divergence import Diverged
from experiments.lit_module import MeshLitModule
from experiments.train import train

MESH_TRAIN = str(Path(sys.executable).parent / "mesh-train")
SMALL = ("data.seq_len=32", "data.batch_size=4", "data.val_batches=1", "probes.enabled=false", "log_every=5")

pytestmark = pytest.mark.slow


def only_run(runs_dir: Path):
    client = mlflow.MlflowClient(f"sqlite:///{runs_dir / 'mlflow.db'}")
    (experiment,) = [e for e in client.search_experiments() if e.name != "Default"]
    (found,) = client.search_runs([experiment.experiment_id])
    return found


def checkpoint_steps(runs_dir: Path) -> dict[str, int]:
    files = sorted(runs_dir.glob("*/*/checkpoints/*.ckpt"))
    return {p.name: torch.load(p, map_location="cpu", weights_only=False)["global_step"] for p in files}


def test_a_diverged_run_stops_at_that_step_failed_with_one_line(tmp_path):
    command = [MESH_TRAIN, "model=tiny", "max_steps=40", "val_every=10", "checkpoint_every=10", *SMALL]
    done = subprocess.run(
        [*command, "optim.lr=1e30", f"runs_dir={tmp_path}"], capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 1, done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: diverged at step "), done.stderr
    assert "optim.lr" in lines[0] and "precision" in lines[0]
    run = only_run(tmp_path)
    assert run.info.status == "FAILED" and run.data.tags["error"] == lines[0].removeprefix("error: ")
    step = int(lines[0].split()[4].rstrip(":"))
    assert step < 10 and checkpoint_steps(tmp_path) == {}  # no checkpoint of diverged weights
    assert not list(tmp_path.glob("*/*/result.json"))


def test_allow_nonfinite_trains_a_diverged_run_on_with_one_line_and_a_tag(tmp_path):
    """The run of the diverged test fails; the same command with allow_nonfinite=true (which is not
    part of the run's identity) takes the same run up again, says the first non-finite loss once
    and trains to the end, its non-finite checkpoints kept. (In this process: the diverged run's
    one line on a process's stderr is the test above.)"""
    command = ["model=tiny", "max_steps=20", "val_every=10", "checkpoint_every=10", *SMALL]
    command += ["optim.lr=1e30", f"runs_dir={tmp_path}"]
    failed = run_tool("mesh-train", *command)
    assert failed.returncode == 1 and only_run(tmp_path).info.status == "FAILED", failed.stderr
    done = run_tool("mesh-train", *command, "allow_nonfinite=true")
    assert done.returncode == 0, done.stderr
    said = [line for line in done.stderr.splitlines() if "allow_nonfinite=true: training on" in line]
    assert len(said) == 1 and said[0].startswith("[mesh-train] the training loss is "), done.stderr
    run = only_run(tmp_path)  # the same MLflow run, taken up again
    assert run.info.status == "FINISHED" and "error" not in run.data.tags
    assert run.data.tags["nonfinite"] == said[0].removeprefix("[mesh-train] ")
    assert checkpoint_steps(tmp_path) == {"last.ckpt": 20, "step20.ckpt": 20}
    (result,) = tmp_path.glob("*/*/result.json")
    assert json.loads(result.read_text())["steps"] == 20
    (summary,) = [line for line in done.stdout.splitlines() if line.startswith("[mesh-train] val loss ")]
    assert "(trained past a non-finite loss: tag nonfinite)" in summary, done.stdout


def test_a_run_trained_past_a_non_finite_loss_is_its_own_marked_row_and_count(tmp_path):
    """Beside a finished run, a run trained on past its NaN loss is read back NONFINITE, with the
    tag's line as its error: its own row, marked, and its own count in the report."""
    command = ["model=tiny", "max_steps=10", "val_every=10", "checkpoint_every=10", *SMALL]
    command += [f"runs_dir={tmp_path}", "tracking.experiment=nan"]
    for extra in (["optim.lr=1e30", "allow_nonfinite=true"], ["seed=1"]):
        done = run_tool("mesh-train", *command, *extra)
        assert done.returncode == 0, done.stderr
    out = tmp_path / "report"
    done = run_tool("mesh-results", "nan", "--runs-dir", str(tmp_path), "--out", str(out))
    assert done.returncode == 0, done.stderr
    assert "[mesh-results] 2 runs (1 finished) -> 2 rows;" in done.stdout
    report = (out / "report.md").read_text()
    assert "* **Runs**: 2 (1 finished, 0 failed, 0 running, 0 killed, 1 nonfinite);" in report
    assert "#### Runs in other states: 1" in report and "the training loss is nan at step" in report
    table = (out / "table.md").read_text()
    marked = [line for line in table.splitlines() if "non-finite loss" in line]  # its own row, marked
    assert len(marked) == 1 and marked[0].startswith("| base | 1+2R2+1 | \\[non-finite loss\\] |"), table


def test_nan_in_validation_only_keeps_the_last_finite_checkpoint(tmp_path, compose_run, monkeypatch):
    real = MeshLitModule.validation_step

    def nan_from_step_20(self, batch, batch_idx, dataloader_idx=0):
        real(self, batch, batch_idx, dataloader_idx)
        if self.trainer.global_step >= 20:
            self._val_sums[dataloader_idx][0] = float("nan")

    monkeypatch.setattr(MeshLitModule, "validation_step", nan_from_step_20)
    cfg = compose_run("max_steps=30", "val_every=10", "checkpoint_every=10", *SMALL, f"runs_dir={tmp_path}")
    with pytest.raises(Diverged, match=r"^diverged at step 20: the validation loss val/shakespeare/loss is nan; "):
        train(cfg)
    run = only_run(tmp_path)
    assert run.info.status == "FAILED" and run.data.tags["error"].startswith("diverged at step 20: ")
    assert checkpoint_steps(tmp_path) == {"last.ckpt": 10, "step10.ckpt": 10}


def fill_disk_from(step: int, monkeypatch) -> None:
    """torch.save raises ENOSPC, as a full disk does, for every checkpoint from ``step`` on."""
    real = torch.save

    def save(obj, f, *args, **kwargs):
        if isinstance(obj, dict) and obj.get("global_step", 0) >= step:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        return real(obj, f, *args, **kwargs)

    monkeypatch.setattr(torch, "save", save)


@pytest.mark.parametrize(
    ("checkpoint_every", "full_at", "resume_at"),
    [(10, 20, 10), (20, 30, 20)],  # a step checkpoint; the final last.ckpt (30 is no multiple of 20)
    ids=["step-checkpoint", "final-checkpoint"],
)
def test_a_full_disk_fails_with_one_line_and_the_same_command_resumes(
    tmp_path, compose_run, monkeypatch, checkpoint_every, full_at, resume_at
):
    cfg = compose_run("max_steps=30", "val_every=10", f"checkpoint_every={checkpoint_every}", *SMALL)
    cfg.runs_dir = str(tmp_path)
    fill_disk_from(full_at, monkeypatch)
    with pytest.raises(NoSpaceLeft) as info:
        train(cfg)
    message = str(info.value)
    assert "\n" not in message and message.startswith("no space left on ") and str(tmp_path) in message
    assert message.endswith(
        f"while saving step {full_at}; freed space lets the same command resume from step {resume_at}"
    )
    assert only_run(tmp_path).info.status == "FAILED"
    assert set(checkpoint_steps(tmp_path).values()) == {resume_at}
    assert not list(tmp_path.glob("*/*/checkpoints/*.partial"))  # nothing left holding the space
    monkeypatch.undo()
    result = train(cfg)
    assert result["steps"] == 30 and only_run(tmp_path).info.status == "FINISHED"
    assert "error" not in only_run(tmp_path).data.tags
