"""The L3 backend protocol: a byte store keyed by strings, reading into caller memory.

Every backend (``memory://``, ``file://``, ``redis://`` and friends) implements
:class:`StorageBackend`. It knows nothing about pages, headers or layouts: the object codec
and :class:`hicache.storage.L3Store` add those. The contract:

* ``exists(keys) -> list[bool]`` and ``exists_prefix(keys) -> int`` (how many *leading* keys
  exist; it may stop asking at the first miss);
* ``get_into(keys, values, accept=None) -> list[int | None]``: read each value straight
  into the caller's writable buffers (a buffer or a scatter list of buffers). The result
  is the stored value's full length, or ``None`` when the key is missing. Bytes beyond the
  buffers' capacity are discarded; a shorter value leaves the tail untouched, so the
  caller compares the length with what it expected. ``accept(index, length, first)`` is
  called once the first buffer of value ``index`` is filled; when it returns False the
  rest of that value is dropped instead of written into the other buffers (the L3 store
  checks the object header there, so a foreign value never lands in a pool row);
* ``put(keys, values) -> list[bool]``: store each value (a buffer or a gather list; the
  stored value is their concatenation) without gluing the pieces together where the
  transport allows. A backend whose class sets ``accepts_deferred = True`` may also get
  :class:`~hicache.storage.buffers.Deferred` pieces (bytes made on first use, such as the
  store's checksummed header) and resolves them itself, as late as it likes; every other
  backend gets plain buffers only. False means this key was refused (no room, ``maxmemory``); it is
  counted in ``stats().errors``;
* ``delete(keys) -> int`` (keys removed), ``stats() -> BackendStats``, ``close()``;
* ``scan(prefix, batch) -> Iterator[list[(key, length)]]`` (protocol 2): every stored key
  that starts with ``prefix``, in batches of about ``batch``, with its value's length
  (``None`` for a key that holds something other than a plain value). Not a snapshot: a key
  written or removed during the scan may or may not appear, and Redis ``SCAN`` may return
  a key twice while the server resizes its table. It is for operators (``hicache l3``),
  never on the serving path; Redis backends use ``SCAN`` (never ``KEYS``), on every primary
  of a cluster.

Transport faults (unreachable, timeout, broken connection, garbage) raise the
:mod:`hicache.storage.faults` subclasses of ``StorageError``; a backend never retries
writes itself. Backends are thread-safe: the backup worker, the prefetch worker and the
engine thread call one backend concurrently.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Iterator, Optional, Protocol, Sequence, runtime_checkable

from hicache.storage.buffers import Value

STORAGE_PROTOCOL_VERSION = 2  # 2: scan() (key enumeration for operators)

# accept(index, value_length, first_buffer) -> keep reading this value?
Accept = Callable[[int, int, memoryview], bool]


@dataclass(frozen=True)
class BackendStats:
    """What a backend reports about itself (None where it cannot know)."""

    kind: str                          # "memory", "file", "redis", "redis-cluster"
    url: str                           # the URL with any password masked
    objects: Optional[int] = None      # keys held (for Redis: the whole database)
    used_bytes: Optional[int] = None
    capacity_bytes: Optional[int] = None
    evictions: int = 0                 # objects evicted to make room (memory, file)
    errors: dict[str, int] = field(default_factory=dict)   # per-key refusals by reason
    extra: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict:
        return {"kind": self.kind, "url": self.url, "objects": self.objects,
                "used_bytes": self.used_bytes, "capacity_bytes": self.capacity_bytes,
                "evictions": self.evictions, "errors": dict(self.errors), "extra": dict(self.extra)}


@runtime_checkable
class StorageBackend(Protocol):
    """Version :data:`STORAGE_PROTOCOL_VERSION` of the backend contract (see module doc)."""

    protocol_version: int
    kind: str
    url: str

    def exists(self, keys: Sequence[str]) -> list[bool]: ...

    def exists_prefix(self, keys: Sequence[str]) -> int: ...

    def get_into(self, keys: Sequence[str], values: Sequence[Value],
                 accept: Optional[Accept] = None) -> list[Optional[int]]: ...

    def put(self, keys: Sequence[str], values: Sequence[Value]) -> list[bool]: ...

    def delete(self, keys: Sequence[str]) -> int: ...

    def scan(self, prefix: str = "", batch: int = 1000) -> Iterator[list[tuple[str, Optional[int]]]]: ...

    def stats(self) -> BackendStats: ...

    def close(self) -> None: ...


def batched(items: Sequence, batch: int) -> Iterator[list]:
    """``items`` in lists of at most ``batch`` (a scan's pages for the in-process backends)."""
    for start in range(0, len(items), batch):
        yield list(items[start:start + batch])


def leading_true(flags: Sequence[bool]) -> int:
    """How many leading entries are true."""
    n = 0
    for f in flags:
        if not f:
            break
        n += 1
    return n


def exists_prefix_batched(exists, keys: Sequence[str], batch: int) -> int:
    """``exists_prefix`` on top of ``exists``: ask in batches, stop at the first miss."""
    hits = 0
    for start in range(0, len(keys), batch):
        chunk = keys[start:start + batch]
        n = leading_true(exists(chunk))
        hits += n
        if n < len(chunk):
            break
    return hits
