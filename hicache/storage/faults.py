"""Transport faults, their counters, and the circuit breaker that turns L3 into "always miss".

A dead or slow L3 must never stall the engine. Three things make sure of that:

* every backend call runs under short socket timeouts (connect and per-operation, set by
  the backend), so one call costs at most a timeout;
* faults are typed (:class:`StorageTimeout`, :class:`StorageConnectionError`,
  :class:`StorageProtocolError`, :class:`StorageServerError`) and counted by type;
* a :class:`CircuitBreaker` opens after ``threshold`` consecutive transport faults; while
  open, every call is refused at once (a miss), and after ``cooldown_s`` one caller is let
  through as a probe (half-open). A successful probe closes the breaker; a failed one opens
  it again with the cooldown doubled (up to ``max_cooldown_s``). So an absent server costs
  one timeout per cooldown, never one per call::

        closed --(threshold consecutive faults)--> open --(cooldown elapsed)--> half_open
          ^                                          ^                            |
          +---------------(probe succeeds)-----------+-------(probe fails)--------+

A server that answers with an error for one key (``-OOM`` when ``maxmemory`` is reached,
``-WRONGTYPE``) is reachable: that is a per-key refusal, counted, and does not trip the
breaker.
"""

from __future__ import annotations

import threading
import time
from collections import Counter
from typing import Callable

from hicache.errors import StorageError


class StorageTimeout(StorageError):
    """A connect or an operation exceeded its timeout."""


class StorageConnectionError(StorageError):
    """The server could not be reached, or the connection broke mid-operation."""


class StorageProtocolError(StorageError):
    """The server answered something the client could not parse."""


class StorageServerError(StorageError):
    """The server answered a whole operation with an error (e.g. ``-NOAUTH``)."""


# Faults that mean "the store is unreachable or unhealthy": they trip the breaker.
TRANSPORT_FAULTS = (StorageTimeout, StorageConnectionError, StorageProtocolError)


def fault_name(exc: BaseException) -> str:
    """The counter name of a fault: ``timeout``, ``connection``, ``protocol``, ``server``."""
    if isinstance(exc, StorageTimeout):
        return "timeout"
    if isinstance(exc, StorageConnectionError):
        return "connection"
    if isinstance(exc, StorageProtocolError):
        return "protocol"
    if isinstance(exc, StorageServerError):
        return "server"
    return "other"


class FaultCounter:
    """Thread-safe counters by name (faults by type, rejected values by reason)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._counts: Counter[str] = Counter()

    def add(self, name: str, n: int = 1) -> None:
        if n:
            with self._lock:
                self._counts[name] += n

    def get(self, name: str) -> int:
        with self._lock:
            return self._counts[name]

    def snapshot(self) -> dict[str, int]:
        with self._lock:
            return dict(sorted(self._counts.items()))


BREAKER_STATES = ("closed", "open", "half_open")


class CircuitBreaker:
    """closed -> open after ``threshold`` consecutive faults -> half-open probe after a delay.

    ``allow()`` is asked before each backend call; when it says False the caller treats
    the call as a miss without touching the network. In the half-open state exactly one
    caller gets True (the probe); the others keep getting False until the probe reports.
    """

    def __init__(self, threshold: int = 3, cooldown_s: float = 1.0, max_cooldown_s: float = 30.0,
                 clock: Callable[[], float] = time.monotonic):
        assert threshold >= 1, "breaker threshold must be >= 1"
        assert 0 < cooldown_s <= max_cooldown_s, "need 0 < cooldown_s <= max_cooldown_s"
        self.threshold = threshold
        self.base_cooldown_s = cooldown_s
        self.max_cooldown_s = max_cooldown_s
        self._clock = clock
        self._lock = threading.Lock()
        self._state = "closed"
        self._consecutive = 0
        self._cooldown = cooldown_s
        self._reopen_at = 0.0
        self._probe_out = False
        self.trips = 0
        self.probes = 0
        self.refused = 0

    @property
    def state(self) -> str:
        with self._lock:
            return self._state

    def allow(self) -> bool:
        with self._lock:
            if self._state == "closed":
                return True
            if self._state == "open" and self._clock() >= self._reopen_at:
                self._state = "half_open"
                self._probe_out = False
            if self._state == "half_open" and not self._probe_out:
                self._probe_out = True
                self.probes += 1
                return True
            self.refused += 1
            return False

    def would_allow(self) -> bool:
        """Would :meth:`allow` say True now? (Asks without taking the probe.)"""
        with self._lock:
            if self._state == "closed":
                return True
            if self._state == "open":
                return self._clock() >= self._reopen_at
            return not self._probe_out

    def record_success(self) -> None:
        with self._lock:
            self._consecutive = 0
            if self._state != "closed":
                self._state = "closed"
                self._cooldown = self.base_cooldown_s
                self._probe_out = False

    def record_failure(self) -> None:
        with self._lock:
            self._consecutive += 1
            if self._state == "half_open":
                # The probe failed: back off further before the next one.
                self._cooldown = min(self._cooldown * 2, self.max_cooldown_s)
                self._open()
            elif self._state == "closed" and self._consecutive >= self.threshold:
                self._open()

    def _open(self) -> None:
        self._state = "open"
        self._probe_out = False
        self._reopen_at = self._clock() + self._cooldown
        self.trips += 1
