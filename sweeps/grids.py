"""One Hydra config per ablation grid of the paper (``sweeps/<name>.yaml``).

Each file is a ``# @package _global_`` bundle: run settings shared by its cells, and the grid
itself in ``hydra.sweeper.params``, so both ``mesh-sweep <name>`` and the Hydra-native
``mesh-train -m +sweep=<name>`` run it. Grids default to the CPU presets; override ``model=``,
``trainer=`` (and ``layout=`` where a grid lists layouts) for the paper's scale.
"""

from __future__ import annotations

from importlib import resources

from hydra.core.config_store import ConfigStore
from omegaconf import OmegaConf


def sweep_names() -> list[str]:
    return sorted(p.name.removesuffix(".yaml") for p in resources.files(__name__).iterdir() if p.name.endswith(".yaml"))


def sweep_description(name: str) -> str:
    """The file's leading comment, after the package line, as one line."""
    text = resources.files(__name__).joinpath(f"{name}.yaml").read_text()
    lines = []
    for line in text.splitlines():
        if not line.startswith("#"):
            break
        if "@package" not in line:
            lines.append(line.lstrip("# ").strip())
    return " ".join(lines)


def register_sweeps() -> None:
    """Put every sweep file in the ConfigStore group ``sweep`` (``+sweep=<name>``)."""
    store = ConfigStore.instance()
    for name in sweep_names():
        node = OmegaConf.create(resources.files(__name__).joinpath(f"{name}.yaml").read_text())
        store.store(group="sweep", name=name, node=node, package="_global_")
