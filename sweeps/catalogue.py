"""The grids: one Hydra config per ablation grid of the paper, ``sweeps/conf/sweep/<name>.yaml``.

Each file is a ``# @package _global_`` bundle: run settings shared by its cells, and the grid
itself in ``hydra.sweeper.params``, so both ``mesh-sweep <name>`` and the Hydra-native
``mesh-train -m +sweep=<name>`` run it (the training config has ``sweeps/conf`` on its search
path). Grids default to the CPU presets; override ``model=``, ``trainer=`` (and ``layout=``
where a grid lists layouts) for the paper's scale.
"""

from __future__ import annotations

from experiments.compose import group_options
from sweeps.launch.config import CONFIG_MODULE

GROUP = "sweep"


def sweep_names() -> list[str]:
    return group_options(GROUP, CONFIG_MODULE)


def sweep_description(name: str) -> str:
    """The file's leading comment, after the package line, as one line."""
    from importlib import resources

    text = resources.files(CONFIG_MODULE).joinpath(GROUP, f"{name}.yaml").read_text()
    lines = []
    for line in text.splitlines():
        if not line.startswith("#"):
            break
        if "@package" not in line:
            lines.append(line.lstrip("# ").strip())
    return " ".join(lines)
