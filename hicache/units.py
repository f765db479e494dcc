"""Byte sizes as people write them ("8GiB", "512 MiB", 1048576) and back."""

from __future__ import annotations

import math
import re
from typing import Literal, overload

from hicache.errors import ConfigError, MisuseError

_UNITS = {
    "": 1, "b": 1,
    "k": 1000, "kb": 1000, "m": 1000**2, "mb": 1000**2, "g": 1000**3, "gb": 1000**3,
    "t": 1000**4, "tb": 1000**4,
    "kib": 1024, "mib": 1024**2, "gib": 1024**3, "tib": 1024**4,
}


def parse_bytes(value: object, field: str) -> int:
    """Parse an int or a string like ``"8GiB"`` / ``"1.5 GB"`` into a positive byte count.

    ``inf``, ``nan`` and sizes too large to be a float are errors, never an exception from
    ``int()`` further down.
    """
    if isinstance(value, bool):
        raise ConfigError(field, value, "must be a byte size like 8GiB")
    if isinstance(value, (int, float)):
        n = value
    elif isinstance(value, str):
        m = re.fullmatch(r"\s*([0-9]*\.?[0-9]+)\s*([a-zA-Z]*)\s*", value)
        if not m or m.group(2).lower() not in _UNITS:
            raise ConfigError(field, value, "must be a byte size like 8GiB, 512MiB or 1073741824")
        n = float(m.group(1)) * _UNITS[m.group(2).lower()]
    else:
        raise ConfigError(field, value, "must be a byte size like 8GiB")
    if not math.isfinite(n):
        raise ConfigError(field, value, "must be a finite byte size like 8GiB")
    if n <= 0:
        raise ConfigError(field, value, "must be > 0")
    return int(n)


def format_bytes(n: float) -> str:
    """``1536 -> '1.5 KiB'``: binary units, three significant digits."""
    n = float(n)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.3g} {unit}"
        n /= 1024
    raise AssertionError("unreachable")


# -- checked numbers: the one validator every config and API boundary uses ------------------
def _describe(minimum: float | None, maximum: float | None, what: str) -> str:
    if minimum is not None and maximum is not None:
        return f"must be {what} in [{minimum}, {maximum}]"
    if minimum is not None:
        return f"must be {what} >= {minimum}"
    return f"must be {what}" + (f" <= {maximum}" if maximum is not None else "")


@overload
def check_int(field: str, value: object, *, minimum: int | None = 0, maximum: int | None = None,
              optional: Literal[False] = False, reason: str | None = None, misuse: bool = False) -> int: ...
@overload
def check_int(field: str, value: object, *, minimum: int | None = 0, maximum: int | None = None,
              optional: bool, reason: str | None = None, misuse: bool = False) -> int | None: ...


def check_int(field: str, value: object, *, minimum: int | None = 0, maximum: int | None = None,
              optional: bool = False, reason: str | None = None, misuse: bool = False) -> int | None:
    """``value`` as an int in ``[minimum, maximum]`` (``None`` allowed when ``optional``).

    Booleans are refused (``true`` is never a count anyone meant), and so are floats,
    strings and numpy scalars of other kinds. A bad value raises :class:`ConfigError`
    naming ``field`` -- or :class:`MisuseError` with ``misuse=True``, for API arguments.
    """
    if value is None and optional:
        return None
    import numpy as np  # numpy integer scalars are ints too (ids, counts from arrays)

    if not isinstance(value, bool) and isinstance(value, (int, np.integer)):
        n = int(value)
        if (minimum is None or n >= minimum) and (maximum is None or n <= maximum):
            return n
    why = reason or _describe(minimum, maximum, "an integer")
    if misuse:
        raise MisuseError(f"{field} {why}, got {value!r}")
    raise ConfigError(field, value, why)


def check_bool(field: str, value: object) -> bool:
    """``value`` as a bool: only ``true`` / ``false`` (YAML) or ``True`` / ``False``; ``1``,
    ``"yes"`` and the like raise :class:`ConfigError` naming ``field`` (a switch someone
    spelled differently should not be read as either position)."""
    if isinstance(value, bool):
        return value
    raise ConfigError(field, value, "must be true or false")


@overload
def check_number(field: str, value: object, *, minimum: float | None = None, positive: bool = True,
                 optional: Literal[False] = False, reason: str | None = None, misuse: bool = False,
                 maximum: float | None = None) -> float: ...
@overload
def check_number(field: str, value: object, *, minimum: float | None = None, positive: bool = True,
                 optional: bool, reason: str | None = None, misuse: bool = False,
                 maximum: float | None = None) -> float | None: ...


def check_number(field: str, value: object, *, minimum: float | None = None, positive: bool = True,
                 optional: bool = False, reason: str | None = None, misuse: bool = False,
                 maximum: float | None = None) -> float | None:
    """``value`` as a finite float (``> 0`` when ``positive``, ``>= minimum`` and ``<= maximum``
    when given)."""
    if value is None and optional:
        return None
    if not isinstance(value, bool) and isinstance(value, (int, float)) and math.isfinite(value):
        x = float(value)
        if (not positive or x > 0) and (minimum is None or x >= minimum) and (maximum is None or x <= maximum):
            return x
    why = reason or ("must be a finite number" + (" > 0" if positive else "")
                     + (f" >= {minimum}" if minimum is not None else "")
                     + (f" <= {maximum}" if maximum is not None else ""))
    if misuse:
        raise MisuseError(f"{field} {why}, got {value!r}")
    raise ConfigError(field, value, why)
