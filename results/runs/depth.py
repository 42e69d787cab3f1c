"""A depth study's curves read from the runs (issue 48): each finished run's newest depth evaluation
(``mesh-eval --loops/--exit`` or its ``depth_eval``), the CSVs under its run dir when this machine
has them, else the run's ``depth/depth.csv`` and ``depth/exit.csv`` artifacts downloaded (a remote
store, or runs moved away)."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pandas as pd

from results.rows.aggregate import Results
from results.rows.depth import DEPTH_COLUMNS, DEPTH_FILE, EXIT_COLUMNS, EXIT_FILE, FIXED, DepthData
from results.runs.store import QUIET_ARTIFACTS, _environ

ARTIFACTS = "depth"  # the artifact folder mesh-eval logs the CSVs under (experiments/evaluation/depth.py)


def _newest_local(run_dir: str, name: str) -> Path | None:
    folders = Path(run_dir).glob("eval/depth-step*") if run_dir else []
    steps = sorted((int(m.group(1)), f) for f in folders if (m := re.fullmatch(r"depth-step(\d+)", f.name)))
    for _, folder in reversed(steps):
        if (folder / name).is_file():
            return folder / name
    return None


def run_fields(params: dict[str, str]) -> dict[str, str]:
    """How the run trained (``loops.distribution``, fixed when not logged: runs from before the
    loops group) and its own rule past K (the resolved model's ``loop_rule``, logged only away
    from its default, ``last``)."""
    return {
        "training": params.get("loops.distribution") or FIXED,
        "loop_rule": params.get("model_config.loop_rule") or "last",
    }


def _read(client: Any, run_id: str, run_dir: str, name: str, tmp: Path) -> pd.DataFrame | None:
    path = _newest_local(run_dir, name)
    if path is None:
        try:
            listed = {a.path for a in client.list_artifacts(run_id, ARTIFACTS)}
        except Exception:  # no artifact store for it: the run has no depth curves here
            return None
        if f"{ARTIFACTS}/{name}" not in listed:
            return None
        with _environ(QUIET_ARTIFACTS):
            path = Path(client.download_artifacts(run_id, f"{ARTIFACTS}/{name}", str(tmp / run_id)))
    return pd.read_csv(path, dtype={"rule": str, "set": str, "criterion": str}).assign(run_id=run_id)


def read_depth(client: Any, results: Results, tmp: Path) -> DepthData:
    """The depth and exit curves of every run of ``results``' rows that has them."""
    run_dirs = dict(zip(results.runs["run_id"], results.runs["run_dir"].fillna("").astype(str), strict=True))
    params = dict(zip(results.runs["run_id"], results.runs["params"], strict=True))
    frames: dict[str, list[pd.DataFrame]] = {DEPTH_FILE: [], EXIT_FILE: []}
    for row in results.rows:
        for run_id in row.run_ids:
            for name, kept in frames.items():
                frame = _read(client, run_id, run_dirs.get(run_id, ""), name, tmp)
                if frame is not None:
                    kept.append(frame.assign(**run_fields(params.get(run_id) or {})))
    depth = pd.concat(frames[DEPTH_FILE], ignore_index=True) if frames[DEPTH_FILE] else pd.DataFrame()
    exits = pd.concat(frames[EXIT_FILE], ignore_index=True) if frames[EXIT_FILE] else pd.DataFrame()
    return DepthData(
        depth.reindex(columns=list(DEPTH_COLUMNS)) if len(depth) else DepthData().depth,
        exits.reindex(columns=list(EXIT_COLUMNS)) if len(exits) else DepthData().exit,
    )


__all__ = ["read_depth"]
