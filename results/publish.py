"""Put a report where the grid is looked at: on the MLflow parent run of every sweep it tabulates.

The parent run's description (MLflow's run note, rendered as Markdown
on the run page) becomes the results table and the verdicts on the paper's claims; the report
folder (``report.md``, tables, ``claims.md``, figures) is logged as the parent's artifacts under
``report/``. A sweep's parent is found through its cell runs (tag ``mlflow.parentRunId``), so a
report that reads only some of a grid's cells still lands on its parent. Re-running
``mesh-results`` replaces the note and the files.

A report over several experiments (``mesh-results schemes,schemes_k3``) lands on each of their
parents under ``reports/<label>/`` and leaves their notes and ``report/`` alone: a grid's parent
keeps describing that grid, whatever combined reports it also took part in.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from datetime import datetime
from pathlib import Path
from typing import Any

from experiments.tracking import TAG_VALUE_LIMIT as NOTE_LIMIT
from experiments.tracking import fit_tag_value, set_run_description

ARTIFACT_DIR = "report"
SHARED_ARTIFACT_DIR = "reports"  # reports/<label>/: a report over several experiments
PARENT_KIND = "sweep"  # the tag ``kind`` of a sweep's parent run (sweeps/sweep.py)


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


def report_note(label: str, table_md: str, claims_md: str | None, when: datetime | None = None) -> str:
    """The parent's description: the results table, then the claims' summary table; shortened to
    MLflow's limit by leaving out the claims first, then the end of the results table."""
    stamp = (when or datetime.now()).strftime("%Y-%m-%d %H:%M")
    head = (
        f"**Results: `mesh-results {label}`**, {stamp}. The whole report (tables, claims with their tests, "
        f"figures, probes) is in this run's artifacts under `{ARTIFACT_DIR}/` (`{ARTIFACT_DIR}/report.md`).\n\n"
    )
    table = table_md.strip()
    claims = _claims_summary(claims_md) if claims_md else ""
    note = head + table + (f"\n\n### The paper's claims\n\n{claims}" if claims else "")
    if len(note) <= NOTE_LIMIT:
        return note
    return fit_tag_value(head + table, f"*(cut to MLflow's {NOTE_LIMIT} characters: see `{ARTIFACT_DIR}/table.md`)*")


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


def publish_report(client: Any, parents: Iterable[str], out_dir: Path, label: str, shared: bool = False) -> list[str]:
    """Log ``out_dir`` as each parent's artifacts (:func:`artifact_dir`) and, unless ``shared``
    (the report spans several experiments), set each parent's note from its ``table.md`` and
    ``claims.md``; returns the parents written."""
    note = None
    if not shared:
        table = (out_dir / "table.md").read_text() if (out_dir / "table.md").exists() else ""
        claims = (out_dir / "claims.md").read_text() if (out_dir / "claims.md").exists() else None
        note = report_note(label, table, claims)
    folder = artifact_dir(label, shared)
    written = []
    for parent in parents:
        if note is not None:
            set_run_description(client, parent, note)
        client.log_artifacts(parent, str(out_dir), folder)
        written.append(parent)
    return written
