"""One error type for every bad input: it names the field, the value and what is allowed."""
from __future__ import annotations

import numbers
import reprlib


class _ShortRepr(reprlib.Repr):
    """``repr`` cut to a line: long strings, big collections and huge integers are abbreviated
    (a pasted file, a YAML alias bomb or a 10**5000 value must not become the message)."""

    def __init__(self) -> None:
        super().__init__()
        self.maxstring = self.maxother = self.maxlong = 200
        self.maxlist = self.maxtuple = self.maxdict = self.maxset = self.maxfrozenset = 16
        self.maxlevel = 2

    def repr_int(self, x: int, level: int) -> str:
        if x.bit_length() > 640:
            return f"<an integer of about {int(x.bit_length() * 0.30103)} digits>"   # log10(2) digits per bit
        return super().repr_int(x, level)


_REPR = _ShortRepr()
MAX_SHOWN = 300    # characters of a value a message shows at most


def _short(value: object) -> str:
    text = _REPR.repr(value)
    return text if len(text) <= MAX_SHOWN else f"{text[:MAX_SHOWN - 3]}..."


class SpecError(ValueError):
    """Invalid user input. The CLI prints ``str(err)`` and exits with code 2.

    ``args`` are ``(field, value, allowed)`` so that ``type(e)(*e.args)`` rebuilds the error:
    SimPy re-raises an exception from inside a process that way (``simpy.events``), and pickling
    (worker processes) does too."""

    def __init__(self, field: str, value: object, allowed: str):
        self.field = field
        self.value = value
        self.allowed = allowed
        super().__init__(field, value, allowed)

    def __str__(self) -> str:
        return f"{self.field}={_short(self.value)} is invalid: {self.allowed}"


class SpecWarning(UserWarning):
    """A legal but questionable choice (e.g. ZeRO-2/3 with pipeline parallelism)."""


def checked_int(field: str, value: object, low: int, allowed: str, high: int | None = None) -> int:
    """``value`` as an int in [low, high], else a SpecError naming ``field``: an integer (Python's
    or numpy's; not a bool; an integral float such as 8.0 is taken), as the API's keyword
    arguments and a profile's counts take them."""
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    if isinstance(value, bool) or not isinstance(value, numbers.Integral) or int(value) < low or (
            high is not None and int(value) > high):
        raise SpecError(field, value, allowed)
    return int(value)
