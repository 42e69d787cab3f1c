"""Faults of a grid, with the real CLI, a real sqlite store and real signals. The grids that are
signalled or killed run as processes of their own; the rest call the console script's ``main`` in
this process (tests/helpers.py's ``run_tool``): what they test is the refusal, the store or the report.

* SIGKILL to one worker of ``launcher=parallel``: only its cell fails, the others finish, and
  MLflow agrees with the table;
* SIGTERM to one worker: its cell stops with ``last.ckpt`` (INTERRUPTED, its run KILLED), the
  other finishes; the grid is not complete: the parent run is KILLED, not FINISHED, and exit 1;
* Ctrl-C (SIGINT to the sweep's process group, as a terminal sends it): the parent run is KILLED,
  nothing is left RUNNING, cells not started never start, exit 130;
* bad launch inputs: one line on stderr, exit 2, no store created;
* ``mesh-results``: the same config and seed trained twice is one replicate, not two.
"""

from __future__ import annotations

import json
import math
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import mlflow
import pandas as pd
import pytest
from helpers import Ran, run_tool

from experiments.store.sqlite import forget_engine

BIN = Path(sys.executable).parent
GRID = ["schemes", "scheme=base,mesh,anchor", "launcher=parallel", "launcher.workers=2"]
CELLS = {"scheme=base", "scheme=mesh", "scheme=anchor"}
DIED = "worker died (signal 9)"


@pytest.fixture
def cell(grid_cell_overrides):
    """A grid cell (conftest's GRID_CELL, no probes) that trains ``steps`` steps: long enough for a
    signal to land while it trains."""

    def overrides(steps: int, checkpoint_every: int = 20) -> list[str]:
        changes = {"probes.enabled": "false", "max_steps": steps, "val_every": 20, "checkpoint_every": checkpoint_every}
        kept = [o for o in grid_cell_overrides() if o.split("=", 1)[0] not in changes]
        return [*kept, *(f"{key}={value}" for key, value in changes.items())]

    return overrides


def environment() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k != "MLFLOW_TRACKING_URI"}
    env["OMP_NUM_THREADS"] = "1"
    return env


def start_sweep(args: list[str], cwd: Path) -> tuple[subprocess.Popen, Path]:
    """``mesh-sweep`` in a process group of its own (as a shell runs a foreground job); output in files."""
    log = cwd / "sweep.log"
    with log.open("w") as out, (cwd / "sweep.err").open("w") as err:
        process = subprocess.Popen(
            [str(BIN / "mesh-sweep"), *args], cwd=cwd, env=environment(), stdout=out, stderr=err, start_new_session=True
        )
    return process, log


def children(pid: int) -> list[int]:
    found = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[1]) == pid:
            found.append(int(stat.parent.name))
    return found


def cell_workers(pid: int) -> list[int]:
    """The spawned worker processes of the sweep (not multiprocessing's resource tracker), in the
    order they started: the pool starts the cells in grid order."""
    workers = []
    for child in children(pid):
        try:
            if b"spawn_main" in Path(f"/proc/{child}/cmdline").read_bytes():
                started = int(Path(f"/proc/{child}/stat").read_text().rsplit(")", 1)[1].split()[19])
                workers.append((started, child))
        except (OSError, IndexError, ValueError):
            continue
    return [child for _, child in sorted(workers)]


def wait_for(condition, timeout: float, process: subprocess.Popen, what: str):
    """``condition()``'s first true value. A grid that exits fails at once; ``timeout`` only stops one
    that hangs, so it is far beyond what the cells take on a loaded machine."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if value := condition():
            return value
        if process.poll() is not None:
            break
        time.sleep(0.2)
    process.kill()
    raise AssertionError(f"gave up waiting for {what} (sweep exit code {process.poll()})")


def store(runs_dir: Path):
    client = mlflow.MlflowClient(f"sqlite:///{runs_dir / 'mlflow.db'}")
    runs = client.search_runs([client.get_experiment_by_name("schemes").experiment_id])
    parents = [r for r in runs if r.data.tags.get("kind") == "sweep"]
    cells = [r for r in runs if r.data.tags.get("kind") != "sweep"]
    return parents, cells


def summary(runs_dir: Path) -> dict[str, dict]:
    (path,) = runs_dir.glob("schemes/sweeps/*/summary.json")
    return {o["label"]: o for o in json.loads(path.read_text())}


def table_row(text: str, label: str) -> list[str]:
    (line,) = [line for line in text.splitlines() if line.startswith("| ") and f"| {label} |" in line]
    return [part.strip() for part in line.strip("|").split("|")]


def checkpointed(runs_dir: Path, scheme: str) -> bool:
    """The cell of ``scheme`` has saved a checkpoint: it is training, and far from done."""
    return any(runs_dir.glob(f"schemes/*-{scheme}-*/checkpoints/*.ckpt"))


@pytest.mark.slow
def test_a_killed_worker_fails_its_cell_alone_and_mlflow_agrees(tmp_path, cell):
    runs = tmp_path / "runs"
    process, log = start_sweep([*GRID, *cell(100, checkpoint_every=10), f"runs_dir={runs}"], tmp_path)
    # The first cell (scheme=base, in the first worker started) is 10 steps into training: kill it.
    wait_for(lambda: checkpointed(runs, "base"), 600, process, "the first cell to train 10 steps")
    workers = cell_workers(process.pid)
    assert len(workers) == 2 and not list(runs.glob("schemes/*-base-*/result.json"))
    os.kill(workers[0], signal.SIGKILL)
    assert process.wait(timeout=300) == 1, log.read_text()

    outcomes = summary(runs)
    failed = [label for label, o in outcomes.items() if o["status"] == "FAILED"]
    assert failed == ["scheme=base"] and outcomes["scheme=base"]["error"] == DIED
    assert sorted(o["status"] for o in outcomes.values()) == ["FAILED", "FINISHED", "FINISHED"]
    text = log.read_text()
    row = table_row(text, failed[0])
    assert row[2:6] == ["FAILED", "-", "-", "-"] and row[-1] == DIED  # status, val loss, val PPL, steps/s
    assert "\n1 failed\n" in text

    parents, cells = store(runs)
    assert len(parents) == 1 and parents[0].info.status == "FAILED"
    assert not [r for r in [*parents, *cells] if r.info.status == "RUNNING"]
    by_scheme = {f"scheme={r.data.params['scheme']}": r for r in cells}
    assert set(by_scheme) == CELLS  # one run per cell: the killed one is not retried behind its back
    killed = by_scheme[failed[0]]
    assert killed.info.status == "FAILED" and killed.data.tags["error"] == DIED
    assert killed.info.run_id == outcomes[failed[0]]["run_id"]
    for label, run in by_scheme.items():
        if label != failed[0]:
            assert run.info.status == "FINISHED"
            assert outcomes[label]["val_loss"] == pytest.approx(run.data.metrics["val_loss"])
            assert table_row(text, label)[2] == "FINISHED"


@pytest.mark.slow
def test_a_worker_stopped_by_sigterm_leaves_the_grid_incomplete_and_exits_1(tmp_path, cell):
    runs = tmp_path / "runs"
    args = ["schemes", "scheme=base,mesh", "launcher=parallel", "launcher.workers=2"]
    process, log = start_sweep([*args, *cell(60, checkpoint_every=10), f"runs_dir={runs}"], tmp_path)
    wait_for(lambda: checkpointed(runs, "base"), 600, process, "the first cell to train 10 steps")
    workers = cell_workers(process.pid)
    assert len(workers) == 2 and not list(runs.glob("schemes/*-base-*/result.json"))
    os.kill(workers[0], signal.SIGTERM)  # the first cell's worker alone, not the grid's process group
    assert process.wait(timeout=300) == 1, log.read_text()

    outcomes = summary(runs)
    stopped = outcomes["scheme=base"]
    assert stopped["status"] == "INTERRUPTED" and stopped["error"] == "stopped (exit code 143); re-run to resume"
    assert outcomes["scheme=mesh"]["status"] == "FINISHED"
    text = log.read_text()
    assert table_row(text, "scheme=base")[2] == "INTERRUPTED" and table_row(text, "scheme=mesh")[2] == "FINISHED"
    assert "interrupted: 1 finished, 0 failed, 1 interrupted, 0 never ran; run the same command to resume" in text

    parents, cells = store(runs)
    assert len(parents) == 1 and parents[0].info.status == "KILLED"
    assert (
        parents[0]
        .data.tags["interrupted"]
        .startswith("1 cell(s) stopped before the end: 1 finished, 1 interrupted, 0 never ran")
    )
    assert not [r for r in [*parents, *cells] if r.info.status == "RUNNING"]
    by_scheme = {r.data.params["scheme"]: r for r in cells}
    assert by_scheme["mesh"].info.status == "FINISHED"
    killed = by_scheme["base"]
    assert killed.info.status == "KILLED" and killed.data.tags["terminated"].startswith("SIGTERM at step ")
    assert killed.info.run_id == stopped["run_id"]
    assert (Path(stopped["run_dir"]) / "checkpoints" / "last.ckpt").exists()  # a re-run resumes it


@pytest.mark.slow
def test_ctrl_c_stops_the_grid_closes_every_run_and_exits_130(tmp_path, cell):
    runs = tmp_path / "runs"
    process, log = start_sweep([*GRID, *cell(2000, checkpoint_every=10), f"runs_dir={runs}"], tmp_path)
    wait_for(
        lambda: checkpointed(runs, "base") and checkpointed(runs, "mesh"),
        600,
        process,
        "both running cells to train 10 steps",
    )
    workers = cell_workers(process.pid)
    assert len(workers) == 2
    os.killpg(process.pid, signal.SIGINT)  # what Ctrl-C in a terminal does: the sweep and its workers
    assert process.wait(timeout=300) == 130, log.read_text()

    outcomes = summary(runs)
    statuses = sorted(o["status"] for o in outcomes.values())
    assert statuses == ["INTERRUPTED", "INTERRUPTED", "NOT_STARTED"]
    (never,) = [label for label, o in outcomes.items() if o["status"] == "NOT_STARTED"]
    assert never == "scheme=anchor"  # the third cell, queued behind the two that ran
    text = log.read_text()
    assert table_row(text, never)[2:] == ["NOT_STARTED", "-", "-", "-", "-", "never ran (the grid was interrupted)"]
    for label in CELLS - {never}:
        assert table_row(text, label)[2] == "INTERRUPTED" and table_row(text, label)[6].endswith("s")  # its wall time
    assert "interrupted: 0 finished, 0 failed, 2 interrupted, 1 never ran" in text
    # A log file: the sweep's lines carry the time; the running cells started, the third never did.
    events = [re.fullmatch(r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d \[mesh-sweep\] (.*)", line) for line in text.splitlines()]
    said = [match.group(1) for match in events if match]
    assert {e for e in said if " started " in e} == {"cell 1/3 started scheme=base", "cell 2/3 started scheme=mesh"}
    assert len([e for e in said if " INTERRUPTED " in e]) == 2
    # What to run next, also after Ctrl-C: the results, and the runs in the MLflow UI (the grouped view).
    # (the UI's command, "then open:" and the page each on a line of their own: copy-safe)
    *_, results, ui, then, page = text.rstrip().splitlines()
    assert results.startswith("results: ") and results.endswith("mesh-results schemes --runs-dir runs")  # its cwd's
    assert ui.startswith("MLflow:  ") and " ui --backend-store-uri " in ui and then.strip() == "then open:"
    assert "#/experiments/" in page and page.endswith(
        "/runs?workflowType=machine_learning&compareRunsMode=CHART&viewStateShareKey=mesh-grouped"
    )

    parents, cells = store(runs)
    assert len(parents) == 1 and parents[0].info.status == "KILLED"
    assert "2 interrupted, 1 never ran" in parents[0].data.tags["interrupted"]
    note = parents[0].data.tags["mlflow.note.content"]  # the same table, as the parent's description
    assert table_row(note, never)[2] == "NOT_STARTED" and "2 interrupted, 1 never ran" in note
    assert parents[0].data.tags["progress"] == "3/3: 2 interrupted, 1 not started"
    assert not [r for r in [*parents, *cells] if r.info.status == "RUNNING"]
    assert {f"scheme={r.data.params['scheme']}" for r in cells} == CELLS - {never}  # never started
    assert not [pid for pid in workers if Path(f"/proc/{pid}").exists()]  # no worker left behind


BAD_INPUTS = [
    (["launcher=parallel", "launcher.workers=0"], "launcher.workers=0 is invalid: must be an integer >= 1"),
    (["launcher=parallel", "launcher.workers=-3", "--dry-run"], "launcher.workers=-3 is invalid"),
    (["seeds=-1"], "seeds='-1' is invalid: seeds must be >= 1 or a list of seeds"),
    (["seeds=0"], "seeds='0' is invalid: seeds must be >= 1 or a list of seeds"),
    (["seeds=abc"], "seeds='abc' is invalid: seeds must be >= 1 or a list of seeds"),
    (["resources.cpus_per_task=0"], "resources.cpus_per_task=0 is invalid: must be >= 1"),
    (["data=indexed", "data.path=/no/pile_text_document"], "data.path='/no/pile_text_document' is invalid: "),
]


@pytest.mark.slow
def test_bad_launch_inputs_are_refused_in_one_line_before_anything_is_logged(tmp_path, cell):
    for number, (arguments, message) in enumerate(BAD_INPUTS):  # mesh-sweep's main in this process
        folder = tmp_path / str(number)
        folder.mkdir()
        command = ["schemes", "scheme=base,mesh", *cell(6), f"runs_dir={folder / 'runs'}"]
        done = run_tool("mesh-sweep", *command, *arguments, env=environment(), cwd=folder)
        out, err = done.stdout, done.stderr
        assert done.returncode == 2, (arguments, out, err)
        assert err.count("\n") == 1 and err.startswith(f"error: {message}"), (arguments, err)
        assert not (folder / "runs").exists() and not list(folder.rglob("mlflow.db")), arguments


@pytest.mark.slow
def test_rebuild_store_given_to_a_grid_reaches_its_parent_run_too(tmp_path, cell):
    """A damaged store with a grid's runs in it: tracking.rebuild_store=true on the next grid sets it
    aside once (the parent run opens the store before any cell) and the grid runs into a new store;
    a grid whose parent was in the old store gets a new parent, saying so."""
    runs_dir = tmp_path / "runs"
    db = runs_dir / "mlflow.db"

    def sweep(*arguments: str) -> Ran:
        """mesh-sweep's main in this process (the store is the point, not the process); afterwards
        its engine is let go, as a process that exits leaves the store: WAL checkpointed, no
        connection left open on a file the test damages or the next grid sets aside."""
        command = ["schemes", "launcher=local", *cell(4, 4), f"runs_dir={runs_dir}"]
        try:
            return run_tool("mesh-sweep", *command, *arguments, env=environment(), cwd=tmp_path)
        finally:
            forget_engine(f"sqlite:///{db.resolve()}")

    first = sweep("scheme=base")
    assert first.returncode == 0, first.stderr
    (old_parent,) = [f.read_text() for f in runs_dir.glob("schemes/sweeps/*/parent_run_id")]  # (store let go)
    db.write_bytes(db.read_bytes()[: db.stat().st_size // 2])
    damaged = db.read_bytes()

    rebuilt = sweep("scheme=base,mesh", "tracking.rebuild_store=true")
    assert rebuilt.returncode == 0, rebuilt.stderr
    (aside,) = [p for p in runs_dir.glob("mlflow.db.damaged-*") if not p.name.endswith(("-wal", "-shm"))]
    assert aside.read_bytes() == damaged
    (said,) = [line for line in rebuilt.stderr.splitlines() if "created anew" in line]
    assert said.startswith(f"[mesh] the MLflow store {db} cannot be opened (")
    assert said.endswith(f"; tracking.rebuild_store=true; moved to {aside.name}, created anew")
    ((parent,), (trained,)) = store(runs_dir)
    assert parent.info.status == "FINISHED" and trained.info.status == "FINISHED"
    assert parent.data.metrics["cells_skipped"] == 1 and parent.data.metrics["cells_finished"] == 1
    assert parent.data.metrics["cells_done"] == 2  # the grid's count, whichever invocation trained them
    assert trained.data.tags["scheme"] == "mesh"

    again = sweep("scheme=base")  # the first grid: its parent run was in the store set aside
    assert again.returncode == 0, again.stderr
    assert [line for line in again.stderr.splitlines() if "parent run" in line] == [
        f"[mesh-sweep] the grid's parent run {old_parent} is not in the store sqlite:///{db} "
        "(set aside or replaced): a new parent run takes its place"
    ]
    parents, _ = store(runs_dir)
    assert len(parents) == 2 and {p.info.status for p in parents} == {"FINISHED"}


def _finished_run(client, experiment_id, name: str, seed: int, config_hash: str, loss: float, end_time: int) -> str:
    tags = {"scheme": "base", "layout": "1+2R2+1", "preset": "tiny", "buffer_slots": "", "seed": str(seed)}
    run = client.create_run(experiment_id, tags={**tags, "config_hash": config_hash}, run_name=name)
    params = {"model": "tiny", "scheme": "base", "seed": seed, "data.corpus": "shakespeare"}
    metrics = {"val_loss": loss, "val/shakespeare/loss": loss, "val/shakespeare/ppl": math.exp(loss)}
    client.log_batch(
        run.info.run_id,
        metrics=[mlflow.entities.Metric(k, v, end_time - 10, 6) for k, v in metrics.items()],
        params=[mlflow.entities.Param(k, str(v)) for k, v in params.items()],
    )
    client.set_terminated(run.info.run_id, "FINISHED", end_time=end_time)
    return run.info.run_id


@pytest.mark.slow
def test_the_same_config_and_seed_trained_twice_is_one_replicate(tmp_path):
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    client = mlflow.MlflowClient(uri)
    experiment_id = client.create_experiment("dups", artifact_location=(tmp_path / "artifacts").as_uri())
    now = int(time.time() * 1000)
    # Seed 0 trained twice (two spellings of one config share the hash); the first one created ended last.
    latest = _finished_run(client, experiment_id, "seed0-again", 0, "aaaaaaaaaaaa", 7.40, now)
    earlier = _finished_run(client, experiment_id, "seed0-first", 0, "aaaaaaaaaaaa", 7.20, now - 60_000)
    _finished_run(client, experiment_id, "seed1", 1, "bbbbbbbbbbbb", 7.60, now)
    out = tmp_path / "out"
    result = run_tool("mesh-results", "dups", "--tracking-uri", uri, "--out", str(out), env=environment())
    assert result.returncode == 0, result.stderr
    (row,) = pd.read_csv(out / "table.csv").to_dict("records")
    assert row["n_runs"] == 2 and str(row["seeds"]) == "0 1"
    assert "7.5000 ± 0.1414 (n=2)" in (out / "table.md").read_text()  # 7.40 (the latest of seed 0) and 7.60
    report = (out / "report.md").read_text()
    assert "**Duplicates left out** (1)" in report
    assert "`seed0-first` (kept `seed0-again`, row `base 1+2R2+1`, seed 0, config_hash `aaaaaaaaaaaa`)" in report
    runs = pd.read_csv(out / "runs.csv", keep_default_na=False)
    assert runs.set_index("run_id").loc[earlier, "duplicate_of"] == latest


@pytest.mark.slow
def test_kill_9_of_the_sweep_takes_its_workers_with_it_without_a_traceback(tmp_path, cell):
    """The kernel signals each worker when the sweep dies (prctl PR_SET_PDEATHSIG on Linux): its cell
    stops as on SIGTERM, checkpoint saved and run KILLED, instead of training on as an orphan."""
    runs = tmp_path / "runs"
    args = ["schemes", "scheme=base,mesh", "launcher=parallel", "launcher.workers=2"]
    process, log = start_sweep([*args, *cell(2000, checkpoint_every=10), f"runs_dir={runs}"], tmp_path)
    both = lambda: checkpointed(runs, "base") and checkpointed(runs, "mesh")  # noqa: E731
    wait_for(both, 600, process, "both cells to train 10 steps")
    workers = cell_workers(process.pid)
    assert len(workers) == 2
    os.kill(process.pid, signal.SIGKILL)
    process.wait(timeout=60)
    deadline = time.monotonic() + 120  # each saves its checkpoint and closes its run first
    while [pid for pid in workers if Path(f"/proc/{pid}").exists()] and time.monotonic() < deadline:
        time.sleep(0.5)
    assert not [pid for pid in workers if Path(f"/proc/{pid}").exists()]  # none left training as an orphan
    assert "Traceback" not in (tmp_path / "sweep.err").read_text()
    _, cells = store(runs)
    assert len(cells) == 2
    for run in cells:  # each stopped as on SIGTERM: a re-run resumes it from its checkpoint
        assert run.info.status == "KILLED" and run.data.tags["terminated"].startswith("SIGTERM at step ")
        assert (Path(run.data.tags["run_dir"]) / "checkpoints" / "last.ckpt").exists()


def test_seeds_auto_takes_no_decision_on_a_cell_another_process_still_trains(tmp_path):
    """A run still RUNNING (a worker of a grid that died trains it) is no settled cell: seeds=auto
    names it instead of deciding on the runs that happen to be finished."""
    from results.commands.seeds_auto import unsettled

    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    client = mlflow.MlflowClient(uri)
    experiment = client.create_experiment("auto")
    for config_hash, statuses in {"a": ["FINISHED"], "b": ["RUNNING"], "c": ["RUNNING", "FINISHED"]}.items():
        for status in statuses:
            run = client.create_run(experiment, tags={"config_hash": config_hash, "seed": "0", "scheme": "base"})
            if status != "RUNNING":
                client.set_terminated(run.info.run_id, status)
    assert unsettled(["a", "b", "c", "d"], uri, "auto") == ["b"]
    assert unsettled(["a", "c"], uri, "auto") == []


def test_a_cell_whose_run_another_live_process_holds_is_one_line_and_not_failed(tmp_path, grid_cell_overrides, capfd):
    """What a re-run meets while a worker of the grid that died still holds a cell's run folder: the
    cell says so in one line and stays INTERRUPTED (re-run to resume), not FAILED with a traceback."""
    from experiments.compose import compose_config
    from experiments.plan import plan_run
    from sweeps.cells import INTERRUPTED, Cell, run_cell

    overrides = grid_cell_overrides("probes.enabled=false", f"runs_dir={tmp_path / 'runs'}")
    run_dir = plan_run(compose_config(overrides)).run_dir
    holder = subprocess.Popen(
        [sys.executable, "-c", f"from experiments.locks import RunLock; import sys, time\n"
         f"with RunLock(__import__('pathlib').Path({str(run_dir)!r})):\n print('held', flush=True); time.sleep(600)"],
        stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        assert holder.stdout.readline().strip() == "held"
        outcome = run_cell(Cell(0, overrides, "scheme=base"))
    finally:
        holder.kill()
        holder.wait()
    err = capfd.readouterr().err
    assert outcome.status == INTERRUPTED and f"is in use by PID {holder.pid}" in outcome.error
    said = [line for line in err.splitlines() if "in use by PID" in line]
    assert said == [f"[mesh-sweep] {outcome.error}"] and "Traceback" not in err
