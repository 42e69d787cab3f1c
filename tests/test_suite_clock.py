"""The suite clock (tests/suite_clock.py): a worker's figures survive the trip to the controller,
the summary adds them up as printed, and the machine's share is read from /proc/stat."""

from __future__ import annotations

import json
import os
import time
from dataclasses import asdict

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
    before, start = machine_cpu_seconds(), time.monotonic()
    while time.monotonic() - start < 0.5:
        pass
    after, wall = machine_cpu_seconds(), time.monotonic() - start
    assert before is not None and after is not None
    grown = (after[0] - before[0]) + (after[1] - before[1])
    cores = os.cpu_count() or 1
    assert grown <= wall * cores + 0.05  # busy and idle together are the cores' time (ticks of 10 ms)
    assert after[0] - before[0] >= 0.4  # this loop alone kept one core busy
