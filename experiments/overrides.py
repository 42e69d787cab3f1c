"""One-line answers for overrides Hydra would reject with a multi-line report.

``check_overrides`` runs before Hydra composes: a key that does not exist, or a group option
that does not exist, stops with one line that names it and lists what does exist.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from hydra.core.override_parser.overrides_parser import OverridesParser
from omegaconf import OmegaConf

from experiments.compose import group_options
from experiments.config import GROUP_SCHEMAS, TrainConfig

# Keys whose children are free-form (any ModelConfig field may be set under them).
OPEN_KEYS = ("model_overrides",)


class OverrideError(ValueError):
    """An override names a key or option that does not exist; the message is one line."""


def train_schema():
    """TrainConfig with every group's schema in place: the keys an override may name."""
    schema = OmegaConf.structured(TrainConfig)
    for group, node in GROUP_SCHEMAS.items():
        OmegaConf.update(schema, group, OmegaConf.structured(node), force_add=True)
    return schema


def parse_overrides(overrides: Sequence[str]) -> list:
    """Hydra's parse of ``key=value`` strings; a malformed one is a one-line OverrideError."""
    parser = OverridesParser.create()
    parsed = []
    for text in overrides:
        if text.startswith("-"):
            continue
        try:
            parsed.append(parser.parse_override(text))
        except Exception as error:
            reason = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
            raise OverrideError(f"override {text!r} is malformed: {reason}") from None
    return parsed


def check_overrides(
    overrides: Sequence[str],
    schema=None,
    groups: Mapping[str, list[str]] | None = None,
    open_keys: Sequence[str] = OPEN_KEYS,
) -> None:
    """Check keys against ``schema`` (default: the training run's) and group options against
    ``groups`` (default: the options of experiments/conf/<group>/)."""
    if groups is None:
        groups = {group: group_options(group) for group in GROUP_SCHEMAS}
    for override in parse_overrides(overrides):
        key = override.key_or_group
        if override.is_add() or override.is_force_add() or key.startswith("hydra") or override.package:
            continue
        if key in groups:
            options = groups[key]
            values = (
                list(override.sweep_string_iterator())
                if override.is_sweep_override()
                else [override.get_value_element_as_str()]
            )
            for value in values:
                if value not in options:
                    raise OverrideError(f"{key}={value!r} is invalid: known options: {', '.join(options)}")
            continue
        if key.split(".")[0] in open_keys:
            continue
        schema = schema if schema is not None else train_schema()
        parent, _, leaf = key.rpartition(".")
        node = OmegaConf.select(schema, parent) if parent else schema
        if node is None or not OmegaConf.is_dict(node) or leaf not in node:
            known = sorted(k for k in (node.keys() if OmegaConf.is_dict(node) else []))
            where = f" under {parent!r}" if parent else ""
            listed = ", ".join(map(str, known)) or "(none)"
            raise OverrideError(f"{key!r} is not a config key{where}; known keys: {listed}")
