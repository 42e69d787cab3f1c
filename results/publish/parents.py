"""Put a report where the grid is looked at: on the MLflow parent run of every sweep it tabulates,
and on the runs themselves.

The parent run's description (MLflow's run note, rendered as Markdown on the run page) becomes the
ranking (:mod:`results.verdicts.ranking`), the verdicts on the paper's claims and the results table; the
report folder (``report.md``, tables, ``claims.md``, figures) is logged as the parent's artifacts
under ``report/``. A sweep's parent is found through its cell runs (tag ``mlflow.parentRunId``), so
a report that reads only some of a grid's cells still lands on its parent. Re-running
``mesh-results`` replaces the note and the files.

A report over several experiments (``mesh-results schemes,schemes_k3``) lands on each of their
parents under ``reports/<label>/`` and leaves their notes and ``report/`` alone: a grid's parent
keeps describing that grid, whatever combined reports it also took part in.

Every run read gets its scheme's colour in the UI's charts (``mlflow.runColor``, the figures'
palette) and every finished run its row (tag ``row``: the config without the seed), which the
experiment's grouped view (:func:`experiments.store.views.grouped_view`) folds seeds by where the grid
has axes besides the scheme (:func:`group_key`).
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

import pandas as pd
from mlflow.entities import RunTag

from experiments.store.views import (
    ROW_TAG,
    RUN_COLOR_TAG,
    fit_tag_value,
    run_color,
    run_url,
    set_run_description,
    write_grouped_view,
    write_key_metrics_view,
)
from experiments.store.views import TAG_VALUE_LIMIT as NOTE_LIMIT
from results.rows.frame import validation_sets

ARTIFACT_DIR = "report"
SHARED_ARTIFACT_DIR = "reports"  # reports/<label>/: a report over several experiments
PARENT_KIND = "sweep"  # the tag ``kind`` of a sweep's parent run (sweeps/sweep.py)
# The lines a grid's job set its answer beside (mesh-demo: the decided result's regime and its own), one per
# line, on the parent run: a later ``mesh-results`` reads them back (:func:`recorded_context`) and keeps them.
CONTEXT_TAG = "mesh.context"


@dataclass
class Published:
    """What :func:`publish` wrote to the store."""

    parents: list[str]  # the sweep parent runs that now carry the report
    pages: list[str]  # their pages in the MLflow UI
    folder: str  # under which artifact folder of theirs
    view: str | None  # the grouped view written to the experiments read (experiments.store.views)


def publish(
    client: Any,
    tracking_uri: str,
    out_dir: Path,
    label: str,
    runs: pd.DataFrame,
    experiment_ids: Mapping[str, str],
    ranking: Sequence[str] = (),
    context: Sequence[str] = (),
) -> Published:
    """Everything a report writes to MLflow: colour and tag the ``runs`` (:func:`tag_runs`), write
    each experiment's views, and put ``out_dir`` on the parent run of every sweep whose cells it
    read (:func:`publish_report`); the grid's ``context`` lines are recorded on those parents
    (:data:`CONTEXT_TAG`)."""
    sets = validation_sets(runs)
    tag_runs(client, runs)
    view = None
    for experiment, experiment_id in experiment_ids.items():
        write_key_metrics_view(client, experiment_id, sets)
        view = write_grouped_view(client, experiment_id, sets, group_key(runs[runs["experiment"] == experiment]))
    parents = sweep_parents(client, experiment_ids.values(), runs["run_id"])
    shared = len(experiment_ids) > 1
    written = publish_report(client, parents, out_dir, label, shared, ranking)
    if context and not shared:
        for parent in written:
            client.set_tag(parent, CONTEXT_TAG, fit_tag_value("\n".join(context), "(cut)"))
    pages = [run_url(tracking_uri, client.get_run(run_id).info.experiment_id, run_id) for run_id in written]
    return Published(written, pages, artifact_dir(label, shared), view)


def sweep_parents(client: Any, experiment_ids: Iterable[str], run_ids: Iterable[str]) -> list[str]:
    """The parent runs (tag ``kind=sweep``) in ``experiment_ids`` with at least one child in ``run_ids``."""
    wanted = set(run_ids)
    ids = sorted(set(experiment_ids))
    if not ids or not wanted:
        return []
    parents = client.search_runs(ids, f"tags.kind = '{PARENT_KIND}'", max_results=10_000)
    found = []
    for parent in parents:
        children = client.search_runs(ids, f"tags.mlflow.parentRunId = '{parent.info.run_id}'", max_results=10_000)
        if wanted & {child.info.run_id for child in children}:
            found.append(parent.info.run_id)
    return found


def recorded_context(client: Any, experiment_ids: Iterable[str]) -> list[str]:
    """The context lines a grid's job recorded on its sweep parent run in ``experiment_ids``
    (:data:`CONTEXT_TAG`; the newest parent that has them), or none."""
    ids = sorted(set(experiment_ids))
    if not ids:
        return []
    found = client.search_runs(
        ids, f"tags.kind = '{PARENT_KIND}'", max_results=1000, order_by=["attributes.start_time DESC"]
    )
    for parent in found:
        if text := parent.data.tags.get(CONTEXT_TAG):
            return text.splitlines()
    return []


def report_note(
    label: str, table_md: str, claims_md: str | None, when: datetime | None = None, ranking: Sequence[str] = ()
) -> str:
    """The parent's description: the ranking, a line saying where the whole report is, the claims'
    summary table, then the results table; cut at a line end to MLflow's limit (the table goes
    first)."""
    stamp = (when or datetime.now()).strftime("%Y-%m-%d %H:%M")
    head = (
        f"**Results: `mesh-results {label}`**, {stamp}. The whole report (tables, claims with their tests, "
        f"figures, probes, methods) is in this run's artifacts under `{ARTIFACT_DIR}/` (`{ARTIFACT_DIR}/report.md`)."
    )
    claims = _claims_summary(claims_md) if claims_md else ""
    parts = [
        "\n".join(ranking).strip(),
        head,
        f"### The paper's claims\n\n{claims}" if claims else "",
        table_md.strip(),
    ]
    note = "\n\n".join(part for part in parts if part)
    return fit_tag_value(note, f"*(cut to MLflow's {NOTE_LIMIT} characters: see `{ARTIFACT_DIR}/report.md`)*")


def _claims_summary(claims_md: str) -> str:
    """The ``## Summary`` table of ``claims.md`` (one verdict per claim and block), with the line that
    says which test the verdicts come from."""
    lines = claims_md.splitlines()
    test = next((line for line in lines if line.startswith("* **Test**")), "")
    try:
        start = lines.index("## Summary") + 1
    except ValueError:
        return ""
    table = []
    for line in lines[start:]:
        if line.startswith("## "):
            break
        table.append(line)
    body = "\n".join(table).strip()
    return f"{body}\n\n{test}" if test else body


def artifact_dir(label: str, shared: bool) -> str:
    """Where a report goes in a parent's artifacts: ``report`` for the grid's own report, else
    ``reports/<label>`` (the label made a safe folder name)."""
    if not shared:
        return ARTIFACT_DIR
    return f"{SHARED_ARTIFACT_DIR}/{re.sub(r'[^A-Za-z0-9_.-]+', '_', label) or 'report'}"


def publish_report(
    client: Any, parents: Iterable[str], out_dir: Path, label: str, shared: bool = False, ranking: Sequence[str] = ()
) -> list[str]:
    """Log ``out_dir`` as each parent's artifacts (:func:`artifact_dir`) and, unless ``shared``
    (the report spans several experiments), set each parent's note from the ``ranking`` lines,
    ``table.md`` and ``claims.md``; returns the parents written."""
    note = None
    if not shared:
        table = (out_dir / "table.md").read_text() if (out_dir / "table.md").exists() else ""
        claims = (out_dir / "claims.md").read_text() if (out_dir / "claims.md").exists() else None
        note = report_note(label, table, claims, ranking=ranking)
    folder = artifact_dir(label, shared)
    written = []
    for parent in parents:
        if note is not None:
            set_run_description(client, parent, note)
        client.log_artifacts(parent, str(out_dir), folder)
        written.append(parent)
    return written


def row_value(run: Mapping[str, Any]) -> str:
    """A finished run's row as the tag ``row`` holds it: the report's row label and the preset
    (``mesh 1+2R2+1 B5 · tiny``); "" for a run in no row (unfinished, or a duplicate left out)."""
    return f"{run['row']} · {run['preset']}" if run.get("row") else ""


def tag_runs(client: Any, runs: pd.DataFrame) -> None:
    """Colour every run of ``runs`` (:func:`results.rows.aggregate.aggregate`'s frame) by its scheme and
    tag every finished one with its row (:func:`row_value`), one request per run. The seed is tagged
    too: runs logged before it was a tag (their param holds it) would be left out of the views,
    which select the training runs by ``tags.seed``."""
    for run in runs.to_dict("records"):
        tags = [RunTag(RUN_COLOR_TAG, run_color(run["scheme"]))] if run.get("scheme") else []
        if run.get("seed") != "":
            tags.append(RunTag("seed", str(run["seed"])))
        if row := row_value(run):
            tags.append(RunTag(ROW_TAG, row))
        if tags:
            client.log_batch(run["run_id"], tags=tags)


def group_key(runs: pd.DataFrame) -> str:
    """The tag the grouped view folds seeds by: ``scheme`` where each scheme is one row (the grid
    varies the scheme only), else :data:`~experiments.store.views.ROW_TAG` (B, layout, preset or
    other settings vary too)."""
    rows = pd.Series([row_value(run) for run in runs.to_dict("records")], index=runs.index)
    finished = runs.assign(row_value=rows)[rows != ""]
    per_scheme = finished.groupby("scheme")["row_value"].nunique()
    return "scheme" if per_scheme.le(1).all() else ROW_TAG
