"""One-line answers for overrides Hydra would reject with a multi-line report.

``check_overrides`` runs before Hydra composes: a key that does not exist, or a group option
that does not exist, stops with one line that names it and lists what does exist.
"""

from __future__ import annotations

from collections.abc import Sequence

from hydra.core.config_store import ConfigStore
from hydra.core.override_parser.overrides_parser import OverridesParser
from omegaconf import OmegaConf

from experiments.config import TrainConfig, register_configs

GROUPS = ("data", "trainer", "optim")
# Keys whose children are free-form (any ModelConfig field may be set under them).
OPEN_KEYS = ("model_overrides",)


class OverrideError(ValueError):
    """An override names a key or option that does not exist; the message is one line."""


def group_options(group: str) -> list[str]:
    from experiments.compose import register_all

    register_all()
    listing = ConfigStore.instance().list(group)
    return sorted(name.removesuffix(".yaml") for name in listing)


def _schema():
    register_configs()
    schema = OmegaConf.structured(TrainConfig)
    store = ConfigStore.instance()
    for group in GROUPS:
        node = store.load(f"{group}/{group_options(group)[0]}.yaml").node
        OmegaConf.update(schema, group, node, force_add=True)
    return schema


def check_overrides(overrides: Sequence[str]) -> None:
    parsed = OverridesParser.create().parse_overrides([o for o in overrides if not o.startswith("-")])
    schema = None
    for override in parsed:
        key = override.key_or_group
        if override.is_add() or override.is_force_add() or key.startswith("hydra") or override.package:
            continue
        if key in GROUPS:
            options = group_options(key)
            if override.is_sweep_override():
                values = list(override.sweep_string_iterator())
            else:
                values = [override.get_value_element_as_str()]
            for value in values:
                if value not in options:
                    raise OverrideError(f"{key}={value!r} is invalid: known options: {', '.join(options)}")
            continue
        if key.split(".")[0] in OPEN_KEYS:
            continue
        schema = schema if schema is not None else _schema()
        parent, _, leaf = key.rpartition(".")
        node = OmegaConf.select(schema, parent) if parent else schema
        if node is None or not OmegaConf.is_dict(node) or leaf not in node:
            known = sorted(k for k in (node.keys() if OmegaConf.is_dict(node) else []))
            where = f" under {parent!r}" if parent else ""
            raise OverrideError(f"{key!r} is not a config key{where}; known keys: {', '.join(map(str, known))}")
