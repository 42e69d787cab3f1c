"""The one exception bad model input raises."""

from __future__ import annotations


class ConfigError(ValueError):
    """A config field holds a value the model cannot be built from.

    The message is one line: the field, the value, and what is allowed.
    """

    def __init__(self, field: str, value: object, allowed: str) -> None:
        self.field = field
        self.value = value
        self.allowed = allowed
        super().__init__(f"{field}={value!r} is invalid: {allowed}")
