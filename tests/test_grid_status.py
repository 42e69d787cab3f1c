"""``mesh-sweep --status`` and ``--cancel`` of a grid on this machine, the requests they refuse,
and what a cell of several tasks asks SLURM for (no cluster needed here; the SLURM side of
``--detach``, ``--status``, ``--cancel`` and multi-task cells runs in tests/test_slurm_cluster.py).

* a local grid whose ``mesh-sweep`` is killed outright (SIGKILL) while its first cell trains:
  ``--status`` shows that cell running (with its PID) while the process lives, then killed once
  it is gone (its run closed KILLED), the other not started, the parent still RUNNING;
  ``--cancel`` has no jobs to cancel and closes the parent KILLED; re-running finishes the grid;
* ``--status``/``--cancel`` of a grid with no runs, ``--detach`` off SLURM, two modes at once:
  one line, exit 2, nothing created;
* ``resources=ddp_cpu``: two tasks of one CPU, ``trainer.devices``/``strategy`` following.
"""

from __future__ import annotations

import json
import multiprocessing
import os
import re
import signal
import subprocess
from pathlib import Path

import mlflow
import pytest
from test_faults_grid import BIN, checkpointed, environment, wait_for

from experiments.compose import group_options
from experiments.locks import RunLock
from mesh_model import ConfigError
from sweeps.grid import compose_launch
from sweeps.launch.config import CONFIG_MODULE
from sweeps.slurm_jobs import array_tasks, read_jobs, record_jobs
from sweeps.sweep import main, run_sweep

# One cell at a time, in the mesh-sweep process, with one torch thread (also when it is this one).
GRID = ["schemes", "scheme=base,mesh", "launcher.workers=1", "launcher.threads=1"]


@pytest.fixture
def cell(grid_cell_overrides):
    """A grid cell of 60 steps checkpointed every 10: one is signalled while it trains."""
    changes = {"probes.enabled": "false", "max_steps": 60, "val_every": 20, "log_every": 1, "checkpoint_every": 10}
    kept = [o for o in grid_cell_overrides() if o.split("=", 1)[0] not in changes]
    return [*kept, *(f"{key}={value}" for key, value in changes.items())]


def status(args: list[str], capsys, flag: str = "--status") -> tuple[int, dict[str, list[str]], str]:
    """``mesh-sweep ARGS --status`` (or ``flag``) in this process: (exit code, each cell's row
    after its label: state, step, val loss[, note], the whole output)."""
    code = main([*args, flag])
    out = capsys.readouterr().out
    rows = {}
    for line in out.splitlines():
        fields = re.split(r"\s{2,}", line.strip())
        if len(fields) >= 5 and fields[0].isdigit():
            rows[fields[1]] = fields[2:]
    return code, rows, out


def store(runs: Path):
    client = mlflow.MlflowClient(f"sqlite:///{runs / 'mlflow.db'}")
    found = client.search_runs([client.get_experiment_by_name("schemes").experiment_id])
    parents = [r for r in found if r.data.tags.get("kind") == "sweep"]
    return client, parents, {r.data.params["scheme"]: r for r in found if r.data.tags.get("kind") != "sweep"}


@pytest.mark.slow
def test_a_local_grid_killed_outright_is_seen_settled_cancelled_and_continued(tmp_path, cell, capsys):
    runs = tmp_path / "runs"
    args = [*GRID, *cell, f"runs_dir={runs}"]
    with (tmp_path / "sweep.log").open("w") as log:
        process = subprocess.Popen([str(BIN / "mesh-sweep"), *args], cwd=tmp_path, env=environment(), stdout=log)
    try:
        wait_for(lambda: checkpointed(runs, "base"), 240, process, "the first cell to train 10 steps")
        os.kill(process.pid, signal.SIGSTOP)  # it trains no further, and still holds its run
        code, rows, out = status(args, capsys)
        assert code == 0 and rows["scheme=base"][0] == "running" and f"PID {process.pid}" in out, out
        assert rows["scheme=mesh"] == ["not started", "-", "-"], out
        assert "parent run " in out and out.splitlines()[0].endswith(" RUNNING"), out
        assert out.rstrip().endswith("2 cells: 1 running, 1 not started"), out
    finally:
        process.kill()  # SIGKILL: nothing of it closes the run, the parent or the grid
        process.wait(timeout=60)

    code, rows, out = status(args, capsys)
    assert code == 0 and rows["scheme=mesh"][0] == "not started", out
    state, step, _, note = rows["scheme=base"]
    # step10.ckpt is written when 10 steps are done: their last is logged at Lightning's step 9.
    assert state == "killed" and int(step) >= 9, out
    assert note.startswith(f"its process is gone at step {step} (found by mesh-sweep --status)"), out
    assert out.rstrip().endswith("2 cells: 1 killed, 1 not started"), out
    client, parents, cells = store(runs)
    assert cells["base"].info.status == "KILLED" and cells["base"].data.tags["interrupted"] == note
    assert parents[0].info.status == "RUNNING"  # a cell has not run: the grid has not ended

    code, rows, out = status(args, capsys, "--cancel")
    assert code == 0 and "no SLURM jobs to cancel" in out and "re-run the grid to continue it: " in out, out
    client, parents, cells = store(runs)
    assert parents[0].info.status == "KILLED", parents[0].data.tags
    assert parents[0].data.tags["interrupted"].startswith("cancelled (mesh-sweep --cancel): 0 finished, 1 interrupted")

    assert run_sweep(args[0], args[1:]) == 0  # continues: the killed cell resumes, the other starts
    assert "[mesh-train] resuming from" in capsys.readouterr().err
    code, rows, out = status(args, capsys)
    client, parents, cells = store(runs)
    assert [p.info.status for p in parents] == ["FINISHED"] and sorted(cells) == ["base", "mesh"]
    for scheme, run in cells.items():
        result = json.loads((Path(run.data.tags["run_dir"]) / "result.json").read_text())
        assert rows[f"scheme={scheme}"] == ["finished", "60", f"{result['val_loss']:.4f}"], out
        assert [m.step for m in client.get_metric_history(run.info.run_id, "train/loss")] == list(range(60))
    assert out.rstrip().endswith("2 cells: 2 finished"), out


def test_status_cancel_and_detach_refuse_bad_requests_in_one_line(tmp_path, grid_cell_overrides, capsys):
    runs = tmp_path / "runs"
    args = ["schemes", "scheme=base,mesh", *grid_cell_overrides(), f"runs_dir={runs}"]
    refusals = [
        ([*args, "--status"], "error: no runs of this grid yet (2 cells, key schemes-"),
        ([*args, "--cancel"], "error: no runs of this grid yet (2 cells, key schemes-"),
        ([*args, "launcher=local", "--detach"], "error: --detach needs a grid on a batch scheduler (launcher=slurm)"),
        (["search_lr", f"runs_dir={runs}", "--status"], "error: --status and --cancel are for grids; search_lr is"),
        ([*args, "--detach", "--status"], "error: --detach and --status do not go together"),
    ]
    for arguments, message in refusals:
        assert main(arguments) == 2, arguments
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and err.startswith(message), (arguments, err)
    assert not runs.exists()


def test_every_resources_option_composes_and_ddp_cpu_is_two_one_cpu_tasks(tmp_path, monkeypatch):
    for option in group_options("resources", CONFIG_MODULE):
        compose_launch([f"resources={option}"])  # validated
    launch = compose_launch(["launcher=slurm", "resources=ddp_cpu"])
    assert (launch.resources.tasks, launch.resources.cpus_per_task, launch.resources.gpus_per_node) == (2, 1, 0)
    assert launch.launcher.cell_overrides(launch.resources) == [
        "trainer.devices=2",
        "trainer.num_nodes=1",
        "trainer.strategy=ddp",
    ]
    cpu = compose_launch(["launcher=slurm"])
    assert cpu.resources.tasks == 1 and cpu.launcher.cell_overrides(cpu.resources) == []
    gpus = compose_launch(["launcher=slurm", "resources=gpu4"])
    assert gpus.resources.tasks == 4 and gpus.launcher.cell_overrides(gpus.resources) == [
        "trainer.devices=4",
        "trainer.num_nodes=1",
    ]
    for bad, message in (
        ("resources.tasks_per_node=0", "resources.tasks_per_node=0 is invalid: must be >= 1"),
        ("resources.tasks_per_node=2", "resources.tasks_per_node=2 is invalid: must be gpus_per_node=4"),
    ):
        with pytest.raises(ConfigError, match=re.escape(message)):
            compose_launch(["resources=gpu4", bad])
    # submitit asks srun for the tasks (a stand-in srun lets it render the real sbatch file).
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "srun").write_text("#!/bin/sh\nexit 0\n")
    (bin_dir / "srun").chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}:{os.environ['PATH']}")
    script = launch.launcher.executor(tmp_path, launch.resources)._executor._make_submission_file_text("x", "uid")
    assert "#SBATCH --ntasks-per-node=2" in script and "#SBATCH --cpus-per-task=1" in script


def test_jobs_json_keeps_the_latest_job_of_each_cell_and_sacct_ranges_expand(tmp_path):
    assert read_jobs(tmp_path) == {}
    record_jobs(tmp_path, {0: "12_0", 1: "12_1"})
    record_jobs(tmp_path, {1: "15"})  # a re-run resubmits the second cell alone
    assert read_jobs(tmp_path) == {0: "12_0", 1: "15"}
    assert array_tasks("12_[1-3,5]") == ["12_1", "12_2", "12_3", "12_5"] and array_tasks("12_[4%2]") == ["12_4"]
    assert array_tasks("12_7") == ["12_7"] and array_tasks("13") == ["13"]


def _record_many(sweep_dir: Path, first: int) -> None:
    for index in range(first, first + 150):
        record_jobs(sweep_dir, {index: f"9_{index}"})
        read_jobs(sweep_dir)  # never a half-written file


def test_jobs_json_written_by_two_processes_at_once_keeps_every_job_and_always_parses(tmp_path):
    writers = [multiprocessing.get_context("fork").Process(target=_record_many, args=(tmp_path, i)) for i in (0, 1000)]
    for writer in writers:
        writer.start()
    for writer in writers:
        writer.join(timeout=120)
    assert [w.exitcode for w in writers] == [0, 0]
    assert sorted(read_jobs(tmp_path)) == [*range(150), *range(1000, 1150)]
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".jobs.json.") and p.suffix != ".lock"] == []


def test_a_second_mesh_sweep_of_a_grid_in_progress_is_refused_naming_the_first(tmp_path, cell, capsys):
    from sweeps.grid import grid_cells, grid_key, read_request, sweep_dir_for

    args = [*GRID, *cell, f"runs_dir={tmp_path}"]
    launch, overrides, _ = read_request(args[0], args[1:])
    cells, plans = grid_cells(args[0], overrides, launch)
    sweep_dir = sweep_dir_for(plans[0], grid_key(args[0], plans))
    with RunLock(sweep_dir, "grid"):  # as the mesh-sweep running it holds it
        assert main(args) == 2
    assert capsys.readouterr().err == (
        f"error: grid {sweep_dir} is in use by PID {os.getpid()} (the same grid started twice); "
        "wait for it to finish or stop it, then run the command again\n"
    )
    assert not (tmp_path / "mlflow.db").exists()  # refused before the parent run


def test_a_cell_cancelled_from_another_terminal_counts_as_stopped_for_the_sweep_that_waits(tmp_path):
    """``mesh-sweep --cancel`` closes a cell's run KILLED (tag ``interrupted``) while the attached
    sweep still waits on SLURM; the sweep then collects a job that "died". Its outcome takes the
    run's word, so the parent ends KILLED (stopped, re-run to resume), not FAILED; a run its own
    process closed FAILED, and one left RUNNING, are a failure as before."""
    from sweeps.cells import FAILED, INTERRUPTED, Cell, CellOutcome
    from sweeps.closing import settle_run
    from sweeps.parent import ParentRun

    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    client = mlflow.MlflowClient(uri)
    experiment = client.create_experiment("schemes", artifact_location=(tmp_path / "artifacts").as_uri())
    cancelled = "cancelled (mesh-sweep --cancel), SLURM job 7_1 at step 12; re-run the grid to resume"

    def cell_run(name: str, status: str | None, tags: dict[str, str]) -> Path:
        run_id = client.create_run(experiment, tags=tags, run_name=name).info.run_id
        if status is not None:
            client.set_terminated(run_id, status)
        (tmp_path / name).mkdir()
        (tmp_path / name / "mlflow_run_id").write_text(run_id)
        return tmp_path / name

    died = "worker died (job 7_1 ended without a result, state CANCELLED)"
    runs = {
        "cancelled": cell_run("cancelled", "KILLED", {"interrupted": cancelled}),
        "failed": cell_run("failed", "FAILED", {"error": "RuntimeError: boom"}),
        "running": cell_run("running", None, {}),
        "held": cell_run("held", None, {}),  # another grid's process trains it: this cell was refused
    }
    outcomes = {name: CellOutcome.failed(Cell(i, [], f"scheme={name}"), died) for i, name in enumerate(runs)}
    with RunLock(runs["held"]):
        for name, run_dir in runs.items():
            settle_run(uri, run_dir, outcomes[name])

    assert (outcomes["cancelled"].status, outcomes["cancelled"].error) == (INTERRUPTED, cancelled)
    assert [outcomes[n].status for n in ("failed", "running")] == [FAILED, FAILED]
    status = {n: client.get_run((d / "mlflow_run_id").read_text()) for n, d in runs.items()}
    assert {n: r.info.status for n, r in status.items()} == {
        "cancelled": "KILLED",
        "failed": "FAILED",
        "running": "FAILED",
        "held": "RUNNING",  # left to the process that holds it
    }
    assert status["running"].data.tags["error"] == died

    parent_id = client.create_run(experiment, run_name="sweep:x").info.run_id
    parent = ParentRun(tracking_uri=uri, run_id=parent_id, experiment_id=experiment, client=client)
    parent.close([outcomes["cancelled"]], total=1)
    closed = client.get_run(parent_id)
    assert closed.info.status == "KILLED" and "re-run the grid to resume" in closed.data.tags["interrupted"]


def test_status_of_a_finished_grid_reads_its_files_without_mlflow_or_torch_dynamo(tmp_path, grid_cell_overrides):
    """``--status`` of a finished grid answers from its files and the store's file (no MLflow
    import, no store check of MLflow's; no torch._dynamo), in a new process as a user runs it;
    the parent's state as MLflow has it, and once the parent runs again, MLflow is asked."""
    runs = tmp_path / "runs"
    args = [*GRID, *grid_cell_overrides("probes.enabled=false"), f"runs_dir={runs}"]
    assert run_sweep(args[0], args[1:]) == 0
    probe = (
        "import sys; from sweeps.sweep import main; code = main(sys.argv[1:]); "
        "print('imported:', *sorted(m for m in ('mlflow', 'torch._dynamo', 'lightning') if m in sys.modules))"
    )

    def status_in_a_new_process() -> str:
        done = subprocess.run(
            [str(BIN / "python"), "-c", probe, *args, "--status"], cwd=tmp_path, env=environment(),
            capture_output=True, text=True, timeout=300,
        )  # fmt: skip
        assert done.returncode == 0, done.stderr
        return done.stdout

    client, parents, _ = store(runs)
    out = status_in_a_new_process()
    assert f"parent run {parents[0].info.run_id} FINISHED" in out.splitlines()[0], out
    assert "2 cells: 2 finished" in out and out.splitlines()[-1] == "imported:", out
    client.set_terminated(parents[0].info.run_id, "RUNNING")  # a grid taken up again: MLflow answers
    out = status_in_a_new_process()
    assert "imported: mlflow" in out.splitlines()[-1], out
    assert client.get_run(parents[0].info.run_id).info.status == "FINISHED"  # closed again: every cell ended


@pytest.mark.slow
def test_status_reads_a_grid_whose_store_and_runs_dir_are_read_only(tmp_path, grid_cell_overrides):
    """Before: refused, "runs_dir=... is invalid: the folder is not writable" (and the store called
    damaged): ``--status`` trains nothing and writes nothing it cannot."""
    from test_faults_input import read_only_prefix

    runs = tmp_path / "runs"
    args = [*GRID, *grid_cell_overrides("probes.enabled=false"), f"runs_dir={runs}"]
    assert run_sweep(args[0], args[1:]) == 0
    client, parents, _ = store(runs)
    client.set_terminated(parents[0].info.run_id, "RUNNING")  # as a killed driver leaves it: --status would close it
    mlflow.tracking._tracking_service.utils._tracking_store_registry._get_store_with_resolved_uri.cache_clear()
    before = sorted(str(p.relative_to(runs)) for p in runs.rglob("*"))
    prefix = read_only_prefix(runs)
    try:
        done = subprocess.run(
            [*prefix, str(BIN / "mesh-sweep"), *args, "--status"], cwd=tmp_path, env=environment(),
            capture_output=True, text=True, timeout=300,
        )  # fmt: skip
    finally:
        runs.chmod(0o755)
    assert done.returncode == 0, done.stderr
    assert "damaged" not in done.stderr and "not writable" not in done.stderr
    assert "2 cells: 2 finished" in done.stdout, done.stdout
    assert done.stdout.splitlines()[-1] == (
        "the store is read-only: runs whose process is gone are shown as it says, not settled"
    )
    assert sorted(str(p.relative_to(runs)) for p in runs.rglob("*")) == before
    assert client.get_run(parents[0].info.run_id).info.status == "RUNNING"  # nothing written to the store
