"""``memory://``: the embedded default L3, an in-process byte store with an LRU budget.

``memory://`` gives a private store; ``memory://NAME`` a store shared by every open of the
same name in this process (two caches in one process, tests). ``?capacity=4GiB`` sets the
byte budget (default 1 GiB); least recently used values are evicted to make room, and a
value larger than the whole budget is refused.

Values are copied in on put (one copy: the store must not alias pool rows that will be
reused) and copied out on get. The lock guards only the index; copies run outside it,
which is safe because stored bytes are never modified, only replaced.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from typing import Iterator, Optional, Sequence

from hicache.errors import ConfigError
from hicache.storage.backend import (STORAGE_PROTOCOL_VERSION, Accept, BackendStats, batched,
                                     exists_prefix_batched)
from hicache.storage.buffers import Value, value_views
from hicache.storage.objects import check_key

DEFAULT_MEMORY_CAPACITY = 1 << 30

_shared_lock = threading.Lock()
_shared: dict[str, "_MemoryData"] = {}


class _MemoryData:
    def __init__(self, capacity: int):
        self.capacity = capacity
        self.lock = threading.Lock()
        self.items: "OrderedDict[str, bytes]" = OrderedDict()
        self.used = 0
        self.evictions = 0
        self.refused = 0
        self.refs = 0


class MemoryBackend:
    """An in-process LRU byte store (see module doc)."""

    protocol_version = STORAGE_PROTOCOL_VERSION
    accepts_deferred = True  # put() resolves Deferred pieces itself (buffers.value_views / send_pieces)
    kind = "memory"

    def __init__(self, capacity_bytes: int = DEFAULT_MEMORY_CAPACITY, name: str = ""):
        if isinstance(capacity_bytes, bool) or not isinstance(capacity_bytes, int) or capacity_bytes <= 0:
            raise ConfigError("capacity", capacity_bytes, "must be a positive byte count")
        self.name = name
        self.url = f"memory://{name}?capacity={capacity_bytes}"
        if name:
            with _shared_lock:
                data = _shared.get(name)
                if data is None:
                    data = _shared[name] = _MemoryData(capacity_bytes)
                elif data.capacity != capacity_bytes:
                    raise ConfigError("capacity", capacity_bytes,
                                      f"memory://{name} is already open with capacity {data.capacity}")
                data.refs += 1
        else:
            data = _MemoryData(capacity_bytes)
            data.refs = 1
        self._d = data
        self._closed = False

    def exists(self, keys: Sequence[str]) -> list[bool]:
        d = self._d
        with d.lock:
            return [k in d.items for k in keys]

    def exists_prefix(self, keys: Sequence[str]) -> int:
        return exists_prefix_batched(self.exists, keys, 256)

    def get_into(self, keys: Sequence[str], values: Sequence[Value],
                 accept: Optional[Accept] = None) -> list[Optional[int]]:
        assert len(keys) == len(values), "one destination per key"
        d = self._d
        out: list[Optional[int]] = []
        for i, (key, value) in enumerate(zip(keys, values)):
            with d.lock:
                blob = d.items.get(key)
                if blob is not None:
                    d.items.move_to_end(key)
            if blob is None:
                out.append(None)
                continue
            src = memoryview(blob)
            off = 0
            for j, dst in enumerate(value_views(value, writable=True)):
                n = min(dst.nbytes, len(blob) - off)
                if n <= 0:
                    break
                dst[:n] = src[off:off + n]
                off += n
                if j == 0 and accept is not None and not accept(i, len(blob), dst):
                    break
            out.append(len(blob))
        return out

    def put(self, keys: Sequence[str], values: Sequence[Value]) -> list[bool]:
        assert len(keys) == len(values), "one value per key"
        d = self._d
        out = []
        for key, value in zip(keys, values):
            check_key(key)
            views = value_views(value, writable=False)
            total = sum(v.nbytes for v in views)
            if total > d.capacity:
                with d.lock:
                    d.refused += 1
                out.append(False)
                continue
            blob = b"".join(views)  # one copy, no zero-fill; bytes never change once stored
            with d.lock:
                old = d.items.pop(key, None)
                if old is not None:
                    d.used -= len(old)
                while d.used + total > d.capacity:
                    _, victim = d.items.popitem(last=False)
                    d.used -= len(victim)
                    d.evictions += 1
                d.items[key] = blob
                d.used += total
            out.append(True)
        return out

    def delete(self, keys: Sequence[str]) -> int:
        d = self._d
        n = 0
        with d.lock:
            for key in keys:
                blob = d.items.pop(key, None)
                if blob is not None:
                    d.used -= len(blob)
                    n += 1
        return n

    def scan(self, prefix: str = "", batch: int = 1000) -> Iterator[list[tuple[str, Optional[int]]]]:
        """Keys starting with ``prefix`` and their lengths, as of the moment of the call."""
        d = self._d
        with d.lock:
            found = [(k, len(v)) for k, v in d.items.items() if k.startswith(prefix)]
        yield from batched(found, batch)

    def stats(self) -> BackendStats:
        d = self._d
        with d.lock:
            return BackendStats(self.kind, self.url, objects=len(d.items), used_bytes=d.used,
                                capacity_bytes=d.capacity, evictions=d.evictions,
                                errors={"too_large": d.refused} if d.refused else {})

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        if self.name:
            with _shared_lock:
                self._d.refs -= 1
                if self._d.refs == 0:
                    _shared.pop(self.name, None)
