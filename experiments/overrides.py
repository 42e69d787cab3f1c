"""One-line answers for overrides Hydra would reject with a multi-line report.

``check_overrides`` runs before Hydra composes: a malformed override, a key that does not
exist, a group option that does not exist, a value the key's type cannot hold
(``data.seq_len=abc``) or a ``runs_dir`` that cannot hold runs stops with one line that names it
and says what is allowed.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from hydra.core.override_parser.overrides_parser import OverridesParser
from hydra.core.override_parser.types import ChoiceSweep
from omegaconf import OmegaConf
from omegaconf.errors import ValidationError

from experiments.compose import group_options
from experiments.config import GLOBAL_GROUPS, GROUP_SCHEMAS, TrainConfig
from experiments.store.check import check_runs_dir
from mesh_model import ConfigError, did_you_mean

# Keys whose children are free-form (any ModelConfig field may be set under them).
OPEN_KEYS = ("model_overrides",)
# What a schema node's type accepts, for the one-line answer to a value it cannot hold.
TYPE_NAMES = {
    "IntegerNode": "an integer",
    "FloatNode": "a number",
    "BooleanNode": "true or false",
    "StringNode": "a string",
}


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
        groups = {group: group_options(group) for group in (*GROUP_SCHEMAS, *GLOBAL_GROUPS)}
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
                    suggestion = did_you_mean(value, options)
                    raise OverrideError(f"{key}={value!r} is invalid: {suggestion}known options: {', '.join(options)}")
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
            raise OverrideError(f"{key!r} is not a config key{where}; {did_you_mean(leaf, known)}known keys: {listed}")
        if override.is_delete():
            continue
        for value in _values(override):
            _check_type(node, key, leaf, value)
            if key == "runs_dir" and isinstance(value, str):
                try:
                    check_runs_dir(value)  # before Hydra: `mesh-train -m` creates <runs_dir>/hydra/multirun/...
                except ConfigError as error:
                    raise OverrideError(str(error)) from None


def _values(override) -> list:
    """The values an override sets: one, or each choice of a sweep (ranges and intervals are
    typed by Hydra itself)."""
    if not override.is_sweep_override():
        return [override.value()]
    sweep = override.value()
    return list(sweep.list) if isinstance(sweep, ChoiceSweep) else []


def _check_type(node, key: str, leaf: str, value) -> None:
    """A value the schema's type cannot hold (``data.seq_len=abc``) is one line, not Hydra's report."""
    if isinstance(value, str) and "${" in value:
        return  # an interpolation, resolved later
    try:
        OmegaConf.merge(node, {leaf: value})
    except ValidationError as error:
        field = node._get_node(leaf)
        expected = TYPE_NAMES.get(type(field).__name__)
        if expected and field._is_optional():
            expected += " or null"
        reason = f"must be {expected}" if expected else str(error).strip().splitlines()[0]
        raise OverrideError(f"{key}={value!r} is invalid: {reason}") from None
