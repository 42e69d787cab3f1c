"""A named arm (experiments/conf/arm/<name>.yaml) found among a report folder's runs.

An arm is a scheme and its model overrides (``arm=mesh_residual_read``: scheme mesh with
``model_overrides.mesh_final_read=residual``). A run of ``runs.csv`` belongs to it when its scheme
is the arm's and the ``model_overrides.*`` among the overrides that set its row apart are exactly
the arm's: the default MeSH arm is a MeSH run with no model override. Other overrides (an LR given
per scheme) do not set arms apart here; a run listed under two rows (a report that reads one grid
twice) counts once.
"""

from __future__ import annotations

from dataclasses import dataclass

import pandas as pd
from omegaconf import OmegaConf

from experiments.compose import compose_config
from experiments.tracking import flatten
from results.rows.frame import ResultsError, parse_overrides

MODEL_OVERRIDES = "model_overrides."


@dataclass(frozen=True)
class ArmSpec:
    """What sets an arm's runs apart: its scheme and its model overrides (``key=value`` texts)."""

    name: str
    scheme: str
    model_overrides: frozenset[str]


def arm_spec(name: str) -> ArmSpec:
    """The arm ``name`` composed by Hydra as a run would be (``arm=<name>``)."""
    try:
        config = compose_config([f"arm={name}"])
    except Exception as error:  # Hydra's missing-option error lists the arms there are
        raise ResultsError(f"arm {name!r}: {str(error).splitlines()[0]}") from None
    node = config.get("model_overrides")
    overrides = OmegaConf.to_container(node, resolve=True) if node is not None else {}
    assert isinstance(overrides, dict)
    flat = flatten({str(key): value for key, value in overrides.items()}, MODEL_OVERRIDES)  # as the run logs them
    return ArmSpec(name, str(config.scheme), frozenset(f"{key}={value}" for key, value in flat.items()))


def _model_overrides(text: object) -> frozenset[str]:
    if not isinstance(text, str):
        return frozenset()
    return frozenset(f"{k}={v}" for k, v in parse_overrides(text).items() if k.startswith(MODEL_OVERRIDES))


def arm_runs(frame: pd.DataFrame, arm: ArmSpec) -> pd.DataFrame:
    """The finished runs of ``frame`` (a folder's runs.csv) that are ``arm``'s, one line per run."""
    if frame.empty:
        return frame
    finished = frame[(frame["status"] == "FINISHED") & frame["val_loss"].notna()]
    overrides = finished.get("overrides", pd.Series("", index=finished.index))
    own = overrides.map(lambda text: _model_overrides(text) == arm.model_overrides).astype(bool)
    mine = (finished["scheme"] == arm.scheme) & own
    return finished[mine].drop_duplicates("run_id")


__all__ = ["ArmSpec", "arm_runs", "arm_spec"]
