"""The grids: one Hydra config per ablation grid of the paper, ``sweeps/conf/sweep/<name>.yaml``.

Each file is a ``# @package _global_`` bundle: run settings shared by its cells, and the grid
itself in ``hydra.sweeper.params``, so both ``mesh-sweep <name>`` and the Hydra-native
``mesh-train -m +sweep=<name>`` run it (the training config has ``sweeps/conf`` on its search
path). Grids default to the CPU presets; override ``model=``, ``trainer=`` (and ``layout=``
where a grid lists layouts) for the paper's scale.
"""

from __future__ import annotations

from collections.abc import Sequence

from experiments.compose import group_options
from sweeps.launch.config import CONFIG_MODULE
from sweeps.main_job import MAIN_JOB_SEEDS, MAIN_JOB_STEPS

GROUP = "sweep"


def against_main_job(steps: Sequence[int], seeds: int) -> str:
    """One line for a --dry-run: the steps and seeds of each cell, and where they differ from the
    main job's (``buffer_slots`` and ``loops`` default to 200 steps and 1 seed, the demo to 400 and 2)."""
    span = f"{steps[0]:,}" if len(set(steps)) == 1 else f"{min(steps):,}-{max(steps):,}"
    differs = [
        *([f"{span} steps, not {MAIN_JOB_STEPS}"] if set(steps) != {MAIN_JOB_STEPS} else []),
        *([f"{seeds} seed{'s' * (seeds != 1)}, not {MAIN_JOB_SEEDS}"] if seeds != MAIN_JOB_SEEDS else []),
    ]
    said = f": this grid differs ({', '.join(differs)})" if differs else ", as here"
    return (
        f"per cell: {seeds} seed{'s' * (seeds != 1)} x {span} steps; the main job (mesh-demo) runs "
        f"{MAIN_JOB_SEEDS} seeds x {MAIN_JOB_STEPS} steps{said}"
    )


def sweep_names() -> list[str]:
    return group_options(GROUP, CONFIG_MODULE)


def _sweep_text(name: str) -> str:
    from importlib import resources

    return resources.files(CONFIG_MODULE).joinpath(GROUP, f"{name}.yaml").read_text()


def sweep_description(name: str) -> str:
    """The file's leading comment, after the package line, as one line."""
    text = _sweep_text(name)
    lines = []
    for line in text.splitlines():
        if not line.startswith("#"):
            break
        if "@package" not in line:
            lines.append(line.lstrip("# ").strip())
    return " ".join(lines)


def swept_keys(name: str) -> set[str]:
    """The keys the file itself sweeps (``hydra.sweeper.params``): ``seed`` where a pre-registered
    study declares its seeds, not where a command line adds them."""
    import yaml

    document = yaml.safe_load(_sweep_text(name)) or {}
    return set(((document.get("hydra") or {}).get("sweeper") or {}).get("params") or {})
