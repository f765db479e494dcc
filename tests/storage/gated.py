"""A backend wrapper whose calls wait on a gate, to hold the workers mid-operation."""

from __future__ import annotations

import threading

from hicache.storage.backend import STORAGE_PROTOCOL_VERSION


class Gate:
    """Open (``set``), closed (``clear``), or closed with ``allow(n)`` calls let through."""

    def __init__(self):
        self._cv = threading.Condition()
        self._open = True
        self._permits = 0

    def set(self):
        with self._cv:
            self._open = True
            self._cv.notify_all()

    def clear(self):
        with self._cv:
            self._open = False

    def allow(self, n: int):
        with self._cv:
            self._permits += n
            self._cv.notify_all()

    def wait(self, timeout: float) -> bool:
        with self._cv:
            ok = self._cv.wait_for(lambda: self._open or self._permits > 0, timeout)
            if ok and not self._open:
                self._permits -= 1
            return ok


class ForwardingBackend:
    """Forwards every backend call to ``inner``; ``_before(op, n)`` runs ahead of the
    calls that move data (exists, exists_prefix, get_into, put), for subclasses to hook."""

    protocol_version = STORAGE_PROTOCOL_VERSION
    kind = "forwarding"
    url = "forwarding://"

    def __init__(self, inner):
        self.inner = inner

    def _before(self, op, n):
        pass

    def exists(self, keys):
        self._before("exists", len(keys))
        return self.inner.exists(keys)

    def exists_prefix(self, keys):
        self._before("exists_prefix", len(keys))
        return self.inner.exists_prefix(keys)

    def get_into(self, keys, values, accept=None):
        self._before("get_into", len(keys))
        return self.inner.get_into(keys, values, accept)

    def put(self, keys, values):
        self._before("put", len(keys))
        return self.inner.put(keys, values)

    def delete(self, keys):
        return self.inner.delete(keys)

    def scan(self, prefix="", batch=1000):
        return self.inner.scan(prefix, batch)

    def stats(self):
        return self.inner.stats()

    def close(self):
        self.inner.close()


class GatedBackend(ForwardingBackend):
    kind = "gated"
    url = "gated://"

    def __init__(self, inner, gate_ops=("get_into", "put")):
        super().__init__(inner)
        self.gate = Gate()
        self.gate_ops = set(gate_ops)
        self.entered = threading.Semaphore(0)
        self.calls: list[tuple[str, int]] = []

    def _before(self, op, n):
        self.calls.append((op, n))
        if op in self.gate_ops:
            self.entered.release()
            assert self.gate.wait(30), "test gate never opened"

    def close(self):
        self.gate.set()
        super().close()
