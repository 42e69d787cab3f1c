"""Whether a run's depth evaluation is done: the record ``mesh-eval --loops/--exit`` leaves in
``<run dir>/eval/depth-step<N>/`` (no torch here: ``mesh-sweep`` reads it for every cell)."""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

SETTINGS_FILE = "settings.json"  # what an ``eval/depth-step<N>/`` folder was evaluated under, written last


def evaluated_with(run_dir: Path, settings: Mapping[str, Any]) -> bool:
    """True when the finished run's last step (``result.json``) has a depth evaluation under
    ``settings`` (loops, rules, exit, exit_eps, exit_loops: ``DepthSettings`` or the run's
    ``depth_eval``, as a mapping) with the CSVs they ask for."""
    result = run_dir / "result.json"
    if not result.is_file():
        return False
    folder = run_dir / "eval" / f"depth-step{json.loads(result.read_text()).get('steps')}"
    recorded = folder / SETTINGS_FILE
    if not recorded.is_file() or json.loads(recorded.read_text()) != json.loads(json.dumps(dict(settings))):
        return False
    wanted = (["depth.csv"] if settings["loops"] is not None else []) + (["exit.csv"] if settings["exit"] else [])
    return all((folder / name).is_file() for name in wanted)


def evaluation_pending(run_dir: Path, depth_eval: Any) -> bool:
    """True when the run's config asks for a depth evaluation (``depth_eval``) it has not had."""
    from dataclasses import asdict

    return bool(depth_eval.enabled) and not evaluated_with(run_dir, asdict(depth_eval))
