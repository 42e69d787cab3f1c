"""The one exception bad model input raises."""

from __future__ import annotations

import difflib
from collections.abc import Iterable


class ConfigError(ValueError):
    """A config field holds a value the model cannot be built from.

    The message is one line: the field, the value, and what is allowed.
    """

    def __init__(self, field: str, value: object, allowed: str) -> None:
        self.field = field
        self.value = value
        self.allowed = allowed
        super().__init__(f"{field}={value!r} is invalid: {allowed}")


def did_you_mean(value: object, known: Iterable[str]) -> str:
    """``"did you mean 'max_steps'? "`` for the known names closest to a mistyped one (difflib's
    ratio >= 0.6, at most three, closest first; failing that, names sharing its first three
    characters, as ``tiniest`` -> ``tiny``), else ``""``: the start of an ``allowed`` text."""
    text, names = str(value), [str(k) for k in known]
    close = difflib.get_close_matches(text, names, n=3, cutoff=0.6)
    if not close and len(text) >= 3:
        close = [name for name in names if name[:3] == text[:3]][:3]
    if not close:
        return ""
    return "did you mean " + " or ".join(repr(name) for name in close) + "? "
