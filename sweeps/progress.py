"""What a grid prints while it runs and when it ends.

* A line when a cell starts and when it ends, numbered ``cell i/N`` (1-based, of the whole grid)
  and labelled with its coordinates; an end line adds the status, steps/s, val PPL, wall time and
  the grid's ETA: the running cells' remaining time and the queued cells packed onto the slots
  that free up, from the mean wall time of the cells finished in this invocation (``ETA ?``
  until one finished). The wall time is the
  run's own (``train()`` entry to end, as in its ``result.json``), else the time from the cell's
  start line to its end line, which is also what the ETA averages. Cells finished by an earlier
  invocation are listed once, as SKIPPED, before anything starts::

      [mesh-sweep] cell 3/4 started scheme=mesh seed=0
      [mesh-sweep] cell 3/4 FINISHED scheme=mesh seed=0 · 12.3 steps/s · val PPL 1240.51 · wall 18s · ETA 36s

* When the output is not a terminal (a SLURM log, ``nohup``), every ``[mesh-sweep]`` line starts
  with the time (``2026-12-01 14:03:22``).
* At the end, the summary table (Markdown: the same text is the parent run's description) and
  what to run next: ``mesh-results`` for this store and experiment, and the MLflow UI page of the
  experiment's runs.
"""

from __future__ import annotations

import os
import shlex
import statistics
import time
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, TextIO

from experiments.console import duration, is_terminal, script_command, timestamp
from experiments.store.sqlite import resolve_tracking_uri
from experiments.store.views import runs_list_url
from sweeps.cells import FAILED, FINISHED, INTERRUPTED, NOT_STARTED, PRUNED, SKIPPED, STATUSES, Cell, CellOutcome

if TYPE_CHECKING:
    import optuna

# The statuses whose wall time says how long a cell takes (the ETA's mean).
COMPLETED = (FINISHED, PRUNED)


class GridConsole:
    """The start and end lines of the ``total`` cells (or trials: ``kind``) of a grid, ``to_run``
    of which run in this invocation, ``at_once`` at a time. ``done`` are the statuses that count a
    cell as no longer to run: any for a grid; for a search, only those that count towards
    ``n_trials`` (a failed trial is replaced by a new one)."""

    def __init__(
        self,
        out: TextIO,
        total: int,
        to_run: int,
        at_once: int,
        kind: str = "cell",
        done: Sequence[str] = STATUSES,
    ) -> None:
        self.out = out
        self.total = total
        self.to_run = to_run
        self.at_once = max(1, at_once)
        self.kind = kind
        self.done = tuple(done)
        self.stamped = not is_terminal(out)
        self._started: dict[int, float] = {}
        self._ended = 0
        self._walls: list[float] = []  # of the cells completed in this invocation, as measured here

    def say(self, text: str) -> None:
        """One ``[mesh-sweep]`` line, with the time first when the output is not a terminal."""
        prefix = f"{timestamp()} " if self.stamped else ""
        print(f"{prefix}[mesh-sweep] {text}", file=self.out, flush=True)

    def position(self, index: int) -> str:
        return f"{self.kind} {index + 1}/{self.total}"

    def skipped(self, outcome: CellOutcome) -> None:
        self.say(f"{self.position(outcome.index)} {SKIPPED} {outcome.label} · {_numbers(outcome)} (finished before)")

    def started(self, cell: Cell) -> None:
        self._started[cell.index] = time.monotonic()
        self.say(f"{self.position(cell.index)} started {cell.label}")

    def ended(self, outcome: CellOutcome) -> None:
        """The end line; ``outcome.wall_s`` is filled with the time since its start line when the
        run did not report its own."""
        began = self._started.pop(outcome.index, None)
        measured = time.monotonic() - began if began is not None else None
        if outcome.wall_s is None:
            outcome.wall_s = measured
        if outcome.status in self.done:
            self._ended += 1
        wall = measured if measured is not None else outcome.wall_s
        if outcome.status in COMPLETED and wall is not None:
            self._walls.append(wall)
        parts = [f"{self.position(outcome.index)} {outcome.status} {outcome.label}"]
        if outcome.status in COMPLETED:
            parts.append(_numbers(outcome))
        elif outcome.error:
            parts.append(outcome.error)
        if outcome.wall_s is not None:
            parts.append(f"wall {duration(outcome.wall_s)}")
        if outcome.status != INTERRUPTED:
            parts.append(f"ETA {self.eta()}")
        self.say(" · ".join(parts))

    def eta(self, now: float | None = None) -> str:
        """When the last cell should end, from the mean wall time of the cells completed here: each
        running cell ends a mean wall time after its start (never before ``now``), and each queued
        cell takes the first slot to free up (``at_once`` slots)."""
        remaining = max(0, self.to_run - self._ended)
        if remaining == 0:
            return duration(0)
        if not self._walls:
            return "?"
        mean = statistics.fmean(self._walls)
        now = time.monotonic() if now is None else now
        running = sorted(max(0.0, mean - (now - began)) for began in self._started.values())[: self.at_once]
        free = sorted(running + [0.0] * (self.at_once - len(running)))
        for _ in range(max(0, remaining - len(running))):
            free[0] += mean
            free.sort()
        return duration(max(free))


def _figures(o: CellOutcome | None) -> tuple[str, str, str, str]:
    """(val loss, val PPL, steps/s, wall time) of ``o`` as the lines and tables write them; ``-``
    for what is not known."""
    if o is None:
        return ("-",) * 4

    def shown(value: float | None, form: str) -> str:
        return "-" if value is None else format(value, form)

    wall = duration(o.wall_s) if o.wall_s is not None else "-"
    return shown(o.val_loss, ".4f"), shown(o.val_ppl, ".2f"), shown(o.steps_per_s, ".3g"), wall


def _numbers(outcome: CellOutcome) -> str:
    _, ppl, rate, _ = _figures(outcome)
    return f"{rate} steps/s · val PPL {ppl}"


def _cell(value: str) -> str:
    """Text for a Markdown table cell."""
    return value.replace("|", "\\|").replace("\n", " ")


def summary_table(name: str, outcomes: Sequence[CellOutcome]) -> str:
    """The grid's table, one row per cell (``#`` as in ``cell i/N``), then one line on how it ended."""
    lines = [
        f"{name}: {len(outcomes)} cells",
        "",
        "| # | cell | status | val loss | val PPL | steps/s | wall | note |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for o in outcomes:
        figures = " | ".join(_figures(o))
        lines.append(
            f"| {o.index + 1} | {_cell(o.label)} | {o.status} | {figures} | {_cell(o.error or o.run_dir or '')} |"
        )
    counts = {s: sum(o.status == s for o in outcomes) for s in STATUSES}
    lines.append("")
    if counts[INTERRUPTED] or counts[NOT_STARTED]:
        finished = counts[FINISHED] + counts[SKIPPED]
        lines.append(
            f"interrupted: {finished} finished, {counts[FAILED]} failed, {counts[INTERRUPTED]} interrupted, "
            f"{counts[NOT_STARTED]} never ran; run the same command to resume"
        )
    elif counts[FAILED]:
        lines.append(f"{counts[FAILED]} failed")
    else:
        lines.append("all cells finished")
    return "\n".join(lines)


def trials_table(name: str, study: optuna.Study | None, outcomes: Sequence[CellOutcome]) -> str:
    """A search's table, one row per trial of the study (numbered as in ``trial i/N``: Optuna's
    trial number + 1); val PPL, steps/s and wall time for the trials run in this invocation."""
    trials = study.trials if study is not None else []
    ran = {o.index: o for o in outcomes}
    lines = [
        f"{name}: {len(trials)} trials",
        "",
        "| trial | state | value | val PPL | steps/s | wall | params |",
        "|---|---|---|---|---|---|---|",
    ]
    for trial in trials:
        value = f"{trial.value:.4f}" if trial.value is not None else "-"
        figures = " | ".join(_figures(ran.get(trial.number))[1:])
        params = " ".join(f"{k}={v:.4g}" if isinstance(v, float) else f"{k}={v}" for k, v in trial.params.items())
        lines.append(f"| {trial.number + 1} | {trial.state.name} | {value} | {figures} | {_cell(params)} |")
    if study is not None and any(t.state.name == "COMPLETE" for t in trials):
        best = study.best_trial
        lines += ["", f"best: trial {best.number + 1}, value {best.value:.4f}, {best.params}"]
    return "\n".join(lines)


def results_command(experiment: str, tracking_uri: str, runs_dir: Path, relative: bool = True) -> str:
    """The ``mesh-results`` command that reads this experiment from this store: ``--runs-dir`` when
    the store is the one mesh-train puts there (relative to the working directory when inside it
    and ``relative``), else ``--tracking-uri``."""
    if tracking_uri == resolve_tracking_uri(None, runs_dir, {}):
        inside = os.path.relpath(runs_dir)
        where = ["--runs-dir", inside if relative and not inside.startswith("..") else runs_dir]
    else:
        where = ["--tracking-uri", tracking_uri]
    return shlex.join([script_command("mesh-results"), experiment, *map(str, where)])


def grid_command(name: str, arguments: Sequence[str], *flags: str) -> str:
    """The ``mesh-sweep`` command of this grid, to copy (``--status``, ``--cancel``...)."""
    return shlex.join([script_command("mesh-sweep"), name, *arguments, *flags])


def next_steps(
    experiment: str, experiment_id: str, tracking_uri: str, runs_dir: Path, view: str | None = None
) -> list[str]:
    """What to run once the grid ended: the results, and the runs in the MLflow UI (in ``view``)."""
    return [
        f"results: {results_command(experiment, tracking_uri, runs_dir)}",
        f"MLflow:  {runs_list_url(tracking_uri, experiment_id, view, ' ' * 9)}",
    ]
