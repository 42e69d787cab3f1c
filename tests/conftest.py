"""Shared fixtures: the tiny-run overrides, a compose helper, and one trained tiny run per session.

Under pytest-xdist every worker is its own session: it trains its own ``tiny_run`` in its own
temporary folder, so workers never share a store. What tests only read, and what takes long to
make, is made once for all workers by ``shared_once``.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import mlflow
import pytest
import torch
from filelock import FileLock
from helpers import server_environment
from omegaconf import DictConfig
from suite_clock import SuiteClock, add_option

from experiments.compose import compose_config

# A run small enough for a test: the tiny preset on short windows, validated and checkpointed often;
# its probes read 64-token samples (the default's 512 rows are for CKA that can be read) and log their
# numbers without drawing figures (3 of a grid cell's 14 CPU-seconds; the tests of figures ask for them).
TINY_RUN = (
    "model=tiny",
    "max_steps=30",
    "val_every=10",
    "log_every=5",
    "checkpoint_every=10",
    "data.seq_len=64",
    "data.batch_size=8",
    "data.val_batches=2",
    "probes.seq_len=64",
    "probes.figures=false",
)
FULL_PROBES = ("probes.seq_len=null", "probes.figures=true")  # a run whose probes are the defaults
# The cells of a test grid (sweeps, results, the main job) are smaller still, as a grid trains many:
# 6 steps on 32-token windows, one validation batch.
GRID_CELL = (
    "max_steps=6",
    "val_every=3",
    "log_every=2",
    "checkpoint_every=3",
    "data.seq_len=32",
    "data.batch_size=4",
    "data.val_batches=1",
)

if os.environ.get("PYTEST_XDIST_WORKER"):
    # One thread per worker, and per process a worker starts (mesh-train, mesh-sweep and the grids'
    # workers read OMP_NUM_THREADS): -n 2 on 2 cores does not oversubscribe them. Two 2-thread
    # tiny runs side by side on 2 cores took 4x the step time and 1.8x the CPU time of 1-thread ones.
    torch.set_num_threads(1)
    os.environ["OMP_NUM_THREADS"] = "1"


def pytest_addoption(parser: pytest.Parser) -> None:
    add_option(parser)


def pytest_configure(config: pytest.Config) -> None:
    config.pluginmanager.register(SuiteClock(config), "suite_clock")


# Run first: the longest tests, so that the workers end together. pytest-xdist hands each worker a
# run of consecutive tests and never takes one back; the SLURM file (10 minutes of one worker) came
# late in the order, and its worker was still on it at the end while the other had been idle for
# 5.7 of the suite's 22.6 minutes (suite clock, a fresh clone on a quiet machine: busy 98% and 75%).
RUN_FIRST = ("test_slurm_cluster.py",)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    first = [item for item in items if item.path.name in RUN_FIRST]
    if first:
        items[:] = first + [item for item in items if item.path.name not in RUN_FIRST]


def override_key(override: str) -> str:
    return override.split("=", 1)[0].lstrip("+~")


def with_overrides(base: Sequence[str], *changes: str) -> list[str]:
    """``base`` with ``changes`` appended; a key given again replaces its entry in ``base``."""
    changed = {override_key(c) for c in changes}
    return [*(o for o in base if override_key(o) not in changed), *changes]


@pytest.fixture(autouse=True)
def _deterministic():
    torch.manual_seed(0)
    yield


@pytest.fixture(scope="session", autouse=True)
def _ctrl_c_delivered_as_in_a_terminal():
    """Tests send SIGINT to the commands they start and expect what a terminal's Ctrl-C does. A
    shell starts a background job (``.ci/run &``, ``nohup``) with SIGINT ignored, and an ignored
    signal stays ignored in every process started below it; Python's own handler does not. So the
    suite takes Python's default handler back for its session."""
    if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
        signal.signal(signal.SIGINT, signal.default_int_handler)
    yield


@pytest.fixture(autouse=True)
def _signal_handlers_left_as_found():
    """A test that leaves SIGINT or SIGTERM handled differently fails, and the handlers are put back:
    subprocesses started by later tests inherit an ignored signal, so a changed handler would make
    the Ctrl-C and SIGTERM tests that run after it fail far from the cause."""
    watched = (signal.SIGINT, signal.SIGTERM)
    before = {sig: signal.getsignal(sig) for sig in watched}
    yield
    changed = {sig: signal.getsignal(sig) for sig in watched if signal.getsignal(sig) is not before[sig]}
    for sig in changed:
        signal.signal(sig, before[sig])
    assert not changed, (
        f"the test left signal handlers changed: { {signal.Signals(s).name: h for s, h in changed.items()} }"
    )


# What a run, a grid or a report may set in the process for its own time and must take back: a value
# left behind sends the runs of the tests that come after it on the same worker somewhere else.
WATCHED_ENVIRONMENT = ("MLFLOW_TRACKING_URI", "MLFLOW_EXPERIMENT_NAME", "MLFLOW_RUN_ID", "MESH_LOG_LEVEL")


@pytest.fixture(autouse=True)
def _environment_left_as_found():
    """A test that leaves the working directory, MLflow's tracking URI (its variable or its module
    state) or another watched variable changed fails, and they are put back: with xdist the order
    of tests on a worker is not fixed, so a leak would fail some later test far from the cause."""
    from mlflow.tracking._tracking_service import utils

    folder, uri = Path.cwd(), utils._tracking_uri
    before = {key: os.environ.get(key) for key in WATCHED_ENVIRONMENT}
    yield
    changed = [f"{k}={os.environ.get(k)!r} (was {v!r})" for k, v in before.items() if os.environ.get(k) != v]
    for key, value in before.items():
        if value is None:
            os.environ.pop(key, None)
        else:
            os.environ[key] = value
    if utils._tracking_uri != uri:
        changed.append(f"mlflow.set_tracking_uri({utils._tracking_uri!r}) (was {uri!r})")
        mlflow.set_tracking_uri(uri)
    if Path.cwd() != folder:
        changed.append(f"cwd {Path.cwd()} (was {folder})")
        os.chdir(folder)
    assert not changed, f"the test left the process changed: {'; '.join(changed)}"


@pytest.fixture(scope="session")
def shared_once(tmp_path_factory) -> Callable[[str, Callable[[Path], None]], Path]:
    """``shared_once(name, build)``: a folder ``build(folder)`` filled once per test session, by the
    first pytest-xdist worker that asks (the others wait on a file lock, then reuse it). For what
    tests only read: a folder whose build failed is built again by the next worker that asks."""
    root = tmp_path_factory.getbasetemp()
    if os.environ.get("PYTEST_XDIST_WORKER"):  # every worker's base folder is in the session's
        root = root.parent

    def shared(name: str, build: Callable[[Path], None]) -> Path:
        folder = root / f"shared-{name}"
        with FileLock(f"{folder}.lock"):
            if not (folder / ".built").is_file():
                shutil.rmtree(folder, ignore_errors=True)
                folder.mkdir()
                build(folder)
                (folder / ".built").touch()
        return folder

    return shared


@pytest.fixture(scope="session")
def tiny_overrides() -> Callable[..., list[str]]:
    """``tiny_overrides(*changes)``: the overrides of a tiny run (``TINY_RUN``) with ``changes`` applied."""
    return lambda *changes: with_overrides(TINY_RUN, *changes)


@pytest.fixture(scope="session")
def grid_cell_overrides() -> Callable[..., list[str]]:
    """``grid_cell_overrides(*changes)``: a test grid's cell (``TINY_RUN`` made ``GRID_CELL``-small) with
    ``changes`` applied."""
    return lambda *changes: with_overrides(TINY_RUN, *GRID_CELL, *changes)


@pytest.fixture(scope="session")
def compose_run(tiny_overrides) -> Callable[..., DictConfig]:
    """``compose_run(*overrides)``: the composed config of a tiny run with ``overrides`` applied."""
    return lambda *overrides: compose_config(tiny_overrides(*overrides))


@dataclass(frozen=True)
class TinyRun:
    """A finished tiny run: where it lives, its MLflow run and what ``train()`` returned."""

    runs_dir: Path
    run_dir: Path
    run_id: str
    tracking_uri: str
    client: mlflow.MlflowClient
    result: dict[str, Any]
    steps: int


@pytest.fixture(scope="session")
def tiny_run(tmp_path_factory, compose_run) -> TinyRun:
    """A tiny MeSH run of 10 steps, validated at 5 and 10, probed at the end with the probes' defaults
    (512-token samples, figures drawn: what the probe tests read), in its own sqlite store.

    Tests that write into it (evaluation, mesh-probe --mlflow-run) add new keys or check what
    their own call added, so the order in which tests use it does not matter.
    """
    from experiments.train import train

    steps = 10
    runs_dir = tmp_path_factory.mktemp("tiny_run")
    cfg = compose_run(*FULL_PROBES, f"max_steps={steps}", "val_every=5", "scheme=mesh", f"runs_dir={runs_dir}")
    result = train(cfg)
    uri = f"sqlite:///{runs_dir / 'mlflow.db'}"
    return TinyRun(
        runs_dir=runs_dir,
        run_dir=Path(result["run_dir"]),
        run_id=result["run_id"],
        tracking_uri=uri,
        client=mlflow.MlflowClient(uri),
        result=result,
        steps=steps,
    )


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="session")
def mlflow_server(tmp_path_factory) -> Iterator[str]:
    """The URI of a real ``mlflow server`` on 127.0.0.1 (sqlite backend, proxied artifacts), started
    once per session (per xdist worker); tests that log to it use an experiment of their own."""
    root = tmp_path_factory.mktemp("mlflow_server")
    server = subprocess.Popen(
        [
            str(Path(sys.executable).parent / "mlflow"),
            "server",
            "--host",
            "127.0.0.1",
            "--port",
            str(port := free_port()),
        ]
        + ["--workers", "1", "--backend-store-uri", f"sqlite:///{root / 'server.db'}"]
        + ["--artifacts-destination", str(root / "server-artifacts")],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
        cwd=root,
        env=server_environment(),
    )
    uri = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 300  # a server that exits fails at once; this only stops one that hangs
    while True:
        try:
            with urllib.request.urlopen(f"{uri}/health", timeout=1) as response:
                if response.status == 200:
                    break
        except OSError:
            pass
        if server.poll() is not None or time.monotonic() > deadline:
            os.killpg(server.pid, signal.SIGKILL)
            pytest.fail("mlflow server did not answer within 300 s")
        time.sleep(0.5)
    yield uri
    os.killpg(server.pid, signal.SIGTERM)
    server.wait(timeout=30)
