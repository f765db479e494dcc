"""Seeded random streams that are the same in every process.

Every draw of a workload comes from a stream named by the user's seed plus a label
(``"arrivals"``, ``"conversation", 17``, ...). Labels are hashed with BLAKE2b, never with
Python's ``hash()`` (salted per process), so one ``(seed, labels)`` gives one stream on every
machine, and adding a new kind of draw never shifts the draws of another.
"""

from __future__ import annotations

import hashlib

import numpy as np

_MASK64 = np.uint64(0xFFFFFFFFFFFFFFFF)


def stable_u64(*parts: object) -> int:
    """A 64-bit integer digest of ``parts`` (their ``repr``), stable across processes."""
    h = hashlib.blake2b(digest_size=8, person=b"hicache-wl-v1")
    for part in parts:
        h.update(repr(part).encode("utf-8"))
        h.update(b"\x1f")
    return int.from_bytes(h.digest(), "little")


def stream(seed: int, *labels: object) -> np.random.Generator:
    """The random generator for ``labels`` under ``seed`` (PCG64)."""
    return np.random.Generator(np.random.PCG64(np.random.SeedSequence([seed & 0xFFFFFFFFFFFFFFFF,
                                                                        stable_u64(*labels)])))


def mix64(x: np.ndarray) -> np.ndarray:
    """SplitMix64's finaliser over a uint64 array: a fast, well-spread bijection."""
    x = x.astype(np.uint64, copy=True)
    x ^= x >> np.uint64(30)
    x *= np.uint64(0xBF58476D1CE4E5B9)
    x ^= x >> np.uint64(27)
    x *= np.uint64(0x94D049BB133111EB)
    x ^= x >> np.uint64(31)
    return x


def counter_tokens(key: int, n: int, *, low: int, high: int) -> np.ndarray:
    """``n`` token ids in ``[low, high)`` derived from ``key`` alone (counter-mode hashing).

    Token ``i`` depends only on ``(key, i)``, so the first ``m`` tokens of a block are the
    same whether ``n`` is ``m`` or more: a partial block is a prefix of the full one.
    """
    golden = np.uint64(0x9E3779B97F4A7C15)
    counters = (np.arange(1, n + 1, dtype=np.uint64) * golden) + np.uint64(key & 0xFFFFFFFFFFFFFFFF)
    return (low + mix64(counters) % np.uint64(high - low)).astype(np.int32)
