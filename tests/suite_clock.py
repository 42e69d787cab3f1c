"""The suite's own clock, printed after every run: where its wall time and CPU went.

Each test is timed in the process that runs it: wall seconds, and CPU seconds of that process and
of the processes it started and reaped (``os.times``: a ``mesh-train`` run in a subprocess counts,
a SLURM job started by slurmd does not). Under pytest-xdist a worker hands its figures to the
controller as it ends (``workeroutput``), and the controller prints one summary: the session's
wall time, how busy each worker was with its tests (the rest is its start and collection, or
waiting for the others to finish), the CPU split between the workers and what they started, and
the tests that cost most. A test's figures include the set-up and tear-down of the module- and
session-scoped fixtures it was the first or last to use. ``--suite-clock-json PATH`` also writes
every test's figures, for a closer look.
"""

from __future__ import annotations

import json
import os
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import pytest

KEY = "suite_clock"
SHOWN = 10  # the tests listed by CPU


@dataclass(frozen=True)
class TimedTest:
    nodeid: str
    wall_s: float
    cpu_s: float  # the test process's own
    started_cpu_s: float  # the processes it started and reaped

    @property
    def total_cpu_s(self) -> float:
        return self.cpu_s + self.started_cpu_s


@dataclass
class WorkerClock:
    name: str
    tests: list[TimedTest] = field(default_factory=list)

    @property
    def busy_s(self) -> float:
        return sum(t.wall_s for t in self.tests)

    @classmethod
    def from_json(cls, text: str) -> WorkerClock:
        data = json.loads(text)
        return cls(data["name"], [TimedTest(**t) for t in data["tests"]])


def machine_cpu_seconds() -> tuple[float, float] | None:
    """(busy, idle) CPU seconds of the whole machine since boot, all cores (``/proc/stat``; None
    elsewhere): what the session's processes, SLURM's jobs and anything else used, against what
    the cores left unused."""
    try:
        fields = Path("/proc/stat").read_text().splitlines()[0].split()
    except OSError:
        return None
    ticks = [int(x) for x in fields[1:8]]  # user nice system idle iowait irq softirq (not steal: other guests')
    hertz = os.sysconf("SC_CLK_TCK")
    idle = ticks[3] + ticks[4]
    return (sum(ticks) - idle) / hertz, idle / hertz


def cpu_seconds() -> tuple[float, float]:
    """(this process's CPU seconds, its reaped children's)."""
    now = os.times()
    return now.user + now.system, now.children_user + now.children_system


class SuiteClock:
    """Registered by ``tests/conftest.py``; one per process (controller or worker)."""

    def __init__(self, config: pytest.Config) -> None:
        self.config = config
        self.own = WorkerClock(os.environ.get("PYTEST_XDIST_WORKER", "main"))
        self.workers: dict[str, WorkerClock] = {}  # by name: xdist may report a worker down twice
        self.lost: list[str] = []  # workers that went down without their figures
        self.started = time.monotonic()
        self.machine_at_start = machine_cpu_seconds()

    @pytest.hookimpl(hookwrapper=True)
    def pytest_runtest_protocol(self, item: pytest.Item, nextitem: pytest.Item | None):
        wall, (own, children) = time.monotonic(), cpu_seconds()
        yield
        own_after, children_after = cpu_seconds()
        self.own.tests.append(
            TimedTest(item.nodeid, time.monotonic() - wall, own_after - own, children_after - children)
        )

    def pytest_sessionfinish(self, session: pytest.Session) -> None:
        output = getattr(self.config, "workeroutput", None)
        if output is not None:  # an xdist worker: xdist sends workeroutput once this hook has run
            output[KEY] = json.dumps(asdict(self.own))

    @pytest.hookimpl(optionalhook=True)
    def pytest_testnodedown(self, node: Any, error: Any) -> None:
        sent = getattr(node, "workeroutput", {}).get(KEY)
        if sent is not None:
            worker = WorkerClock.from_json(sent)
            self.workers[worker.name] = worker
        elif error is not None:
            self.lost.append(f"{node.gateway.id} went down ({error}): its tests are not counted")

    def pytest_terminal_summary(self, terminalreporter: Any) -> None:
        if hasattr(self.config, "workerinput"):
            return
        workers = sorted(self.workers.values(), key=_worker_order) or [self.own]
        tests = [t for w in workers for t in w.tests]
        if not tests:
            return
        for line in self.lost:
            terminalreporter.write_line(f"suite clock: {line}")
        machine, now = None, machine_cpu_seconds()
        if self.machine_at_start is not None and now is not None:
            machine = (now[0] - self.machine_at_start[0], now[1] - self.machine_at_start[1])
        for line in summary(workers, time.monotonic() - self.started, machine):
            terminalreporter.write_line(line)
        path = self.config.getoption("suite_clock_json")
        if path:
            Path(path).write_text(json.dumps([asdict(w) for w in workers], indent=1) + "\n")


def _worker_order(worker: WorkerClock) -> tuple[int, str]:
    """gw2 before gw10."""
    number = worker.name.removeprefix("gw")
    return (int(number), "") if number.isdigit() else (-1, worker.name)


def summary(workers: list[WorkerClock], wall_s: float, machine: tuple[float, float] | None = None) -> list[str]:
    """The printed lines: wall time and each worker's busy share, the CPU split, the machine's busy
    share of its cores over the session (``machine``: busy and idle CPU seconds), the costliest tests."""
    tests = [t for w in workers for t in w.tests]
    busy = ", ".join(f"{w.name} busy {w.busy_s:.0f} s ({w.busy_s / max(wall_s, 1e-9):.0%})" for w in workers)
    own = sum(t.cpu_s for t in tests)
    started = sum(t.started_cpu_s for t in tests)
    lines = [
        "",
        f"suite clock: {len(tests)} tests in {wall_s:.0f} s on {len(workers)} worker(s): {busy}",
        f"  CPU {own + started:.0f} s: {own:.0f} s in the test processes, {started:.0f} s in the processes "
        "they started and reaped (SLURM jobs, started by slurmd, are not counted)",
    ]
    if machine is not None and sum(machine) > 0:
        busy_s, idle_s = machine
        lines.append(
            f"  the machine's cores: {busy_s:.0f} s busy, {idle_s:.0f} s idle ({busy_s / (busy_s + idle_s):.0%} busy; "
            "everything that ran, SLURM jobs and other work included)"
        )
    lines.append(f"  the {SHOWN} tests that used most CPU (their own + their processes'):")
    for test in sorted(tests, key=lambda t: t.total_cpu_s, reverse=True)[:SHOWN]:
        lines.append(
            f"  {test.total_cpu_s:7.1f} s CPU ({test.started_cpu_s:5.1f} in processes) {test.wall_s:7.1f} s wall"
            f"  {test.nodeid}"
        )
    return lines


def add_option(parser: pytest.Parser) -> None:
    parser.addoption(
        "--suite-clock-json",
        default=None,
        metavar="PATH",
        help="write every test's wall and CPU seconds, by worker, to PATH (tests/suite_clock.py)",
    )
