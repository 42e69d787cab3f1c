"""A small process pool for the local launchers.

Not concurrent.futures.ProcessPoolExecutor: when one of its workers dies (SIGKILL, the OOM
killer) the whole pool is "broken", every pending future fails and the surviving workers are
terminated in the middle of their runs. Here each worker process trains one cell at a time,
sent through its own pipe, and sends the CellOutcome back; a worker that ends while it holds a
cell failed that cell alone, and a new worker takes the cells still queued. A worker runs cell
after cell, so its imports (torch, Lightning, MLflow: seconds each time) are paid once.
"""

from __future__ import annotations

import ctypes
import multiprocessing
import multiprocessing.connection
import os
import signal
import sys
import threading
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

from sweeps.cells import INTERRUPTED, Cell, CellOutcome, run_cell_reporting_stops
from sweeps.launch.base import OnStart, no_start

# After Ctrl-C: how long the cells get to stop on their own (they got the terminal's SIGINT
# too), then after SIGINT, SIGTERM and SIGKILL sent by us. A second Ctrl-C kills them at once.
STOP_GRACE_S = (10.0, 10.0, 10.0, 5.0)
EXIT_AFTER_OUTCOME_S = 60.0  # a worker told to exit that does not is killed
PR_SET_PDEATHSIG = 1  # linux/prctl.h
PARENT_CHECK_S = 1.0  # where the kernel cannot signal a parent's death: how often a worker checks


@dataclass
class _Worker:
    process: Any  # multiprocessing's SpawnProcess
    pipe: Any  # the parent's end of a duplex pipe
    cell: Cell | None = None  # the cell it trains now
    outcome: CellOutcome | None = None  # what it sent back for ``cell``
    closed: bool = False  # the pipe reached EOF
    told_to_exit_at: float | None = None


def _worker_process(pipe: Any, threads: int | None, sweep_pid: int) -> None:
    """The body of a worker process: train each cell it is sent, send back what became of it;
    stop at None, after a cell that was stopped (Ctrl-C, SIGTERM), or when the sweep is gone."""
    stop_with_parent(sweep_pid)
    try:
        while (cell := pipe.recv()) is not None:
            outcome = run_cell_reporting_stops(cell, threads)
            pipe.send(outcome)
            if outcome.status == INTERRUPTED:
                break
    except (EOFError, OSError):  # the sweep died: nobody to tell, nothing to say
        return
    pipe.close()


def stop_with_parent(parent_pid: int) -> None:
    """SIGTERM this process when ``parent_pid`` (the sweep) dies, even by ``kill -9``: its cell then
    stops as on any SIGTERM (checkpoint saved, run KILLED, resumed by a re-run). Linux: the kernel
    sends it (``prctl(PR_SET_PDEATHSIG)``); elsewhere a thread checks every second that the parent
    is still this process's parent. A parent already gone (before this ran) is SIGTERM at once."""
    if not _parent_death_signal(signal.SIGTERM):
        threading.Thread(target=_watch_parent, args=(parent_pid,), daemon=True, name="parent-watch").start()
    if os.getppid() != parent_pid:
        os.kill(os.getpid(), signal.SIGTERM)


def _parent_death_signal(signum: int) -> bool:
    if not sys.platform.startswith("linux"):
        return False
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        return libc.prctl(PR_SET_PDEATHSIG, int(signum), 0, 0, 0) == 0
    except (OSError, AttributeError):
        return False


def _watch_parent(parent_pid: int) -> None:
    while os.getppid() == parent_pid:
        time.sleep(PARENT_CHECK_S)
    os.kill(os.getpid(), signal.SIGTERM)


def _start(context: Any, number: int, threads: int | None) -> _Worker:
    parent, child = context.Pipe(duplex=True)
    process = context.Process(target=_worker_process, args=(child, threads, os.getpid()), name=f"mesh-worker-{number}")
    process.start()
    child.close()  # the worker holds the only other end: its death is EOF here
    return _Worker(process, parent)


def _assign(worker: _Worker, cell: Cell | None, on_start: OnStart = no_start) -> None:
    """Give ``worker`` its next cell, or None: exit."""
    worker.cell, worker.outcome = cell, None
    if cell is None:
        worker.told_to_exit_at = time.monotonic()
    try:
        worker.pipe.send(cell)
    except (BrokenPipeError, OSError):  # it died: _wait finds it exited
        worker.closed = True
    if cell is not None:
        on_start(cell)


def _receive(worker: _Worker) -> None:
    """Read the worker's outcome if it is there (never blocks)."""
    while not worker.closed and worker.outcome is None:
        try:
            if not worker.pipe.poll():
                return
            worker.outcome = worker.pipe.recv()
        except (EOFError, OSError):
            worker.closed = True


def _wait(workers: Sequence[_Worker], timeout: float | None) -> list[_Worker]:
    """Wait until a worker sends an outcome or its process exits (or ``timeout``); read outcomes.
    Returns the workers whose process has exited, joined."""
    waitables = [w.process.sentinel for w in workers]
    waitables += [w.pipe for w in workers if not w.closed]
    multiprocessing.connection.wait(waitables, timeout)
    for worker in workers:
        _receive(worker)
    exited = [w for w in workers if w.process.exitcode is not None]
    for worker in exited:
        worker.process.join()
        _receive(worker)  # sent just before exiting
        worker.pipe.close()
        worker.closed = True
    return exited


def _kill_lingering(workers: Sequence[_Worker]) -> None:
    """Kill the workers told to exit more than :data:`EXIT_AFTER_OUTCOME_S` ago that have not."""
    for worker in workers:
        if worker.told_to_exit_at is not None and time.monotonic() - worker.told_to_exit_at > EXIT_AFTER_OUTCOME_S:
            worker.process.kill()


def death_note(exitcode: int) -> str:
    """What became of a worker process (or a job's) that ended with ``exitcode``."""
    if exitcode < 0:
        return f"worker died (signal {-exitcode})"
    return f"worker exited with code {exitcode}"


def run_in_processes(
    cells: Sequence[Cell], workers: int, threads: int | None, on_start: OnStart = no_start
) -> Iterator[CellOutcome]:
    """Run the cells in at most ``workers`` spawned worker processes, one cell at a time each, in
    grid order (``on_start(cell)`` as each is sent to its worker); yield each outcome as it
    arrives. A worker that dies fails its own cell and is
    replaced while cells are queued. On Ctrl-C (raised while waiting here, or thrown in at a
    yield), no further cell starts, the running ones are stopped (:data:`STOP_GRACE_S`) and
    reported, then KeyboardInterrupt is raised again."""
    context = multiprocessing.get_context("spawn")
    queue = list(cells)
    pool: list[_Worker] = []
    started = 0
    try:
        while queue or any(w.cell is not None for w in pool):
            for worker in pool:  # idle workers take the next cell
                if worker.cell is None and worker.told_to_exit_at is None and not worker.closed:
                    _assign(worker, queue.pop(0) if queue else None, on_start)
            while queue and len(pool) < workers:
                pool.append(_start(context, started, threads))
                started += 1
                _assign(pool[-1], queue.pop(0), on_start)
            lingering = [w for w in pool if w.told_to_exit_at is not None]
            _kill_lingering(lingering)
            exited = _wait(pool, 5.0 if lingering else None)
            for worker in pool:
                if worker.cell is not None and worker.outcome is not None:
                    outcome, worker.cell = worker.outcome, None
                    if outcome.status == INTERRUPTED:  # it stops after a stopped cell
                        worker.told_to_exit_at = time.monotonic()
                    yield outcome
            for worker in exited:
                pool.remove(worker)
                if worker.cell is not None:  # died holding a cell
                    yield CellOutcome.failed(worker.cell, death_note(worker.process.exitcode))
        for worker in pool:
            if worker.told_to_exit_at is None:
                _assign(worker, None)
        while pool:
            for worker in _wait(pool, EXIT_AFTER_OUTCOME_S):
                pool.remove(worker)
            _kill_lingering(pool)
    except KeyboardInterrupt:
        yield from _stop([w for w in pool if w.cell is not None], pool)
        raise
    finally:
        for worker in pool:  # closed without being drained (an error, or close()): leave no orphan
            if worker.process.is_alive():
                worker.process.kill()
                worker.process.join()


def _stop(running: list[_Worker], pool: list[_Worker]) -> Iterator[CellOutcome]:
    """Stop the workers after Ctrl-C and report each running cell: what its worker sent (FINISHED
    if it got there, INTERRUPTED if it stopped on the signal) or INTERRUPTED."""
    steps = zip((None, signal.SIGINT, signal.SIGTERM, signal.SIGKILL), STOP_GRACE_S, strict=True)
    if running:
        print(
            f"[mesh-sweep] Ctrl-C: stopping {len(running)} running cell(s), starting no more (Ctrl-C again kills them)",
            file=sys.stderr,
            flush=True,
        )
    for worker in pool:  # idle ones exit at once; busy ones after their cell
        if worker.cell is None:
            _assign(worker, None)
    try:
        for sent, grace in steps:
            alive = [w for w in pool if w.process.exitcode is None]
            if not alive:
                break
            for worker in alive:
                if sent is not None:
                    os.kill(worker.process.pid, sent)
            deadline = time.monotonic() + grace
            while any(w.process.exitcode is None for w in alive) and time.monotonic() < deadline:
                _wait([w for w in alive if w.process.exitcode is None], max(0.0, deadline - time.monotonic()))
    except KeyboardInterrupt:  # a second Ctrl-C: no more waiting
        for worker in pool:
            if worker.process.exitcode is None:
                worker.process.kill()
    for worker in pool:
        worker.process.join()
        _wait([worker], 0)
    for worker in running:
        if worker.outcome is not None:
            yield worker.outcome
        else:
            yield CellOutcome.interrupted(worker.cell, f"interrupted ({death_note(worker.process.exitcode)})")
    pool.clear()
