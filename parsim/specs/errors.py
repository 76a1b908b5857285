"""One error type for every bad input: it names the field, the value and what is allowed."""
from __future__ import annotations


class SpecError(ValueError):
    """Invalid user input. The CLI prints ``str(err)`` and exits with code 2."""

    def __init__(self, field: str, value: object, allowed: str):
        self.field = field
        self.value = value
        self.allowed = allowed
        super().__init__(f"{field}={value!r} is invalid: {allowed}")


class SpecWarning(UserWarning):
    """A legal but questionable choice (e.g. ZeRO-2/3 with pipeline parallelism)."""
