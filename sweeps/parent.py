"""The MLflow parent run of a sweep: what the grid is, how it was last run, how far it got.

One parent per grid key (sweeps/grid.py ``sweep_key``), reused by every re-run of the same grid:

* params, logged once when it is created (MLflow params cannot change): what the key fixes, the
  sweep's name, each grid axis with its values, the overrides every cell shares;
* tags, set by each invocation: the command line, the git commit, the launcher, ``progress``;
  ``detached`` while the grid's SLURM jobs run without a ``mesh-sweep`` that waits for them;
* metrics ``cells_<status>`` (this invocation's; ``cells_skipped``: finished before it), ``cells_done``
  (finished, now or before: the grid's count after a re-run) and the ``progress`` tag, updated as
  each cell ends;
* at the end: the summary table as the run's description (its note, Markdown), ``summary.json``
  as an artifact, and the final status (KILLED on Ctrl-C or when a cell was stopped, FAILED if a
  cell failed, else FINISHED). A detached grid ends when ``mesh-sweep --status`` finds every
  cell ended, or on ``--cancel`` (sweeps/status.py).
"""

from __future__ import annotations

# MLflow is imported inside the methods that use it: --status of an ended grid reads the store's
# file without it (sweeps/status.py).
import sys
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from experiments.store.sqlite import artifact_location, prepare_sqlite_store
from experiments.store.views import TAG_VALUE_LIMIT, set_run_description, write_key_metrics_view
from experiments.tracking import log_params, open_run, reopen_run
from mesh_model.cli_text import commit
from sweeps.cells import FAILED, FINISHED, INTERRUPTED, NOT_STARTED, SKIPPED, STATUSES, Cell, CellOutcome

if TYPE_CHECKING:
    from experiments.plan import RunPlan
    from sweeps.launch.config import LaunchConfig

DETACHED_TAG = "detached"  # the grid's jobs were submitted by a mesh-sweep that did not wait for them
ID_FILE = "parent_run_id"  # in the sweep's folder
COMMAND_FILE = "command"  # in the sweep's folder: the latest mesh-sweep command that ran the grid


def grids_in(sweeps_dir: Path, name: str) -> list[tuple[str, str]]:
    """(key, command) of every grid of sweep ``name`` that ran under ``sweeps_dir``
    (``<runs_dir>/<experiment>/sweeps``), newest first; command is "" where none was kept."""
    found = [d for d in sweeps_dir.glob(f"{name}-*") if (d / ID_FILE).is_file()] if sweeps_dir.is_dir() else []
    found.sort(key=lambda d: (d / ID_FILE).stat().st_mtime, reverse=True)
    return [(d.name, (d / COMMAND_FILE).read_text().strip() if (d / COMMAND_FILE).is_file() else "") for d in found]


def val_sets(plans: Sequence[RunPlan]) -> list[str]:
    """The validation sets the cells of a grid report, in order, each once (``val/<set>/...``)."""
    names = (name for plan in plans for name in (plan.data.corpus, *plan.data.extra_val))
    return list(dict.fromkeys(names))


def grid_params(name: str, cells: Sequence[Cell], shared: Sequence[str]) -> dict[str, str]:
    """The parent's params: the sweep, its number of cells, ``grid.<axis>`` = the axis's values in
    grid order (read from the cells' labels), ``overrides`` = what every cell shares."""
    axes: dict[str, list[str]] = {}
    for cell in cells:
        for item in _label_items(cell.label):
            key, _, value = item.partition("=")
            values = axes.setdefault(key, [])
            if value not in values:
                values.append(value)
    params = {"sweep": name, "cells": str(len(cells))}
    params.update({f"grid.{key}": ",".join(values) for key, values in axes.items()})
    params["overrides"] = " ".join(shared)
    return params


def _label_items(label: str) -> list[str]:
    """``scheme=mesh seed=1`` -> its ``key=value`` items (a value holding a space stays whole)."""
    items: list[str] = []
    for word in label.split():
        if "=" in word or not items:
            items.append(word)
        else:
            items[-1] += f" {word}"
    return items


def _stored_run(client: Any, id_file: Path, tracking_uri: str) -> Any:
    """The parent run ``id_file`` names, or None when there is none yet, or when the store no
    longer holds it (a damaged store set aside by ``tracking.rebuild_store=true``, or another
    store): then a new parent is made, and a line says so."""
    from mlflow.exceptions import MlflowException

    if not id_file.exists():
        return None
    run_id = id_file.read_text().strip()
    try:
        return client.get_run(run_id)
    except MlflowException as error:
        if error.error_code != "RESOURCE_DOES_NOT_EXIST":
            raise
    print(
        f"[mesh-sweep] the grid's parent run {run_id} is not in the store {tracking_uri} (set aside or replaced): "
        "a new parent run takes its place",
        file=sys.stderr,
    )
    return None


def invocation_tags(command: str, launch: LaunchConfig) -> dict[str, str]:
    """The parent's tags of this invocation (the git commit is added by :class:`ParentRun`)."""
    return {"command": command, "launcher": launch.launcher.name}


@dataclass
class ParentRun:
    """An open parent run. ``earlier`` counts the cells finished before this invocation that no
    outcome stands for (the trials of an Optuna study): they count as skipped."""

    tracking_uri: str
    run_id: str
    experiment_id: str
    client: Any = field(repr=False)
    earlier: int = 0
    view: str | None = None  # the experiment's key-metrics view (experiments.store.views.key_metrics_view)
    _last_ms: int = field(default=0, init=False, repr=False)

    @classmethod
    def open(
        cls,
        name: str,
        key: str,
        plan: RunPlan,
        sweep_dir: Path,
        cells: Sequence[Cell],
        params: Mapping[str, str],
        tags: Mapping[str, str],
        val_sets: Sequence[str] = (),
    ) -> ParentRun:
        """The parent of the grid ``key`` in ``plan``'s store and experiment (its id kept in
        ``sweep_dir``): created with ``params`` on the first run, else set RUNNING again with the
        tags of how an earlier invocation stopped cleared, so its final status and tags are those
        of the latest one. ``tags`` say how this invocation runs. The experiment gets (again) the
        view that shows the validation sets ``val_sets`` first."""
        import mlflow

        sweep_dir.mkdir(parents=True, exist_ok=True)
        prepare_sqlite_store(plan.tracking_uri, rebuild=plan.train.tracking.rebuild_store)
        client = mlflow.MlflowClient(plan.tracking_uri)
        id_file = sweep_dir / ID_FILE
        run = _stored_run(client, id_file, plan.tracking_uri)
        if run is not None:
            run_id = run.info.run_id
            reopen_run(client, run_id, run.data.tags)
            if DETACHED_TAG in run.data.tags:  # each invocation says for itself whether it waits
                client.delete_tag(run_id, DETACHED_TAG)
        else:
            created = {"sweep": name, "kind": "sweep", "cells": str(len(cells))}
            artifacts = artifact_location(plan.tracking_uri, plan.run_dir.parent)
            run_id = open_run(client, plan.experiment, f"sweep:{key}", created, artifacts)
            log_params(client, run_id, params)
            client.log_dict(run_id, {"cells": [c.overrides for c in cells]}, "cells.json")
            id_file.write_text(run_id)
            run = client.get_run(run_id)
        parent = cls(plan.tracking_uri, run_id, run.info.experiment_id, client)
        parent.set_tags({**tags, "git_commit": commit(full=True)})
        if "command" in tags:  # what --status offers when a command does not name this grid
            (sweep_dir / COMMAND_FILE).write_text(tags["command"] + "\n")
        if val_sets:
            parent.view = write_key_metrics_view(client, parent.experiment_id, val_sets)
        return parent

    @classmethod
    def find(cls, tracking_uri: str, sweep_dir: Path) -> tuple[ParentRun, Any] | None:
        """The parent of the grid whose folder is ``sweep_dir`` and its MLflow run, as they are
        (nothing reopened); None when the grid never ran."""
        import mlflow

        id_file = sweep_dir / ID_FILE
        if not id_file.exists():
            return None
        client = mlflow.MlflowClient(tracking_uri)
        run = client.get_run(id_file.read_text().strip())
        return cls(tracking_uri, run.info.run_id, run.info.experiment_id, client), run

    def set_tags(self, tags: Mapping[str, str]) -> None:
        from mlflow.entities import RunTag

        self.client.log_batch(self.run_id, tags=[RunTag(k, str(v)[:TAG_VALUE_LIMIT]) for k, v in tags.items()])

    def progress(self, outcomes: Sequence[CellOutcome], total: int) -> dict[str, int]:
        """Log the counts of cells per status (``cells_<status>``, at step 0: the latest value is
        the newest) and the ``progress`` tag; returns the counts."""
        from mlflow.entities import Metric, RunTag

        counts = {s: sum(o.status == s for o in outcomes) for s in STATUSES}
        counts[SKIPPED] += self.earlier
        done = counts[FINISHED] + counts[SKIPPED]  # finished now or before: what a re-run's counts add up to
        now = max(int(time.time() * 1000), self._last_ms + 1)  # two updates in one ms stay ordered
        self._last_ms = now
        said = ", ".join(f"{n} {s.lower().replace('_', ' ')}" for s, n in counts.items() if n) or "none ended yet"
        self.client.log_batch(
            self.run_id,
            metrics=[Metric(f"cells_{s.lower()}", n, now, 0) for s, n in counts.items()]
            + [Metric("cells_done", done, now, 0)],
            tags=[RunTag("progress", f"{sum(counts.values())}/{total}: {said}")],
        )
        return counts

    def try_progress(self, outcomes: Sequence[CellOutcome], total: int) -> None:
        """:meth:`progress` while the grid runs: a store that fails now is said, the grid goes on."""
        try:
            self.progress(outcomes, total)
        except Exception as failure:
            print(f"[mesh-sweep] could not update the parent run {self.run_id}: {failure}", file=sys.stderr)

    def describe(self, markdown: str, summary: Path) -> None:
        """The run's description (``markdown``) and ``summary`` as an artifact."""
        set_run_description(self.client, self.run_id, markdown)
        self.client.log_artifact(self.run_id, str(summary))

    def close(
        self,
        outcomes: Sequence[CellOutcome],
        total: int,
        interrupted: bool = False,
        error: BaseException | None = None,
        reason: str = "Ctrl-C",
    ) -> None:
        """The final counts, then the final status: KILLED (tag ``interrupted``: ``reason`` and the
        counts) when the grid was stopped (``interrupted``: Ctrl-C, ``--cancel``); FAILED when the
        sweep itself broke (tag ``error``) or a cell failed; KILLED when a cell was stopped (a
        worker got SIGTERM, SLURM cancelled a job) or never ran, as the grid is not complete;
        else FINISHED."""
        try:
            counts = self.progress(outcomes, total)
            if isinstance(error, (KeyboardInterrupt, SystemExit)):
                interrupted, error = True, None
            stopped = counts[INTERRUPTED] + counts[NOT_STARTED]
            if interrupted or (error is None and stopped and not counts[FAILED]):
                if not interrupted:
                    reason = f"{counts[INTERRUPTED]} cell(s) stopped before the end"
                done = f"{counts[FINISHED] + counts[SKIPPED]} finished, {counts[INTERRUPTED]} interrupted"
                note = f"{reason}: {done}, {counts[NOT_STARTED]} never ran; re-run the grid to resume"
                self.client.set_tag(self.run_id, "interrupted", note)
                self.client.set_terminated(self.run_id, "KILLED")
            elif error is not None:
                self.client.set_tag(self.run_id, "error", f"{type(error).__name__}: {error}"[:5000])
                self.client.set_terminated(self.run_id, "FAILED")
            else:
                self.client.set_terminated(self.run_id, "FAILED" if counts[FAILED] else "FINISHED")
        except Exception as failure:  # the store itself failed: the sweep's own error matters more
            if error is None:
                raise
            print(f"[mesh-sweep] could not close the parent run {self.run_id}: {failure}", file=sys.stderr)
