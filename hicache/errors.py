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
        super().__init__(f"{where}{field}={value!r}: {reason}")


class MisuseError(HiCacheError):
    """An API was called in a way its contract forbids (e.g. freeing a free page)."""


class TransferError(HiCacheError):
    """A copy between the device and host tiers failed; the operation was not applied."""


class StorageError(HiCacheError):
    """An L3 backend operation failed (connection, timeout, protocol)."""
