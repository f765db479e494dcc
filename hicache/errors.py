"""The one exception hierarchy of hicache.

Expected outcomes (a prefix miss, no free page) are *return values*, never exceptions.
Exceptions are for misuse and bad configuration, so callers can catch one base class::

    HiCacheError
     +-- ConfigError      bad layout / config / command-line value (names field and value)
     +-- MisuseError      an API called against its contract (double free, bad ids, ...)
     +-- TransferError    a copy between tiers failed
     +-- StorageError     an L3 backend failed (the cache turns these into misses)

Internal invariants use ``assert`` with a message; they indicate a bug in hicache.
"""

from __future__ import annotations

import reprlib
from typing import Any


class HiCacheError(Exception):
    """Base class of every error hicache raises on purpose."""


class ConfigError(HiCacheError, ValueError):
    """A configuration value is missing, unknown or out of range.

    ``field`` is the dotted path of the offending field (``families[2].tokens_per_row``)
    and ``value`` what was given, so the command line can print one readable line.
    """

    def __init__(self, field: str, value: Any, reason: str, *, source: str | None = None):
        self.field = field
        self.value = value
        self.reason = reason
        self.source = source
        where = f"{source}: " if source else ""
        super().__init__(f"{where}{field}={short_repr(value)}: {reason}")


class MisuseError(HiCacheError):
    """An API was called in a way its contract forbids (e.g. freeing a free page)."""


class TransferError(HiCacheError):
    """A copy between the device and host tiers failed; the operation was not applied."""


class StorageError(HiCacheError):
    """An L3 backend operation failed (connection, timeout, protocol)."""


class _ShortRepr(reprlib.Repr):
    """``repr`` cut to a readable size. An error message repeats the value it refuses, and a
    hostile value -- a YAML alias bomb, a list nested 10,000 deep, a 5,000-digit integer
    (whose plain ``repr`` raises ValueError) -- must still make one short line."""

    def __init__(self) -> None:
        super().__init__()
        self.maxlevel, self.maxstring, self.maxother, self.maxlong = 3, 400, 200, 200
        self.maxlist = self.maxtuple = self.maxset = self.maxfrozenset = self.maxdeque = 64
        self.maxdict = 16

    def repr_int(self, x: int, level: int) -> str:
        if x.bit_length() > 1000:
            return f"<an integer of about {int(x.bit_length() * 0.30103) + 1} digits>"
        return super().repr_int(x, level)


_SHORT = _ShortRepr()
MAX_REPR = 600


def short_repr(value: Any) -> str:
    """``repr(value)``, bounded in length and in the work it takes (see :class:`_ShortRepr`)."""
    if isinstance(value, str) and len(value) <= 2000:
        return repr(value)
    text = _SHORT.repr(value)
    return text if len(text) <= MAX_REPR else text[:MAX_REPR - 3] + "..."
