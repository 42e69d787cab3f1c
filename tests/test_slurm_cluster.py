"""``launcher=slurm`` on a real one-node SLURM cluster (``make slurm``), through the real CLI,
the real store and the signals SLURM sends.

* a 2x2 grid is one job array: four cells FINISHED, one parent run and four child runs, each job
  with the partition, time limit, CPUs and memory asked for;
* preemption: USR2 (what SLURM sends before a time limit or a preemption) or ``scontrol requeue``
  while a cell trains requeues its job, which resumes ``last.ckpt`` into the same MLflow run with
  no step logged twice;
* a cell with a 1-minute limit and more work than fits is requeued until it finishes;
* a job cancelled outright fails its cell alone, mesh-sweep exits 1, and running the same command
  again submits that cell alone;
* a detached grid (``--detach``): ``--status`` follows it and settles a job killed outright,
  ``--cancel`` cancels it, re-running continues it, and ``--status`` closes its parent run once
  every cell has ended;
* a cell of two tasks (``resources=ddp_cpu``: DDP over gloo, its ranks started by srun) is one
  MLflow run, logged once per step by rank 0;
* an unknown partition is refused in one line, naming the partitions, before anything is submitted.

Where no cluster answers and none can be started (not root, SLURM not installed) every test here
skips with one line naming ``make slurm``.
"""

from __future__ import annotations

import json
import math
import os
import pickle
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import mlflow
import pytest
from slurm_cluster import allocations, ensure_cluster, job_ids, partitions, unavailable
from test_faults_grid import wait_for

from sweeps.slurm_jobs import COMPLETING, job_states, live, read_jobs

if (reason := unavailable()) is not None:
    pytest.skip(reason, allow_module_level=True)

BIN = Path(sys.executable).parent
# Two cells share the 2-core node; a job asks for 2 GB (RealMemory leaves room for 10 of them).
SLURM = ["launcher=slurm", "resources.cpus_per_task=1", "resources.mem_gb=2"]
SWEEP_TIMEOUT_S = 600  # a requeued job waits ~15 s (KillWait, cred_expire), then pays the imports again


@pytest.fixture(scope="module")
def cluster() -> list[str]:
    """The local cluster's partitions, once it answers (started here by ``make slurm`` if need be)."""
    ensure_cluster()
    return partitions()


DAEMONS = ("slurmctld", "slurmd", "slurmdbd", "slurmstepd", "mariadbd", "munged")


def test_the_cluster_listens_on_loopback_only(cluster):
    """Before: slurmctld, slurmd and slurmdbd listened on 0.0.0.0 (ports 6817-6819)."""
    listening = subprocess.run(["ss", "-ltnpH"], capture_output=True, text=True, check=True).stdout.splitlines()
    ours = {}
    for line in listening:
        name = re.search(r'users:\(\("([^"]+)"', line)
        if name and name.group(1) in DAEMONS:
            ours.setdefault(name.group(1), []).append(line.split()[3])  # local address:port
    assert {"slurmctld", "slurmd", "slurmdbd"} <= set(ours), listening
    for daemon, addresses in ours.items():
        for address in addresses:
            assert address.rsplit(":", 1)[0] in ("127.0.0.1", "[::1]"), (daemon, address)


@pytest.fixture
def cell(grid_cell_overrides):
    """A grid cell (conftest's GRID_CELL, no probes) of ``steps`` steps that logs every step (so a
    step logged twice would show) and checkpoints every 10: long enough to be signalled while
    it trains."""

    def overrides(steps: int) -> list[str]:
        changes = {
            "probes.enabled": "false",
            "max_steps": steps,
            "val_every": 50,
            "log_every": 1,
            "checkpoint_every": 10,
        }
        kept = [o for o in grid_cell_overrides() if o.split("=", 1)[0] not in changes]
        return [*kept, *(f"{key}={value}" for key, value in changes.items())]

    return overrides


def environment() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k != "MLFLOW_TRACKING_URI"}
    env["OMP_NUM_THREADS"] = "1"  # the jobs inherit it (sbatch exports the environment)
    return env


def start_sweep(args: list[str], cwd: Path, name: str = "sweep") -> subprocess.Popen:
    """``mesh-sweep`` in the background, its output in ``cwd/<name>.out`` and ``.err``."""
    with (cwd / f"{name}.out").open("w") as out, (cwd / f"{name}.err").open("w") as err:
        return subprocess.Popen([str(BIN / "mesh-sweep"), *args], cwd=cwd, env=environment(), stdout=out, stderr=err)


def finish(process: subprocess.Popen, cwd: Path, name: str = "sweep") -> tuple[int, str, str]:
    """Wait for the sweep; (exit code, stdout, stderr). stderr holds no submitit warning: job
    states come from sacct, which answers."""
    try:
        code = process.wait(timeout=SWEEP_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        process.kill()
        raise
    out, err = ((cwd / f"{name}{suffix}").read_text() for suffix in (".out", ".err"))
    assert "Bypassing" not in err, err
    return code, out, err


def submitit_folder(runs: Path) -> Path:
    """``<runs_dir>/<experiment>/sweeps/<key>/submitit`` (sweeps/sweep.py ``sweep_dir_for``)."""
    (folder,) = runs.glob("schemes/sweeps/*/submitit")
    return folder


def checkpointed(runs: Path, scheme: str) -> bool:
    """The cell of ``scheme`` has saved a checkpoint: it trains, and is far from done."""
    return any(runs.glob(f"schemes/*-{scheme}-*/checkpoints/step*.ckpt"))


def summary(runs: Path) -> dict[str, dict]:
    (path,) = runs.glob("schemes/sweeps/*/summary.json")
    return {o["label"]: o for o in json.loads(path.read_text())}


def store(runs: Path):
    """(client, parent runs, cell runs) of the sweep's experiment."""
    client = mlflow.MlflowClient(f"sqlite:///{runs / 'mlflow.db'}")
    found = client.search_runs([client.get_experiment_by_name("schemes").experiment_id])
    parents = [r for r in found if r.data.tags.get("kind") == "sweep"]
    return client, parents, [r for r in found if r.data.tags.get("kind") != "sweep"]


def assert_resumed(runs: Path, scheme: str, job: str, steps: int, stopped: str = "REQUEUED") -> None:
    """The cell of ``scheme`` ran in more than one allocation of ``job`` (each but the last
    ended ``stopped``: requeued by submitit, or preempted and requeued by SLURM), the later one
    resumed ``last.ckpt``, and the cell is one FINISHED MLflow run whose ``train/loss`` holds
    every step once, in order."""
    outcome = summary(runs)[f"scheme={scheme}"]  # the sweep waited for the last allocation
    assert outcome["status"] == "FINISHED", outcome
    rows = allocations(job)
    states = [row["State"] for row in rows]
    log = (submitit_folder(runs) / f"{job}_0_log.err").read_text()
    ended = [f"{row['State']} (exit {row['ExitCode']}, {row['Start']} to {row['End']})" for row in rows]
    assert len(states) >= 2 and set(states[:-1]) == {stopped} and states[-1] == "COMPLETED", (ended, log[-4000:])
    assert "[mesh-train] resuming from" in log and "last.ckpt" in log, log[-3000:]
    client, parents, cells = store(runs)
    assert [p.info.status for p in parents] == ["FINISHED"]
    (run,) = [r for r in cells if r.data.params["scheme"] == scheme]  # one run, however many allocations
    assert run.info.status == "FINISHED" and run.data.tags["mlflow.parentRunId"] == parents[0].info.run_id
    assert not {"terminated", "interrupted", "error"} & set(run.data.tags)  # a resume clears the stop tags
    logged = [m.step for m in client.get_metric_history(run.info.run_id, "train/loss")]
    assert logged == list(range(steps)), logged  # none twice, none lost
    assert outcome["run_id"] == run.info.run_id


@pytest.mark.slow
def test_a_2x2_grid_is_one_job_array_with_the_resources_asked(cluster, tmp_path, grid_cell_overrides):
    runs = tmp_path / "runs"
    asked = [*SLURM, f"launcher.partition={cluster[0]}", "resources.time_min=7"]
    args = ["schemes", "scheme=base,mesh", "seeds=2", *asked, *grid_cell_overrides("probes.enabled=false")]
    code, out, err = finish(start_sweep([*args, f"runs_dir={runs}"], tmp_path), tmp_path)
    assert code == 0, out + err

    jobs = job_ids(submitit_folder(runs))
    array = jobs[0].split("_")[0]
    assert jobs == [f"{array}_{task}" for task in range(4)]  # one array, one task per cell
    rows = allocations(array)
    assert sorted(row["JobID"] for row in rows) == jobs
    for row in rows:
        assert row["State"] == "COMPLETED" and row["Partition"] == cluster[0], row
        assert (row["Timelimit"], row["ReqCPUS"], row["ReqMem"]) == ("00:07:00", "1", "2G"), row

    assert sorted(o["status"] for o in summary(runs).values()) == ["FINISHED"] * 4
    client, parents, cells = store(runs)
    assert len(parents) == 1 and parents[0].info.status == "FINISHED"
    assert sorted(f"{r.data.params['scheme']} {r.data.params['seed']}" for r in cells) == [
        "base 0",
        "base 1",
        "mesh 0",
        "mesh 1",
    ]
    for run in cells:
        assert run.info.status == "FINISHED" and run.data.tags["mlflow.parentRunId"] == parents[0].info.run_id
        assert [m.step for m in client.get_metric_history(run.info.run_id, "val/shakespeare/loss")] == [3, 6]


PREEMPT_STEPS = 300
DDP_STEPS = 100  # signalled after step 10's checkpoint


@pytest.mark.slow
def test_a_cell_warned_with_usr2_is_requeued_by_submitit_and_resumes_its_run(cluster, tmp_path, cell):
    """USR2 is what SLURM sends before the time limit (and before a preemption where the cluster
    sets ``PreemptParameters=send_user_signal``): training stops at the end of the step with
    last.ckpt saved, submitit requeues the job, and the cell resumes into its run."""
    runs = tmp_path / "runs"
    process = start_sweep(["schemes", "scheme=base", *SLURM, *cell(PREEMPT_STEPS), f"runs_dir={runs}"], tmp_path)
    wait_for(lambda: checkpointed(runs, "base"), 300, process, "the base cell to checkpoint")
    (job,) = job_ids(submitit_folder(runs))
    subprocess.run(["scancel", "--signal=USR2", job], check=True, timeout=30)
    code, out, err = finish(process, tmp_path)
    assert code == 0, out + err
    assert_resumed(runs, "base", job, PREEMPT_STEPS)


@pytest.mark.slow
def test_preemption_requeues_a_cell_or_ends_it_preempted_and_either_resumes_its_run(cluster, tmp_path, cell):
    """Real preemption by partition priority (slurm/slurm.conf.in): a job of ``urgent`` takes the
    node. SLURM sends the cells' tasks SIGTERM: each stops at the end of its step with last.ckpt
    saved. On ``local`` (PreemptMode=REQUEUE) SLURM requeues the job and the cell resumes into the
    same run; its sweep finishes. On ``spot`` (PreemptMode=CANCEL) the job ends PREEMPTED, which
    submitit would wait on forever: the sweep reports the cell stopped and exits 1, and the same
    command (here on ``local``) resumes it into the same run."""
    requeued, cancelled = tmp_path / "requeued", tmp_path / "cancelled"
    for folder in (requeued, cancelled):
        folder.mkdir()
    common = ["launcher=slurm", "resources.cpus_per_task=1", "resources.mem_gb=2", *cell(PREEMPT_STEPS)]
    first = start_sweep(
        ["schemes", "scheme=base", *common, "launcher.partition=local", f"runs_dir={requeued / 'runs'}"], requeued
    )
    second_args = ["schemes", "scheme=mesh", *common, f"runs_dir={cancelled / 'runs'}"]
    second = start_sweep([*second_args, "launcher.partition=spot"], cancelled)
    wait_for(lambda: checkpointed(requeued / "runs", "base"), 300, first, "the cell on local to checkpoint")
    wait_for(lambda: checkpointed(cancelled / "runs", "mesh"), 300, second, "the cell on spot to checkpoint")
    urgent = ["sbatch", "--parsable", "-p", "urgent", "-c", "2", "--mem=1G", "-o", "/dev/null", "--wrap", "sleep 1"]
    subprocess.run(urgent, check=True, timeout=30, capture_output=True)

    code, out, err = finish(second, cancelled)
    assert code == 1, out + err
    (job,) = job_ids(submitit_folder(cancelled / "runs"))
    assert [row["State"] for row in allocations(job)] == ["PREEMPTED"]
    outcome = summary(cancelled / "runs")["scheme=mesh"]
    assert outcome["status"] == "INTERRUPTED" and f"SLURM job {job} ended PREEMPTED" in outcome["error"], outcome
    _, _, (stopped,) = store(cancelled / "runs")
    assert stopped.info.status == "KILLED" and stopped.data.tags["terminated"].startswith("SIGTERM at step ")

    code, out, err = finish(first, requeued)
    assert code == 0, out + err
    (job,) = job_ids(submitit_folder(requeued / "runs"))
    assert_resumed(requeued / "runs", "base", job, PREEMPT_STEPS, stopped="PREEMPTED")

    again = start_sweep([*second_args, "launcher.partition=local"], cancelled, "again")
    code, out, err = finish(again, cancelled, "again")
    assert code == 0, out + err
    client, _, (run,) = store(cancelled / "runs")  # the same run, resumed
    assert run.info.run_id == stopped.info.run_id and run.info.status == "FINISHED"
    assert [m.step for m in client.get_metric_history(run.info.run_id, "train/loss")] == list(range(PREEMPT_STEPS))


def seconds_per_step(cell, tmp_path: Path) -> float:
    """What a training step of ``cell`` costs on this machine now, with one torch thread as in a
    job: a 60-step run in this process, validation, logging and checkpoints included."""
    import torch

    from experiments.compose import compose_config
    from experiments.train import train

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        result = train(compose_config([*cell(60), f"runs_dir={tmp_path / 'calibration'}"]))
    finally:
        torch.set_num_threads(threads)
    timing = result["timing"]
    return (timing["steps_s"] + timing["between_steps_s"] + timing["validation_s"]) / result["steps"]


def seconds_per_step_in_job(runs: Path) -> float:
    """What a step cost inside the finished cell's job: the spread of its ``train/loss`` timestamps
    (logged every step) over the steps between them."""
    client, _, (run,) = store(runs)
    history = sorted(client.get_metric_history(run.info.run_id, "train/loss"), key=lambda m: m.step)
    return (history[-1].timestamp - history[0].timestamp) / 1000 / (history[-1].step - history[0].step)


TIME_LIMIT_TRIES = 3


@pytest.mark.slow
def test_a_cell_past_its_time_limit_is_requeued_and_finishes_later(cluster, tmp_path, cell):
    """75 s of training with a 1-minute limit cannot fit in one allocation: the imports come first,
    and SLURM sends USR2 before the limit (at most ~50 s in). Each allocation trains until USR2,
    saves ``last.ckpt`` and is requeued, until one finishes.

    The 75 s are counted at the speed measured in this process; on a shared machine the job can
    run 3x faster than that measure (CI: 0.078 s/step measured, 0.027 in the job, and 958 steps
    fitted in one allocation). A cell that finished in one allocation is the measure of the job's
    own speed: the cell is submitted again, sized by it, at most ``TIME_LIMIT_TRIES`` times."""
    per_step = seconds_per_step(cell, tmp_path)
    limit = ["resources.time_min=1", "launcher.max_requeues=10"]
    for attempt in range(TIME_LIMIT_TRIES):
        here = tmp_path / f"try{attempt}"
        here.mkdir()
        runs, steps = here / "runs", math.ceil(75 / per_step)
        code, out, err = finish(
            start_sweep(["schemes", "scheme=base", *SLURM, *limit, *cell(steps), f"runs_dir={runs}"], here), here
        )
        assert code == 0, out + err
        (job,) = job_ids(submitit_folder(runs))
        if len(allocations(job)) > 1:
            break
        per_step = min(per_step, seconds_per_step_in_job(runs))
    else:
        pytest.fail(f"{TIME_LIMIT_TRIES} cells, each sized by the last one's speed, finished in one allocation")
    assert {row["Timelimit"] for row in allocations(job)} == {"00:01:00"}
    assert "this job is timed-out" in (submitit_folder(runs) / f"{job}_0_log.err").read_text()  # SLURM's USR2
    assert_resumed(runs, "base", job, steps)


CANCELLED_STEPS = 60


@pytest.mark.slow
def test_a_cancelled_job_fails_its_cell_alone_and_a_rerun_resubmits_it(cluster, tmp_path, cell):
    runs = tmp_path / "runs"
    args = ["schemes", "scheme=base,mesh", *SLURM, *cell(CANCELLED_STEPS), f"runs_dir={runs}"]
    process = start_sweep(args, tmp_path)
    wait_for(lambda: checkpointed(runs, "mesh"), 300, process, "the mesh cell to checkpoint step 10")
    first = job_ids(submitit_folder(runs))
    array = first[0].split("_")[0]
    assert first == [f"{array}_0", f"{array}_1"]
    subprocess.run(["scancel", f"{array}_1"], check=True, timeout=30)  # the mesh cell, the grid's second
    code, out, err = finish(process, tmp_path)
    assert code == 1, out + err

    outcomes = summary(runs)
    assert outcomes["scheme=base"]["status"] == "FINISHED"
    cancelled = outcomes["scheme=mesh"]
    assert cancelled["status"] == "FAILED" and "CANCELLED" in cancelled["error"], cancelled
    client, parents, cells = store(runs)
    assert [p.info.status for p in parents] == ["FAILED"]
    by_scheme = {r.data.params["scheme"]: r for r in cells}
    assert by_scheme["base"].info.status == "FINISHED"
    killed = by_scheme["mesh"]
    assert killed.info.status in ("FAILED", "KILLED") and killed.info.run_id == cancelled["run_id"]
    reason = killed.data.tags.get("terminated") or killed.data.tags.get("error")
    assert reason, killed.data.tags  # why it stopped, in the run itself

    code, out, err = finish(start_sweep(args, tmp_path, "again"), tmp_path, "again")
    assert code == 0, out + err
    (resubmitted,) = [job for job in job_ids(submitit_folder(runs)) if job not in first]  # a lone job, no array
    assert [row["State"] for row in allocations(resubmitted)] == ["COMPLETED"]
    client, parents, cells = store(runs)
    assert [p.info.status for p in parents] == ["FINISHED"]  # the same parent, closed by the re-run
    by_scheme = {r.data.params["scheme"]: r for r in cells}
    assert sorted(by_scheme) == ["base", "mesh"] and by_scheme["mesh"].info.run_id == cancelled["run_id"]
    assert all(r.info.status == "FINISHED" for r in cells)


def mesh_sweep(args: list[str], cwd: Path) -> tuple[int, str]:
    """``mesh-sweep ARGS`` to its end: (exit code, stdout and stderr)."""
    done = subprocess.run(
        [str(BIN / "mesh-sweep"), *args], cwd=cwd, env=environment(), capture_output=True, text=True, timeout=300
    )
    return done.returncode, done.stdout + done.stderr


def until(condition, timeout: float, what: str):
    """``condition()``'s first true value; ``timeout`` only stops a wait that would never end, so it
    is far beyond what a loaded machine takes."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if value := condition():
            return value
        time.sleep(0.2)
    raise AssertionError(f"gave up waiting for {what}")


def run_dir_of(runs: Path, steps: int, checkpointed: bool = False) -> Path | None:
    """The folder of the cell of ``max_steps=steps`` once its run has started (and saved a
    checkpoint, if ``checkpointed``)."""
    for folder in runs.glob("schemes/tiny-*"):
        config = folder / "config.yaml"
        started = config.exists() and re.search(rf"^max_steps: {steps}$", config.read_text(), re.M)
        if started and (not checkpointed or any(folder.glob("checkpoints/step*.ckpt"))):
            return folder
    return None


def kill_outright(run_dir: Path) -> None:
    """SIGKILL to the process that trains the run (its lock holds the PID): as the OOM killer does,
    it leaves the run RUNNING and its job ends on its own."""
    pid = int((run_dir / ".lock").read_text())
    try:
        os.kill(pid, signal.SIGKILL)
    except ProcessLookupError:
        raise AssertionError(f"the cell in {run_dir} ended before it could be killed (PID {pid} is gone)") from None


def ended(job: str) -> bool:
    state = (job_states([job]) or {}).get(job)
    return state is not None and not live(state) and state != COMPLETING


def status_rows(out: str) -> dict[str, list[str]]:
    """Each cell's row of ``--status`` after its label: state, step, val loss, SLURM job, note."""
    rows = {}
    for line in out.splitlines():
        fields = re.split(r"\s{2,}", line.strip())
        if len(fields) >= 6 and fields[0].isdigit():
            rows[fields[1].split()[-1]] = fields[2:]  # by the cell's max_steps=...
    return rows


# The short cell is killed once it has a checkpoint and later finishes; the long one never does.
# 400 steps: at 60 a loaded machine's 0.2 s polls could see its step10.ckpt after the cell had
# finished (ProcessLookupError in kill_outright).
SHORT, LONG = 400, 100_000


@pytest.mark.slow
def test_a_detached_grid_is_followed_settled_cancelled_and_continued(cluster, tmp_path, cell):
    runs = tmp_path / "runs"
    every = [o for o in cell(SHORT) if not o.startswith("max_steps=")]
    args = ["schemes", "scheme=base", f"max_steps={SHORT},{LONG}", *SLURM, *every, f"runs_dir={runs}"]
    short, long = f"max_steps={SHORT}", f"max_steps={LONG}"
    try:
        code, out = mesh_sweep([*args, "--detach"], tmp_path)
        assert code == 0, out
        (sweep_dir,) = runs.glob("schemes/sweeps/*")
        first = read_jobs(sweep_dir)
        said = re.findall(r"cell (\d)/2 submitted scheme=base max_steps=\d+ · SLURM job (\S+)", out)
        assert sorted(first) == [0, 1] and said == [(str(i + 1), first[i]) for i in (0, 1)], out
        assert re.search(r"^status: \S*mesh-sweep schemes .* --status$", out, re.M), out
        assert re.search(r"^cancel: \S*mesh-sweep schemes .* --cancel$", out, re.M), out
        assert live(job_states([first[1]])[first[1]])  # mesh-sweep has returned; the jobs go on
        client, parents, _ = store(runs)
        assert [p.info.status for p in parents] == ["RUNNING"]
        assert f"submitted: {first[0]} {first[1]}" in parents[0].data.tags["detached"]

        # The short cell's process is killed outright (its run stays RUNNING): --status settles it.
        kill_outright(until(lambda: run_dir_of(runs, SHORT, checkpointed=True), 300, "the short cell to train"))
        until(lambda: ended(first[0]), 300, "SLURM to end the killed job")
        long_dir = until(lambda: run_dir_of(runs, LONG, checkpointed=True), 300, "the long cell to train")
        code, out = mesh_sweep([*args, "--status"], tmp_path)
        rows = status_rows(out)
        assert code == 0 and rows[long][0] == "running" and rows[long][3] == f"{first[1]} RUNNING", out
        state, step, _, job, note = rows[short]
        ended_as = job.split()[1]  # sacct's word: FAILED here (the task died of a signal)
        assert state == ("killed" if ended_as in ("CANCELLED", "TIMEOUT") else "failed") and int(step) >= 9, out
        assert note.startswith(f"SLURM job {first[0]} ended {ended_as} at step {step} (found by mesh-sweep --status)")
        assert out.rstrip().endswith(f"2 cells: 1 running, 1 {state}"), out
        client, parents, cells = store(runs)
        (settled,) = [r for r in cells if r.data.params["max_steps"] == str(SHORT)]
        assert settled.info.status == {"failed": "FAILED", "killed": "KILLED"}[state]
        assert note in (settled.data.tags.get("error"), settled.data.tags.get("terminated"))
        assert [p.info.status for p in parents] == ["RUNNING"]  # a cell still runs

        # --cancel: the long cell's job is cancelled, its run and the parent KILLED.
        code, out = mesh_sweep([*args, "--cancel"], tmp_path)
        assert code == 0 and f"cancelled 1 SLURM job(s): {first[1]}" in out, out
        assert status_rows(out)[long][:1] == ["killed"] and "re-run the grid to continue it: " in out, out
        assert allocations(first[1])[-1]["State"].startswith("CANCELLED")  # "CANCELLED by <uid>"
        client, parents, cells = store(runs)
        (cancelled,) = [r for r in cells if r.data.params["max_steps"] == str(LONG)]
        assert cancelled.info.status == "KILLED", cancelled.data.tags
        assert cancelled.data.tags["interrupted"].startswith(f"cancelled (mesh-sweep --cancel), SLURM job {first[1]}")
        assert [p.info.status for p in parents] == ["KILLED"]
        assert (
            parents[0].data.tags["interrupted"].startswith("cancelled (mesh-sweep --cancel): 0 finished, 1 interrupted")
        )

        # Re-run, detached again: both cells resume their last.ckpt into their runs; the short one
        # finishes, the long one is killed outright; then --status finds every cell ended.
        code, out = mesh_sweep([*args, "--detach"], tmp_path)
        assert code == 0, out
        again = read_jobs(sweep_dir)
        assert set(again.values()).isdisjoint(first.values()), (first, again)
        log = submitit_folder(runs) / f"{again[1]}_0_log.err"
        until(lambda: log.exists() and "[mesh-train] resuming from" in log.read_text(), 300, "the long cell to resume")
        kill_outright(long_dir)
        until(lambda: (run_dir_of(runs, SHORT) / "result.json").exists(), 300, "the short cell to finish")
        until(lambda: ended(again[0]) and ended(again[1]), 300, "SLURM to end both jobs")
        code, out = mesh_sweep([*args, "--status"], tmp_path)
        rows = status_rows(out)
        result = json.loads((run_dir_of(runs, SHORT) / "result.json").read_text())
        assert code == 0 and rows[short][:3] == ["finished", str(SHORT), f"{result['val_loss']:.4f}"], out
        assert rows[long][0] in ("failed", "killed") and rows[long][4].startswith(f"SLURM job {again[1]} ended"), out
        assert "every cell has ended: the parent run is closed; re-running the grid continues it" in out, out
        client, parents, cells = store(runs)
        assert [p.info.status for p in parents] == ["FAILED" if rows[long][0] == "failed" else "KILLED"]
        assert "detached" in parents[0].data.tags and parents[0].data.tags["progress"].startswith("2/2: 1 finished")
        by_steps = {int(r.data.params["max_steps"]): r for r in cells}
        assert (
            by_steps[SHORT].info.run_id == settled.info.run_id and by_steps[LONG].info.run_id == cancelled.info.run_id
        )
        finished = by_steps[SHORT]
        assert finished.info.status == "FINISHED" and not {"error", "terminated", "interrupted"} & set(
            finished.data.tags
        )
        assert [m.step for m in client.get_metric_history(finished.info.run_id, "train/loss")] == list(range(SHORT))
        # It resumed: from last.ckpt or step<N>.ckpt, whichever was written last before the kill.
        resumed = (submitit_folder(runs) / f"{again[0]}_0_log.err").read_text()
        assert re.search(r"\[mesh-train\] resuming from \S+/checkpoints/(last|step\d+)\.ckpt", resumed), resumed[-3000:]
    finally:  # nothing of this grid left on the cluster for the next test
        if jobs := read_jobs(next(runs.glob("schemes/sweeps/*"), tmp_path)):
            subprocess.run(["scancel", *jobs.values()], capture_output=True, timeout=30)


@pytest.mark.slow
def test_a_cell_of_two_tasks_is_one_ddp_run_logged_by_rank_0_and_survives_preemption(cluster, tmp_path, cell):
    """Two srun tasks are one DDP run. USR2 (SLURM's warning) reaches both ranks: they stop at the
    end of the same step with last.ckpt saved, the job is requeued, and the ranks resume it into
    the same single run, each step logged once, by rank 0."""
    runs = tmp_path / "runs"
    args = ["schemes", "scheme=base", "launcher=slurm", "resources=ddp_cpu", "resources.mem_gb=2", *cell(DDP_STEPS)]
    process = start_sweep([*args, f"runs_dir={runs}"], tmp_path)
    wait_for(lambda: checkpointed(runs, "base"), 300, process, "the DDP cell to checkpoint")
    (job,) = job_ids(submitit_folder(runs))
    subprocess.run(["scancel", "--signal=USR2", job], check=True, timeout=30)
    code, out, err = finish(process, tmp_path)
    assert code == 0, out + err

    assert_resumed(runs, "base", job, DDP_STEPS)  # requeued, resumed last.ckpt, one run, each step once
    assert {row["ReqCPUS"] for row in allocations(job)} == {"2"}  # 2 tasks x 1 CPU
    steps = subprocess.run(
        ["sacct", "-P", "-n", "-j", job, "-o", "JobID,NTasks"], capture_output=True, text=True, timeout=30, check=True
    ).stdout.split()
    assert f"{job}.0|2" in steps, steps  # srun's step: two tasks
    client, parents, cells = store(runs)
    (run,) = cells  # one run for both ranks and both allocations
    assert (run.data.params["trainer.devices"], run.data.params["trainer.strategy"]) == ("2", "ddp")
    result = json.loads((Path(run.data.tags["run_dir"]) / "result.json").read_text())
    assert result["world_size"] == 2 and result["run_id"] == run.info.run_id
    # Rank 1 trained the same steps in the same DDP run, and reported without a run of its own.
    status, rank1 = pickle.loads((submitit_folder(runs) / f"{job}_1_result.pkl").read_bytes())
    assert status == "success" and rank1.status == "FINISHED" and rank1.run_id is None and rank1.steps == DDP_STEPS
    assert rank1.val_loss == pytest.approx(result["val_loss"])


def test_an_unknown_partition_is_refused_in_one_line_before_anything_is_submitted(cluster, tmp_path, cell):
    runs = tmp_path / "runs"
    args = ["schemes", "scheme=base", *SLURM, "launcher.partition=nope", *cell(6), f"runs_dir={runs}"]
    result = subprocess.run(
        [str(BIN / "mesh-sweep"), *args], cwd=tmp_path, env=environment(), capture_output=True, text=True, timeout=300
    )
    assert result.returncode == 2, result.stdout + result.stderr
    err = result.stderr
    assert err.count("\n") == 1 and err.startswith("error: launcher.partition='nope' is invalid"), err
    assert all(name in err for name in cluster), err  # the partitions there are
    assert not list(runs.rglob("mlflow.db")) and not list(runs.rglob("*_submitted.pkl"))


@pytest.mark.slow
def test_seeds_auto_rerun_after_its_driver_is_killed_mid_stage_settles_every_stage(
    cluster, tmp_path, grid_cell_overrides
):
    """``kill -9`` of a seeds=auto driver while stage 2's jobs run; they end on their own, then the
    same command again. Before: the re-run decided on four seeds as stage 1's decision and stage 2's
    parent run stayed RUNNING."""
    runs = tmp_path / "runs"
    auto = ["seeds=auto", "seeds.stage=2", "seeds.max=4", "seeds.futility=false", "scheme=base,mesh"]
    args = ["schemes", *auto, *SLURM, f"launcher.partition={cluster[0]}"]
    args += [*grid_cell_overrides("probes.enabled=false"), f"runs_dir={runs}"]
    driver = start_sweep(args, tmp_path)

    def stage_2_submitted() -> bool:
        folders = [f for f in runs.glob("schemes/sweeps/*/submitit") if any(f.glob("*_submitted.pkl"))]
        return len(folders) >= 2

    wait_for(stage_2_submitted, SWEEP_TIMEOUT_S, driver, "stage 2's jobs")
    driver.send_signal(signal.SIGKILL)
    driver.wait(timeout=60)
    deadline = time.monotonic() + SWEEP_TIMEOUT_S
    while len(list(runs.glob("schemes/*/result.json"))) < 8:  # the jobs go on without their driver
        assert time.monotonic() < deadline, "stage 2's jobs never finished"
        time.sleep(1)
    code, out, err = finish(start_sweep(args, tmp_path, "again"), tmp_path, "again")
    assert code == 0, out + err
    assert "stage 2: seeds 2..3 on 2 arm(s)" in out
    client, parents, cells = store(runs)
    assert len(cells) == 8 and all(r.info.status == "FINISHED" for r in cells)
    assert len(parents) == 2 and all(p.info.status == "FINISHED" for p in parents), [p.info for p in parents]
    (first,) = [p for p in parents if "seeds_auto.stage1" in p.data.tags]
    document = json.loads(Path(client.download_artifacts(first.info.run_id, "stages.json", str(tmp_path))).read_text())
    assert [[v["n"] for v in s["verdicts"]] for s in document["stages"]] == [[2], [4]]
    assert "seeds_auto.stage2" in first.data.tags
