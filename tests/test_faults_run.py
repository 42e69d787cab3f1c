"""A run survives what happens to processes: kill -9, Ctrl-C, SIGTERM, a damaged checkpoint, the
same run started twice, its MLflow run deleted, a store whose creation was cut short.

Where a signal, a kill, two runs at once, DDP ranks or a process's own output is the point, the
case runs the real ``mesh-train`` in a subprocess against a real sqlite store and sends the real
signal; the run after the stop, a start that is only refused with one line (the same run started
twice, its MLflow run deleted), the runs of the cases that only stage what a stop leaves (a
finished run asked for more steps, a run killed after its last checkpoint) and the uninterrupted
reference run are the same command called in this process (``run_here``). Each case states what
must hold: exit code, run status and tags in MLflow, checkpoint files, and (for the resumed runs)
metric histories equal, step by step and bit for bit, to the same run left uninterrupted, with no
step logged twice.
"""

from __future__ import annotations

import contextlib
import glob
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import mlflow
import pytest
import torch
from helpers import Ran, run_tool

from experiments.compose import compose_config
from experiments.plan import OtherLength, other_lengths, plan_run
from experiments.store.sqlite import forget_engine

MESH_TRAIN = str(Path(sys.executable).parent / "mesh-train")
# 40 steps, a checkpoint every 10 and a validation every 20: a stop after a checkpoint leaves work to
# redo, and a run resumes both from a step that validated (20) and from one that did not (10).
RUN = (
    "max_steps=40",
    "val_every=20",
    "checkpoint_every=10",
    "log_every=5",
    "scheme=mesh",
    "data.seq_len=64",
    "data.batch_size=8",
    "data.val_batches=2",
    "probes.enabled=false",
)
HISTORIES = ("train/loss", "lr", "val/shakespeare/loss", "val/shakespeare/ppl", "tokens")

pytestmark = pytest.mark.slow


def start(runs_dir: Path, *extra: str) -> subprocess.Popen:
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    command = [MESH_TRAIN, *RUN, f"runs_dir={runs_dir}", *extra]
    return subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)


def run(runs_dir: Path, *extra: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [MESH_TRAIN, *RUN, f"runs_dir={runs_dir}", *extra], capture_output=True, text=True, timeout=600
    )


def run_here(runs_dir: Path, *extra: str) -> Ran:
    """RUN in this process (``run_tool``): the run after a stop, or one a case only sets up, whose
    own process is not what the case is about (no interpreter start, no second import of torch)."""
    return run_tool("mesh-train", *RUN, f"runs_dir={runs_dir}", *extra)


def run_dir(runs_dir: Path) -> Path:
    (found,) = glob.glob(str(runs_dir / "mesh" / "tiny-*"))
    return Path(found)


def wait_for(runs_dir: Path, name: str, process: subprocess.Popen, timeout: float = 300) -> None:
    deadline = time.monotonic() + timeout
    while not glob.glob(str(runs_dir / "mesh" / "tiny-*" / name)):
        assert process.poll() is None, process.communicate()
        assert time.monotonic() < deadline, f"{name} never appeared"
        time.sleep(0.02)


def stop(process: subprocess.Popen, sig: int, after: float = 0.3) -> tuple[int, str]:
    time.sleep(after)
    process.send_signal(sig)
    _, err = process.communicate(timeout=300)
    return process.returncode, err


def record(runs_dir: Path):
    client = mlflow.MlflowClient(f"sqlite:///{runs_dir / 'mlflow.db'}")
    run_id = (run_dir(runs_dir) / "mlflow_run_id").read_text().strip()
    found = client.get_run(run_id)
    histories = {k: [(m.step, m.value) for m in client.get_metric_history(run_id, k)] for k in HISTORIES}
    return found.info.status, found.data.tags, histories


@pytest.fixture(scope="session")
def uninterrupted(shared_once):
    """The metric histories of RUN left uninterrupted, trained once for every xdist worker (in the
    process of the worker that asks first: the resumed runs it is compared with train in this
    process too, bit for bit the same as in one of their own)."""

    def train(folder: Path) -> None:
        result = run_here(folder)
        assert result.returncode == 0, result.stderr
        status, _, histories = record(folder)
        assert status == "FINISHED" and [s for s, _ in histories["val/shakespeare/loss"]] == [20, 40]
        (folder / "histories.json").write_text(json.dumps(histories))

    histories = json.loads((shared_once("uninterrupted", train) / "histories.json").read_text())
    return {key: [tuple(point) for point in points] for key, points in histories.items()}


def signal_after_first_checkpoint(runs_dir: Path, sig: int) -> tuple[int, str, str, dict[str, str]]:
    """(exit code, last stderr line, MLflow status, tags) of a run sent ``sig`` after step10.ckpt."""
    process = start(runs_dir)
    wait_for(runs_dir, "checkpoints/step10.ckpt", process)
    code, err = stop(process, sig)
    status, tags, _ = record(runs_dir)
    return code, err.strip().splitlines()[-1], status, tags


def resume_and_compare(runs_dir: Path, uninterrupted) -> None:
    again = run_here(runs_dir)
    assert again.returncode == 0, again.stderr
    assert_same_as_uninterrupted(runs_dir, uninterrupted)


def assert_same_as_uninterrupted(runs_dir: Path, uninterrupted) -> None:
    status, tags, histories = record(runs_dir)
    assert status == "FINISHED"
    assert not {"error", "interrupted", "terminated"} & set(tags)  # the stale stop tags are cleared
    for key in HISTORIES:  # same steps (none twice, none missing), same values, to the last bit
        assert histories[key] == uninterrupted[key], key


def newest_step_checkpoint(folder: Path) -> Path:
    """The ``step<N>.ckpt`` a resume takes once ``last.ckpt`` is damaged: step20.ckpt, or step30.ckpt
    where 10 steps took less than the wait before the kill, and both where the kill fell between
    step30's write and step20's removal (CI, 2026-12-07): then the newest written, as
    ``newest_intact_checkpoint`` orders them."""
    return max(folder.glob("step*.ckpt"), key=lambda path: path.stat().st_mtime_ns)


def test_kill_9_after_a_checkpoint_resumes_exactly_from_the_newest_intact_one(tmp_path, uninterrupted):
    process = start(tmp_path)
    wait_for(tmp_path, "checkpoints/step20.ckpt", process)
    code, _ = stop(process, signal.SIGKILL, after=0.5)
    assert code == -signal.SIGKILL
    assert record(tmp_path)[0] == "RUNNING"  # nobody could say otherwise; the resume takes it over
    last = run_dir(tmp_path) / "checkpoints" / "last.ckpt"
    older = newest_step_checkpoint(last.parent)
    last.write_bytes(last.read_bytes()[:1000])  # damaged, and the newest file: the older one must be used
    again = run_here(tmp_path)
    assert again.returncode == 0, again.stderr
    damaged = [line for line in again.stderr.splitlines() if line.startswith("[mesh-train]") and "damaged" in line]
    assert damaged == [f"[mesh-train] {last} is damaged (truncated or not a checkpoint); trying an older one"]
    assert f"[mesh-train] resuming from {older}" in again.stderr.splitlines()
    assert "not resumable" not in again.stderr
    assert_same_as_uninterrupted(tmp_path, uninterrupted)
    # steps/s counts the steps this process trained (those after step 20), not the global step's 40.
    timing = json.loads((run_dir(tmp_path) / "result.json").read_text())["timing"]
    assert 0 < round(timing["steps_per_s"] * (timing["steps_s"] + timing["between_steps_s"])) <= 20


def damage_inside(path: Path) -> None:
    """Random bytes inside the largest entry of a checkpoint's archive: same size, the zip
    directory intact, so the file opens and torch loads it without a word."""
    import random
    import zipfile

    with zipfile.ZipFile(path) as archive:
        entry = max(archive.infolist(), key=lambda info: info.file_size)
    data = bytearray(path.read_bytes())
    middle = entry.header_offset + 30 + len(entry.filename) + entry.file_size // 2
    data[middle : middle + 256] = random.Random(0).randbytes(256)
    path.write_bytes(bytes(data))


def test_a_checkpoint_whose_bytes_changed_is_named_and_the_run_resumes_from_an_older_one(tmp_path, uninterrupted):
    """Before digests, such a last.ckpt loaded: NaNs in AdamW's state, "diverged at step 24"."""
    process = start(tmp_path)
    wait_for(tmp_path, "checkpoints/step20.ckpt", process)
    code, _ = stop(process, signal.SIGKILL, after=0.2)
    assert code == -signal.SIGKILL
    last = run_dir(tmp_path) / "checkpoints" / "last.ckpt"
    older = newest_step_checkpoint(last.parent)
    size = last.stat().st_size
    damage_inside(last)
    assert last.stat().st_size == size
    again = run_here(tmp_path)
    assert again.returncode == 0, again.stderr
    damaged = [line for line in again.stderr.splitlines() if "damaged" in line]
    assert damaged == [
        f"[mesh-train] {last} is damaged (its bytes do not match the sha256 in last.ckpt.sha256); trying an older one"
    ]
    assert f"[mesh-train] resuming from {older}" in again.stderr.splitlines()
    assert_same_as_uninterrupted(tmp_path, uninterrupted)
    names = sorted(p.name for p in last.parent.iterdir())
    assert names == ["last.ckpt", "last.ckpt.sha256", "step40.ckpt", "step40.ckpt.sha256"]
    for name in ("last.ckpt", "step40.ckpt"):  # sha256sum's own format: `sha256sum -c` checks it by hand
        checked = subprocess.run(["sha256sum", "-c", f"{name}.sha256"], cwd=last.parent, capture_output=True, text=True)
        assert checked.returncode == 0 and checked.stdout == f"{name}: OK\n"


def test_a_run_killed_after_its_last_checkpoint_ends_on_the_rerun_with_its_validation_and_probes(tmp_path):
    """Killed between the last step's checkpoint and result.json (a grid killed at its end): the
    rerun resumes at max_steps, where Lightning trains nothing and validates nothing; it still
    writes the result, the final probes and FINISHED, and logs no step twice."""
    first = run_here(tmp_path, "probes.enabled=true", "probes.num_batches=1")
    assert first.returncode == 0, first.stderr
    folder = run_dir(tmp_path)
    _, _, histories = record(tmp_path)
    result = json.loads((folder / "result.json").read_text())
    # What a kill -9 after the last checkpoint leaves: no result, no final probes, a RUNNING run.
    (folder / "result.json").unlink()
    shutil.rmtree(folder / "probes" / "final")
    client = mlflow.MlflowClient(f"sqlite:///{tmp_path / 'mlflow.db'}")
    client.update_run((folder / "mlflow_run_id").read_text().strip(), status="RUNNING")

    again = run_here(tmp_path, "probes.enabled=true", "probes.num_batches=1")
    assert again.returncode == 0, again.stderr
    assert any(line.startswith("[mesh-train] resuming from") for line in again.stderr.splitlines())
    status, _, after = record(tmp_path)
    assert status == "FINISHED"
    assert after == histories  # nothing logged twice, nothing lost
    rerun = json.loads((folder / "result.json").read_text())
    # The same weights validated again: equal to float32 rounding (a fresh validate sums its batches
    # outside the fit loop).
    assert rerun["steps"] == 40
    assert rerun["val_loss"] == pytest.approx(result["val_loss"], rel=1e-6)
    assert histories["val/shakespeare/loss"][-1] == (40, pytest.approx(result["val_loss"], rel=1e-6))
    assert (folder / "probes" / "final").is_dir() and any((folder / "probes" / "final").iterdir())


def test_kill_9_before_the_first_checkpoint_restarts_without_logging_twice(tmp_path, uninterrupted):
    process = start(tmp_path)
    wait_for(tmp_path, "mlflow_run_id", process)
    # As in wait_for: a run that dies fails at once; the deadline only stops one that hangs, so it
    # is far beyond what the steps take on a loaded machine.
    deadline = time.monotonic() + 300
    client = mlflow.MlflowClient(f"sqlite:///{tmp_path / 'mlflow.db'}")
    run_id = (run_dir(tmp_path) / "mlflow_run_id").read_text().strip()
    while not client.get_metric_history(run_id, "train/loss"):  # some steps are logged, no checkpoint yet
        assert process.poll() is None, process.communicate()
        assert time.monotonic() < deadline, "no train/loss logged in 300 s"
        time.sleep(0.05)
    code, _ = stop(process, signal.SIGKILL, after=0)
    assert code == -signal.SIGKILL
    # Steps run fast: if the first checkpoint made it to disk, take it away, as if the kill had come sooner.
    shutil.rmtree(run_dir(tmp_path) / "checkpoints", ignore_errors=True)
    resume_and_compare(tmp_path, uninterrupted)


def test_ctrl_c_is_killed_interrupted_with_exit_130_and_resumes(tmp_path, uninterrupted):
    code, last_line, status, tags = signal_after_first_checkpoint(tmp_path, signal.SIGINT)
    assert code == 130
    assert last_line == "[mesh-train] interrupted; run the same command to resume from the last checkpoint"
    assert status == "KILLED" and tags["interrupted"].startswith("Ctrl-C at step ") and "error" not in tags
    resume_and_compare(tmp_path, uninterrupted)


# mesh-train with one callback more, which sends the process SIGTERM at the end of a chosen step:
# where a signal from outside lands is up to the scheduler, and the step that validates is the case
# that needs care (Lightning replays its end on resume).
SIGTERM_AT_STEP = """
import os, signal, sys
import lightning.pytorch as pl
import experiments.trainer

class SigtermAtStep(pl.Callback):
    def on_train_batch_end(self, trainer, *args):
        if trainer.global_step == int(os.environ["SIGTERM_AT_STEP"]):
            os.kill(os.getpid(), signal.SIGTERM)

made = experiments.trainer.run_callbacks
experiments.trainer.run_callbacks = lambda *args: [SigtermAtStep(), *made(*args)]
from experiments.train import cli
cli(sys.argv[1:])
"""


@pytest.mark.parametrize("step", [20, 13])
def test_sigterm_saves_a_checkpoint_at_the_end_of_the_step_and_resumes_exactly(tmp_path, uninterrupted, step):
    """SIGTERM at the end of step 13 (no validation) or 20 (which validates): the run stops there
    with exit 143 and ``last.ckpt`` of that step, KILLED with a ``terminated`` tag, and the resumed
    run is the uninterrupted one. At 20 it stops after the validation (not between two of its
    batches) and resumes logging ``train/loss`` at step 20, not 21: Lightning replays the end of a
    validated step on resume, which counts its logging step once more."""
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "SIGTERM_AT_STEP": str(step)}
    command = [sys.executable, "-c", SIGTERM_AT_STEP, *RUN, f"runs_dir={tmp_path}"]
    stopped = subprocess.run(command, capture_output=True, text=True, env=env, timeout=600)
    assert stopped.returncode == 143, stopped.stderr[-3000:]
    last_line = stopped.stderr.strip().splitlines()[-1]
    assert (
        last_line == f"[mesh-train] stopped on SIGTERM at step {step}, checkpoint saved; run the same command to resume"
    )
    saved = torch.load(run_dir(tmp_path) / "checkpoints" / "last.ckpt", map_location="cpu", weights_only=False)
    assert saved["global_step"] == step  # the step in progress was finished and saved
    status, tags, histories = record(tmp_path)
    assert status == "KILLED" and tags["terminated"] == f"SIGTERM at step {step}; run the same command to resume"
    assert [s for s, _ in histories["val/shakespeare/loss"]] == ([20] if step == 20 else [])
    resume_and_compare(tmp_path, uninterrupted)


def test_sigterm_to_every_ddp_rank_stops_them_at_one_step_and_the_run_resumes_once(tmp_path):
    """SIGTERM to the whole process group, as srun signals every task: the two ranks stop at the
    end of the same step with last.ckpt saved (Lightning 2.6's own handler deadlocks them here),
    and the resumed run is one MLflow run, logged by rank 0 alone, each step once."""
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    command = [MESH_TRAIN, *RUN, f"runs_dir={tmp_path}", "trainer=ddp_cpu"]
    process = subprocess.Popen(command, stderr=subprocess.PIPE, text=True, env=env, start_new_session=True)
    wait_for(tmp_path, "checkpoints/step10.ckpt", process)
    time.sleep(0.3)
    os.killpg(process.pid, signal.SIGTERM)
    try:  # the deadlock this guards against never ends: any bound finds it, so a generous one
        _, err = process.communicate(timeout=300)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        raise AssertionError("the DDP ranks did not stop within 300 s of SIGTERM") from None
    assert process.returncode == 143, err[-3000:]
    stopped = [line for line in err.splitlines() if line.startswith("[mesh-train] stopped on SIGTERM at step ")]
    (step,) = {int(line.split("at step ")[1].split(",")[0]) for line in stopped}  # the same step on both ranks
    saved = torch.load(run_dir(tmp_path) / "checkpoints" / "last.ckpt", map_location="cpu", weights_only=False)
    assert saved["global_step"] == step > 10
    status, tags, _ = record(tmp_path)
    assert status == "KILLED" and tags["terminated"] == f"SIGTERM at step {step}; run the same command to resume"

    again = run(tmp_path, "trainer=ddp_cpu")
    assert again.returncode == 0, again.stderr[-3000:]
    assert again.stdout.count("[mesh-train] val loss") == 1  # rank 0 reports, rank 1 stays quiet
    status, tags, histories = record(tmp_path)
    assert status == "FINISHED" and not {"error", "interrupted", "terminated"} & set(tags)
    assert [s for s, _ in histories["train/loss"]] == list(range(4, 40, 5))  # none twice, none missing
    assert [s for s, _ in histories["val/shakespeare/loss"]] == [20, 40]
    client = mlflow.MlflowClient(f"sqlite:///{tmp_path / 'mlflow.db'}")
    (only,) = client.search_runs([client.get_experiment_by_name("mesh").experiment_id])
    assert only.data.params["trainer.strategy"] == "ddp"


def test_the_same_run_started_twice_is_refused_naming_the_holder(tmp_path):
    first = start(tmp_path)
    wait_for(tmp_path, "mlflow_run_id", first)
    first.send_signal(signal.SIGSTOP)  # held still: on a loaded machine 40 steps end before a start
    try:  # the refused start in this process: the holder's process and its lock are the point
        second = run_here(tmp_path)
    finally:
        first.send_signal(signal.SIGCONT)
    assert second.returncode == 2
    assert second.stderr.splitlines() == [
        f"error: run {run_dir(tmp_path)} is in use by PID {first.pid} (the same run started twice); "
        "wait for it to finish or stop it, then run the command again"
    ]
    assert first.wait(timeout=300) == 0
    client = mlflow.MlflowClient(f"sqlite:///{tmp_path / 'mlflow.db'}")
    runs = client.search_runs([client.get_experiment_by_name("mesh").experiment_id])
    assert len(runs) == 1 and runs[0].info.status == "FINISHED"
    assert not list((run_dir(tmp_path) / "checkpoints").glob("*-v1.ckpt"))


def test_two_runs_creating_a_new_store_at_once_both_finish(tmp_path):
    processes = [start(tmp_path, f"seed={seed}", "max_steps=5") for seed in (0, 1)]
    codes = [p.wait(timeout=300) for p in processes]
    assert codes == [0, 0], [p.stderr.read() for p in processes]
    client = mlflow.MlflowClient(f"sqlite:///{tmp_path / 'mlflow.db'}")
    runs = client.search_runs([client.get_experiment_by_name("mesh").experiment_id])
    assert sorted(r.info.status for r in runs) == ["FINISHED", "FINISHED"]


def test_a_deleted_mlflow_run_answers_in_one_line_and_resume_false_starts_over(tmp_path):
    process = start(tmp_path)
    wait_for(tmp_path, "mlflow_run_id", process)
    stop(process, signal.SIGKILL, after=0)
    run_id = (run_dir(tmp_path) / "mlflow_run_id").read_text().strip()
    mlflow.MlflowClient(f"sqlite:///{tmp_path / 'mlflow.db'}").delete_run(run_id)
    again = run_here(tmp_path)  # refused with one line: the kill above is what needs a process
    assert again.returncode == 2
    assert again.stderr.splitlines() == [
        f"error: the MLflow run {run_id} of {run_dir(tmp_path)} is not in sqlite:///{tmp_path / 'mlflow.db'} "
        "(deleted?): pass resume=false to train this run again from step 0 into a new MLflow run"
    ]
    fresh = run_here(tmp_path, "resume=false")
    assert fresh.returncode == 0, fresh.stderr
    status, _, histories = record(tmp_path)
    assert status == "FINISHED" and [s for s, _ in histories["train/loss"]][0] == 4


def test_a_finished_run_asked_for_more_steps_says_it_is_a_new_run_from_step_0(tmp_path):
    """max_steps is part of a run (its LR schedule ends there): a longer run of the same config is a
    run of its own, and the line says so, naming the finished one, which is left as it was."""
    short = ("max_steps=4", "val_every=2", "checkpoint_every=2", "data.seq_len=32", "data.batch_size=4")
    first = run_here(tmp_path, *short, "data.val_batches=1")
    assert first.returncode == 0, first.stderr
    first_dir = run_dir(tmp_path)
    kept = (first_dir / "result.json").read_bytes()
    longer = run_here(tmp_path, *short, "data.val_batches=1", "max_steps=8")
    assert longer.returncode == 0, longer.stderr
    assert [line for line in longer.stderr.splitlines() if "new run" in line] == [
        f"[mesh-train] max_steps=8 is a new run, trained from step 0: the same config ran to max_steps=4 (finished) "
        f"in {first_dir}; a run is never extended, as its LR warmup and cosine decay end at its max_steps"
    ]
    (second_dir,) = [Path(p) for p in glob.glob(str(tmp_path / "mesh" / "tiny-*")) if Path(p) != first_dir]
    assert json.loads((second_dir / "result.json").read_text())["steps"] == 8
    assert (first_dir / "result.json").read_bytes() == kept
    client = mlflow.MlflowClient(f"sqlite:///{tmp_path / 'mlflow.db'}")
    runs = client.search_runs([client.get_experiment_by_name("mesh").experiment_id])
    assert sorted(r.info.status for r in runs) == ["FINISHED", "FINISHED"]

    def others(*overrides: str) -> list[OtherLength]:
        return other_lengths(
            plan_run(compose_config([*RUN, *short, "data.val_batches=1", f"runs_dir={tmp_path}", *overrides]))
        )

    assert others("max_steps=12") == [OtherLength(first_dir, 4, True), OtherLength(second_dir, 8, True)]
    assert others("max_steps=12", "seed=1") == [] and others("max_steps=12", "optim.lr=0.01") == []
    assert others("max_steps=8") == [OtherLength(first_dir, 4, True)]  # itself left out


@pytest.mark.skipif(os.geteuid() != 0, reason="mounting a small tmpfs (a full disk) needs root")
def test_a_store_whose_creation_hit_a_full_disk_is_rebuilt_on_the_next_start(tmp_path):
    disk = tmp_path / "disk"
    disk.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=256k", "tmpfs", str(disk)], check=True)
    try:
        full = run_here(disk, "max_steps=2")  # only stages the half-made store
        forget_engine(f"sqlite:///{(disk / 'mlflow.db').resolve()}")  # MLflow's, for the file moved aside
        assert full.returncode != 0
        assert (disk / "mlflow.db").exists()  # a store half made
        subprocess.run(["mount", "-o", "remount,size=64m", str(disk)], check=True)
        # The next start in a process of its own: what it finds is the file, not this process's state.
        again = run(disk, "max_steps=2", "probes.enabled=false")
        assert again.returncode == 0, again.stderr
        rebuilt = [line for line in again.stderr.splitlines() if "was incomplete" in line]
        assert len(rebuilt) == 1 and "created anew" in rebuilt[0]
        client = mlflow.MlflowClient(f"sqlite:///{disk / 'mlflow.db'}")
        (finished,) = client.search_runs([client.get_experiment_by_name("mesh").experiment_id])
        assert finished.info.status == "FINISHED"
    finally:
        subprocess.run(["umount", "-l", str(disk)], check=False)
        shutil.rmtree(disk, ignore_errors=True)


@pytest.mark.skipif(os.geteuid() != 0, reason="mounting a small tmpfs (a full disk) needs root")
def test_a_disk_that_fills_while_metrics_are_logged_says_so_in_one_line_and_the_rerun_resumes(tmp_path, uninterrupted):
    """Before: about 160 lines of MLflow's and Hydra's tracebacks, no line of our own."""
    disk = tmp_path / "disk"
    disk.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=8m", "tmpfs", str(disk)], check=True)
    try:
        store = f"tracking.tracking_uri=sqlite:///{disk / 'mlflow.db'}"
        process = start(tmp_path, store)
        wait_for(tmp_path, "checkpoints/step10.ckpt", process)
        with (
            contextlib.suppress(OSError),
            (disk / "filler").open("wb", buffering=0) as filler,
        ):  # the store's disk fills
            while True:
                filler.write(bytes(1 << 16))
                filler.flush()
        _, err = process.communicate(timeout=300)
        assert process.returncode == 1, err
        said = [line for line in err.splitlines() if line.strip() and "[mesh-train] step" not in line]
        assert len(said) == 1, err
        (line,) = said
        assert line.startswith(f"error: no space left on the filesystem at {disk} (")
        assert "kept checkpoint step " in line and f"the MLflow store {disk / 'mlflow.db'} keeps every value" in line
        assert line.endswith(
            "freed space lets the same command resume from step " + line.split("kept checkpoint step ")[1].split()[0]
        )
        (disk / "filler").unlink()
        again = run_here(tmp_path, store)  # the rerun after the stop
        assert again.returncode == 0, again.stderr
        assert "[mesh-train] resuming from " in again.stderr
        client = mlflow.MlflowClient(f"sqlite:///{disk / 'mlflow.db'}")
        run_id = (run_dir(tmp_path) / "mlflow_run_id").read_text().strip()
        assert client.get_run(run_id).info.status == "FINISHED"
        for key in HISTORIES:  # nothing lost, nothing twice
            assert [(m.step, m.value) for m in client.get_metric_history(run_id, key)] == uninterrupted[key], key
    finally:
        forget_engine(store.removeprefix("tracking.tracking_uri="))  # its connections, before the unmount
        subprocess.run(["umount", "-l", str(disk)], check=False)


def test_a_run_stopped_just_after_a_validation_logs_the_next_training_step_on_resume(tmp_path, monkeypatch):
    """Validation logs at the optimizer step count (20 after 20 steps), training at Lightning's
    0-based step (19): stopped right after the validation of step 20, the store holds ``val`` at
    20 and ``train/loss`` up to 19. The resumed run must log ``train/loss`` at 20 (the step it is
    about to train) and not ``val`` at 20 again: what the store holds is read metric by metric."""
    from experiments.tracking import RunRecord
    from experiments.trainer import ResumedMLFlowLogger

    uri, run_dir = f"sqlite:///{tmp_path / 'mlflow.db'}", tmp_path / "run"
    run_dir.mkdir()
    # Lightning's MLFlowLogger sets mlflow's process-wide tracking URI (and $MLFLOW_TRACKING_URI):
    # both are put back at the end, or the tests after this one would log into this store.
    monkeypatch.setenv("MLFLOW_TRACKING_URI", uri)
    monkeypatch.setattr(mlflow.tracking._tracking_service.utils, "_tracking_uri", None)
    first = RunRecord.open(uri, run_dir, "mesh", "stopped", {})
    for step in range(20):
        first.client.log_metric(first.run_id, "train/loss", 5.0 - step / 10, step=step)
    first.client.log_metric(first.run_id, "val/shakespeare/loss", 4.0, step=20)
    first.mark_killed("terminated", "SIGTERM at step 20")

    resumed = RunRecord.open(uri, run_dir, "mesh", "stopped", {})
    assert resumed.run_id == first.run_id
    assert resumed.last_logged_steps == {"train/loss": 19, "val/shakespeare/loss": 20}
    logger = ResumedMLFlowLogger(
        experiment_name="mesh", tracking_uri=uri, run_id=resumed.run_id, last_logged_steps=resumed.last_logged_steps
    )
    logger.log_metrics({"train/loss": 2.5}, step=19)  # redone after an older checkpoint: already there
    logger.log_metrics({"train/loss": 3.0, "val/shakespeare/loss": 4.0}, step=20)
    logger.log_metrics({"val/shakespeare/loss": 3.5}, step=40)
    history = {
        k: [(m.step, m.value) for m in resumed.client.get_metric_history(resumed.run_id, k)] for k in HISTORIES[::2]
    }
    assert [s for s, _ in history["train/loss"]] == list(range(21))  # step 20 logged, 19 once
    assert history["train/loss"][19][1] == pytest.approx(3.1) and history["train/loss"][20][1] == 3.0
    assert history["val/shakespeare/loss"] == [(20, 4.0), (40, 3.5)]
