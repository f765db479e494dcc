"""Field checks and draws shared by the synthetic workload specs (chat-style and agentic).

Bad values raise :class:`~hicache.errors.ConfigError` naming the field, so a flag or a
keyword override fails with one line.

A length field is either an inclusive ``(low, high)`` range, drawn uniformly, or a
:class:`LogNormal`, drawn heavy-tailed and clipped: real prompts (pasted files, retrieved
documents, tool results) span three orders of magnitude with a long right tail, and a
cache sized for the median is judged on what it does with the tail.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from hicache.units import check_int as _units_check_int
from hicache.units import check_number
from hicache.errors import ConfigError

Range = tuple[int, int]


@dataclass(frozen=True)
class LogNormal:
    """Token counts ``round(exp(N(ln median, sigma)))`` clipped to ``[low, high]``.

    ``sigma`` sets the tail: at 1.0 one draw in 100 exceeds 10x the median, at 1.5 one in
    16. Clipping (not redrawing) keeps the draws a deterministic function of the stream
    and puts a point mass at ``high``, as a context limit does to real prompts.
    """

    median: float
    sigma: float
    low: int
    high: int

    def __post_init__(self) -> None:
        check_number("median", self.median, reason="must be a positive number of tokens")
        check_number("sigma", self.sigma, positive=False, minimum=0, reason="must be a number >= 0")
        check_int("low", self.low, 0)
        check_int("high", self.high, 1)
        if self.high < self.low:
            raise ConfigError("high", self.high, f"must be >= low ({self.low})")

    def draw(self, rng: np.random.Generator, size: int | None = None) -> np.ndarray:
        x = np.exp(rng.normal(math.log(self.median), self.sigma, size=size))
        return np.clip(np.rint(x), self.low, self.high).astype(np.int64)

    def describe(self) -> str:
        return f"lognormal(median {self.median:g}, sigma {self.sigma:g}) in [{self.low}, {self.high}]"


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


def check_length(name: str, value: object, minimum: int) -> Range | LogNormal:
    """A range (as :func:`check_range`) or a :class:`LogNormal` whose ``low`` is >= ``minimum``."""
    if isinstance(value, LogNormal):
        if value.low < minimum:
            raise ConfigError(f"{name}.low", value.low, f"must be >= {minimum}")
        return value
    return check_range(name, value, minimum)


def high(length: Range | LogNormal) -> int:
    """The largest value ``length`` can draw."""
    return length.high if isinstance(length, LogNormal) else length[1]


def check_int(name: str, value: object, minimum: int, *, optional: bool = False) -> None:
    """An integer >= ``minimum`` (or None when ``optional``), else ConfigError."""
    _units_check_int(name, value, minimum=minimum, optional=optional,
                    reason=f"must be an integer >= {minimum}" + (" or None" if optional else ""))


def check_share(name: str, value: object) -> float:
    """A probability in ``[0, 1]``, else ConfigError."""
    return check_number(name, value, positive=False, minimum=0, maximum=1, reason="must be a number in [0, 1]")


def draw(rng: np.random.Generator, rng_range: Range | LogNormal) -> int:
    """One integer: uniform over an inclusive range, or one draw of a :class:`LogNormal`."""
    if isinstance(rng_range, LogNormal):
        return int(rng_range.draw(rng))
    return int(rng.integers(rng_range[0], rng_range[1] + 1))


def draw_many(rng: np.random.Generator, rng_range: Range | LogNormal, n: int) -> np.ndarray:
    """``n`` integers (int64) drawn as :func:`draw` draws one."""
    if isinstance(rng_range, LogNormal):
        return rng_range.draw(rng, size=n)
    return rng.integers(rng_range[0], rng_range[1] + 1, size=n, dtype=np.int64)
