"""Latency and bandwidth histograms of L3 gets and puts, kept by :class:`L3Store`.

The store records one observation per ``get`` / ``put`` call that reached the backend:
the seconds its backend calls took (retries included; a call refused by an open breaker
is not an observation) and, when bytes moved, the bandwidth (verified or stored payload
bytes / those seconds). Buckets are fixed so that every process of a fleet reports the
same ``le`` boundaries and the series aggregate. Nothing here imports
``prometheus_client``: ``StoreStats.io`` carries plain cumulative counts that
:mod:`hicache.cache.metrics` turns into Prometheus histograms.
"""

from __future__ import annotations

import bisect
import threading
from typing import Literal, Sequence

IoOp = Literal["get", "put"]
IO_OPS: tuple[IoOp, ...] = ("get", "put")

# 100 us .. 10 s: a memory:// hit is tens of microseconds, a Redis MiB about a millisecond,
# a timeout about a second.
LATENCY_BUCKETS_S: tuple[float, ...] = (0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025,
                                        0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)
# 1 MiB/s .. 64 GiB/s in powers of two (a loopback Redis moves a few GiB/s, memcpy tens).
BANDWIDTH_BUCKETS_BPS: tuple[float, ...] = tuple(float(1 << s) for s in range(20, 37))


class Histogram:
    """Counts per bucket (upper bounds ``bounds``, then +Inf), their sum and count."""

    def __init__(self, bounds: Sequence[float]):
        assert list(bounds) == sorted(bounds) and len(set(bounds)) == len(bounds), "bounds must increase"
        self.bounds = tuple(float(b) for b in bounds)
        self._counts = [0] * (len(self.bounds) + 1)
        self._sum = 0.0

    def observe(self, value: float) -> None:
        # ``le`` semantics: a value equal to a bound falls in that bound's bucket.
        self._counts[bisect.bisect_left(self.bounds, value)] += 1
        self._sum += value

    def snapshot(self) -> dict:
        """``{"buckets": [[le, cumulative count], ..., ["+Inf", count]], "sum", "count"}``."""
        out: list[list[float | str]] = []
        acc = 0
        for bound, n in zip(self.bounds, self._counts):
            acc += n
            out.append([bound, acc])
        acc += self._counts[-1]
        out.append(["+Inf", acc])
        return {"buckets": out, "sum": self._sum, "count": acc}


class IoStats:
    """Per operation (``get``, ``put``): a latency and a bandwidth histogram. Thread-safe."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._latency = {op: Histogram(LATENCY_BUCKETS_S) for op in IO_OPS}
        self._bandwidth = {op: Histogram(BANDWIDTH_BUCKETS_BPS) for op in IO_OPS}

    def observe(self, op: IoOp, seconds: float, nbytes: int) -> None:
        """One operation: ``seconds`` in backend calls that moved ``nbytes`` payload bytes."""
        assert op in IO_OPS, op
        with self._lock:
            self._latency[op].observe(seconds)
            if nbytes > 0 and seconds > 0:
                self._bandwidth[op].observe(nbytes / seconds)

    def snapshot(self) -> dict:
        """``{"get": {"latency_seconds": hist, "bandwidth_bytes_per_second": hist}, "put": ...}``."""
        with self._lock:
            return {op: {"latency_seconds": self._latency[op].snapshot(),
                         "bandwidth_bytes_per_second": self._bandwidth[op].snapshot()} for op in IO_OPS}
