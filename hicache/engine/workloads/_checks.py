"""Field checks and draws shared by the synthetic workload specs (chat-style and agentic).

Bad values raise :class:`~hicache.errors.ConfigError` naming the field, so a flag or a
keyword override fails with one line.
"""

from __future__ import annotations

import numpy as np

from hicache.units import check_int as _units_check_int
from hicache.errors import ConfigError

Range = tuple[int, int]


def check_range(name: str, value: object, minimum: int) -> Range:
    """``value`` as an inclusive ``(low, high)`` pair; an integer ``n`` means ``(n, n)``."""
    pair = (value, value) if isinstance(value, int) and not isinstance(value, bool) else value
    if not (isinstance(pair, (tuple, list)) and len(pair) == 2
            and all(isinstance(v, int) and not isinstance(v, bool) for v in pair)):
        raise ConfigError(name, value, "must be an integer or a (low, high) pair of integers")
    lo, hi = int(pair[0]), int(pair[1])
    if lo < minimum or hi < lo:
        raise ConfigError(name, [lo, hi], f"needs {minimum} <= low <= high")
    return (lo, hi)


def check_int(name: str, value: object, minimum: int, *, optional: bool = False) -> None:
    """An integer >= ``minimum`` (or None when ``optional``), else ConfigError."""
    _units_check_int(name, value, minimum=minimum, optional=optional,
                    reason=f"must be an integer >= {minimum}" + (" or None" if optional else ""))


def draw(rng: np.random.Generator, rng_range: Range) -> int:
    """One integer uniform over the inclusive range."""
    return int(rng.integers(rng_range[0], rng_range[1] + 1))
