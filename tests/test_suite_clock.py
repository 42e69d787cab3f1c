"""The suite clock (tests/suite_clock.py): a worker's figures survive the trip to the controller
in a real two-worker session, the summary adds them up as printed, and the machine's share is
read from /proc/stat."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from dataclasses import asdict
from pathlib import Path

import pytest
from suite_clock import TimedTest, WorkerClock, machine_cpu_seconds, summary


def test_a_workers_figures_round_trip_and_the_summary_adds_them_up():
    gw0 = WorkerClock("gw0", [TimedTest("a.py::slow", 30.0, 2.0, 20.0), TimedTest("a.py::fast", 10.0, 9.0, 0.0)])
    gw1 = WorkerClock("gw1", [TimedTest("b.py::server", 20.0, 0.5, 0.0)])
    assert WorkerClock.from_json(json.dumps(asdict(gw0))) == gw0
    lines = summary([gw0, gw1], wall_s=50.0, machine=(75.0, 25.0))
    assert lines[1] == "suite clock: 3 tests in 50 s on 2 worker(s): gw0 busy 40 s (80%), gw1 busy 20 s (40%)"
    assert lines[2].startswith("  CPU 32 s: 12 s in the test processes, 20 s in the processes they started")
    assert lines[3].startswith("  the machine's cores: 75 s busy, 25 s idle (75% busy;")
    listed = [line.split()[-1] for line in lines[5:]]
    assert listed == ["a.py::slow", "a.py::fast", "b.py::server"]  # by CPU, own and started together
    assert lines[5].split("s CPU")[0].strip() == "22.0"
    assert not any("machine" in line for line in summary([gw0], wall_s=50.0))  # no /proc/stat: no line


def test_the_machines_seconds_grow_by_the_wall_time_on_every_core():
    if machine_cpu_seconds() is None:
        pytest.skip("no /proc/stat: the machine's share is not printed here either")
    before, start = machine_cpu_seconds(), time.monotonic()
    while time.monotonic() - start < 1.0:
        pass
    after, wall = machine_cpu_seconds(), time.monotonic() - start
    assert before is not None and after is not None
    grown = (after[0] - before[0]) + (after[1] - before[1])
    cores = os.cpu_count() or 1
    slack = 0.02 * cores + 0.02  # a tick or two per core (10 ms ticks)
    assert 0.9 * wall * cores - slack <= grown <= 1.05 * wall * cores + slack  # busy + idle = the cores' time
    assert after[0] - before[0] >= 0.5 * wall  # this loop alone kept a core busy most of the time


CONFTEST = f"""
import sys
sys.path.insert(0, {str(Path(__file__).parent)!r})
from suite_clock import SuiteClock, add_option

def pytest_addoption(parser):
    add_option(parser)

def pytest_configure(config):
    config.pluginmanager.register(SuiteClock(config), "suite_clock")
"""


def test_two_xdist_workers_hand_their_figures_to_the_controller_which_prints_and_writes_them(tmp_path):
    """The real hooks in a real pytest session of two workers (the controller hears from each)."""
    (tmp_path / "conftest.py").write_text(CONFTEST)
    (tmp_path / "test_a.py").write_text(
        "import subprocess, sys, time\n"
        "def test_started():\n"
        "    subprocess.run([sys.executable, '-c', 'sum(range(3_000_000))'], check=True)\n"
        "def test_waits():\n"
        "    time.sleep(0.3)\n"
    )
    written = tmp_path / "clock.json"
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-n", "2", "--suite-clock-json", str(written)],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    workers = json.loads(written.read_text())
    assert [w["name"] for w in workers] == ["gw0", "gw1"]
    tests = {t["nodeid"]: t for w in workers for t in w["tests"]}
    assert set(tests) == {"test_a.py::test_started", "test_a.py::test_waits"}  # each once
    assert tests["test_a.py::test_started"]["started_cpu_s"] > 0  # the reaped child's CPU
    assert tests["test_a.py::test_waits"]["wall_s"] >= 0.3 > tests["test_a.py::test_waits"]["cpu_s"]
    (line,) = [line for line in done.stdout.splitlines() if line.startswith("suite clock: ")]
    assert line.startswith("suite clock: 2 tests in ") and "gw0 busy" in line and "gw1 busy" in line
