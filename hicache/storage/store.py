"""The L3 store: page and state objects of one layout in one backend, behind a breaker.

:class:`L3Store` is what the cache talks to. It turns page hashes into keys, adds and
checks the object header, counts every hit, rejection and fault, and never raises for a
store that misbehaves: a fault or an open breaker is a miss (reads) or a refusal (writes).
Misuse (bad hashes, wrong buffer counts) still raises.

Reading into pool rows without a second copy::

    backend value:  [ 64-byte header | payload ..................... ]
                          |                |
    get_into views: [ staging[i] ]  [ dst[i] (the caller's pool row) ]
                          |
                   accept(): header checked before the payload is read;
                   a foreign / wrong-size value is dropped, never written into dst[i]

The payload checksum can only be checked once the payload is in ``dst[i]``; a mismatch
makes that object (and everything after it) a miss, so the caller must treat rows past
``GetResult.hits`` as garbage: free them, never publish them.

Scatter/gather objects: a destination (or source) may also be a list of buffers, and the
object's payload is their concatenation, checksummed over the list. An engine whose page
lives in several regions (SGLang's ``page_first`` host page: its K and V halves;
``layer_first``: one piece per layer and K/V) then moves it without a staging copy; the
Redis path reads each piece straight from the socket into its region.
"""

from __future__ import annotations

import threading
import time
from collections import Counter
from dataclasses import dataclass, field
from functools import partial
from typing import TYPE_CHECKING, Any, Callable, Optional, Sequence

from hicache.errors import MisuseError, StorageError
from hicache.storage.backend import StorageBackend
from hicache.storage.buffers import Deferred, Value, value_views
from hicache.storage.config import L3Config
from hicache.storage.faults import TRANSPORT_FAULTS, CircuitBreaker, FaultCounter, fault_name
from hicache.storage.iostats import IO_OPS, IoStats
from hicache.storage.auth import ObjectKeys
from hicache.storage.objects import ObjectCodec, ObjectKind, PageHash, Reject, as_kind

if TYPE_CHECKING:  # imported on first use at run time
    from hicache.storage.backup import BackupQueue


# Rejections that mean the stored value is bad for this key (deleted and rewritten).
# Another format version, or a checksum this process cannot compute, is left alone: the
# value may be fine for the process that wrote it.
REPAIRABLE = frozenset({Reject.TRUNCATED, Reject.CORRUPT, Reject.FOREIGN, Reject.WRONG_SIZE,
                        Reject.UNAUTHENTICATED})


@dataclass(frozen=True)
class GetResult:
    """``hits`` leading objects were read and verified into their destinations.

    ``stopped`` says why the prefix ended before the last hash: ``None`` (all hit),
    ``"missing"`` (the key is gone: evicted after a lookup, say), a :class:`Reject` value,
    ``"fault"`` (the backend failed) or ``"breaker_open"``.
    """

    hits: int
    nbytes: int
    stopped: Optional[str] = None


@dataclass(frozen=True)
class StoreStats:
    """Counters of one store (monotonic since it opened) plus the backend's own."""

    namespace: str
    counters: dict[str, int]
    rejected: dict[str, int]
    faults: dict[str, int]
    breaker_state: str
    breaker_trips: int
    breaker_refused: int
    backup_pending_objects: int
    backup_pending_bytes: int
    backend: Optional[dict[str, Any]] = None
    extra: dict[str, Any] = field(default_factory=dict)
    # get/put latency and bandwidth histograms (hicache.storage.iostats.IoStats.snapshot)
    io: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict:
        return {"namespace": self.namespace, "counters": dict(self.counters), "rejected": dict(self.rejected),
                "faults": dict(self.faults), "breaker": {"state": self.breaker_state,
                                                         "trips": self.breaker_trips,
                                                         "refused": self.breaker_refused},
                "backup_pending_objects": self.backup_pending_objects,
                "backup_pending_bytes": self.backup_pending_bytes, "backend": self.backend,
                "io": self.io, **({"last_fault": self.extra["last_fault"]} if "last_fault" in self.extra else {})}


class L3Store:
    """Objects of one namespace (layout fingerprint + salt) in one backend."""

    def __init__(self, backend: StorageBackend, fingerprint: str, salt: str = "",
                 cfg: L3Config = L3Config(), *, clock: Callable[[], float] = time.monotonic,
                 breaker: Optional[CircuitBreaker] = None, keys: Optional[ObjectKeys] = None):
        """``breaker``: share one breaker between stores on the same backend (an engine
        integration keeps one namespace per pool), so a dead server trips once for all.
        ``keys``: the MAC keys, else read from ``cfg.auth_key`` when set (authenticated
        objects, :mod:`hicache.storage.auth`)."""
        self.backend = backend
        self.cfg = cfg
        if keys is None and cfg.auth_key is not None:
            keys = ObjectKeys.load(cfg.auth_key)
        self.codec = ObjectCodec(fingerprint, salt, keys=keys)
        self.breaker = breaker or CircuitBreaker(cfg.breaker_threshold, cfg.breaker_cooldown_s,
                                                 cfg.breaker_max_cooldown_s, clock=clock)
        self.faults = FaultCounter()      # by type: timeout, connection, protocol, server
        self.rejected = FaultCounter()    # by Reject reason
        self._lock = threading.Lock()
        self._counts: Counter[str] = Counter()
        self._backup: Optional[BackupQueue] = None
        self._closed = False
        # Keys whose value a read rejected (corrupt, truncated, foreign): deleted at once,
        # and overwritten by the next backup even if the delete failed -- a bad object must
        # never block its page (and every later page of the chain) for good.
        self._bad_keys: set[str] = set()
        self.io = IoStats()               # get/put latency and bandwidth histograms
        self._io_pending = threading.local()  # backend seconds of this thread's get/put so far
        self._last_fault = ""   # the newest fault's message, one line: what an operator reads first

    @property
    def namespace(self) -> str:
        return self.codec.namespace

    def key(self, h: PageHash, kind: "ObjectKind | str" = ObjectKind.PAGE) -> str:
        """``{namespace}:{p|s}:{hash hex}``."""
        return self.codec.key(h, kind)

    def _count(self, **kw: int) -> None:
        """Add to the counters. A get's or put's totals (``gets=1, get_bytes=...``) also close
        its histogram observation: the seconds :meth:`_call` timed on this thread for it."""
        with self._lock:
            for k, v in kw.items():
                self._counts[k] += v
        for op in IO_OPS:
            if f"{op}s" in kw:
                seconds = getattr(self._io_pending, op, None)
                if seconds is not None:
                    setattr(self._io_pending, op, None)
                    self.io.observe(op, seconds, kw.get(f"{op}_bytes", 0))

    # -- guarded backend calls ----------------------------------------------------------
    def _call(self, op: str, fn: Callable[[], Any], *, retry: bool) -> tuple[bool, Any]:
        """Run one backend call behind the breaker. Returns (ok, result); on failure the
        result is ``"breaker_open"`` (refused without a call) or ``"fault"``."""
        attempts = 1 + (self.cfg.read_retries if retry else 0)
        for attempt in range(attempts):
            if not self.breaker.allow():
                self._count(**{f"{op}_short_circuited": 1})
                return False, "breaker_open"
            t0 = time.perf_counter()
            try:
                result = fn()
            except StorageError as exc:
                self._add_io_time(op, t0)
                msg = str(exc).strip()
                self._last_fault = f"{op}: {msg.splitlines()[0] if msg else type(exc).__name__}"[:300]
                self.faults.add(fault_name(exc))
                self.faults.add(f"{op}.{fault_name(exc)}")
                if isinstance(exc, TRANSPORT_FAULTS):
                    self.breaker.record_failure()
                    if attempt + 1 < attempts:
                        self._count(**{f"{op}_retries": 1})
                        continue
                return False, "fault"
            self._add_io_time(op, t0)
            self.breaker.record_success()
            return True, result
        raise AssertionError("unreachable: the loop returns")

    def _add_io_time(self, op: str, t0: float) -> None:
        if op in IO_OPS:
            seconds = time.perf_counter() - t0
            setattr(self._io_pending, op, (getattr(self._io_pending, op, None) or 0.0) + seconds)

    # -- reads --------------------------------------------------------------------------
    def lookup(self, hashes: Sequence[PageHash], kind: "ObjectKind | str" = ObjectKind.PAGE) -> int:
        """How many leading objects of the hash chain L3 holds (0 on any fault)."""
        if not hashes:
            return 0
        keys = [self.key(h, kind) for h in hashes]
        hits = 0
        for start in range(0, len(keys), self.cfg.lookup_batch):
            chunk = keys[start:start + self.cfg.lookup_batch]
            ok, n = self._call("lookup", lambda: self.backend.exists_prefix(chunk), retry=True)
            n = n if ok else 0
            hits += n
            if n < len(chunk):
                break
        self._count(lookups=1, lookup_keys=len(keys), lookup_hits=hits)
        return hits

    def exists(self, hashes: Sequence[PageHash], kind: "ObjectKind | str" = ObjectKind.STATE) -> list[bool]:
        """Which of the objects exist (all False on a fault). Used to find state snapshots."""
        if not hashes:
            return []
        keys = [self.key(h, kind) for h in hashes]
        ok, flags = self._call("lookup", lambda: self.backend.exists(keys), retry=True)
        return list(flags) if ok else [False] * len(keys)

    def get(self, hashes: Sequence[PageHash], kind: "ObjectKind | str", dsts: Sequence[Value],
            *, progress: Optional[Callable[[int], bool]] = None) -> GetResult:
        """Read the leading verified objects into ``dsts``: one payload per hash, each a
        buffer or a scatter list of buffers (filled in order; sizes must add up to the
        stored payload, else the object is rejected as ``wrong_size``).

        Reads ``read_batch`` objects per backend call; after each batch ``progress(hits)``
        is called and may return False to stop early (a cancelled prefetch). Objects after
        the first missing, rejected or failed one are not counted, whatever was read.
        """
        kind = as_kind(kind)
        if len(hashes) != len(dsts):
            raise MisuseError(f"get: {len(hashes)} hashes but {len(dsts)} destinations")
        views = [value_views(d, writable=True) for d in dsts]
        sizes = [sum(v.nbytes for v in pieces) for pieces in views]
        hits = nbytes = 0
        stopped: Optional[str] = None
        batch = self.cfg.read_batch
        for start in range(0, len(hashes), batch):
            hs = hashes[start:start + batch]
            dv = views[start:start + batch]
            dn = sizes[start:start + batch]
            hb = self.codec.header_bytes
            staging = bytearray(hb * len(hs))
            sv = memoryview(staging)
            heads = [sv[i * hb:(i + 1) * hb] for i in range(len(hs))]
            verdict: list[Any] = [None] * len(hs)

            def accept(i: int, length: int, head: memoryview) -> bool:
                reason, token = self.codec.check_header(head, hs[i], kind, length, dn[i])
                verdict[i] = reason if reason is not None else token
                return reason is None

            keys = [self.key(h, kind) for h in hs]
            ok, lengths = self._call("get", lambda: self.backend.get_into(
                keys, [[heads[i], *dv[i]] for i in range(len(hs))], accept), retry=True)
            if not ok:
                stopped = lengths  # "breaker_open" or "fault"
                break
            for i, length in enumerate(lengths):
                if length is None:
                    stopped = "missing"
                    break
                v = verdict[i]
                if v is None:  # accept was not called: the value ended inside the header
                    v, _ = self.codec.check_header(heads[i], hs[i], kind, length, dn[i])
                    v = v or Reject.TRUNCATED
                if not isinstance(v, Reject):
                    v = self.codec.check_payload(dv[i], v, heads[i]) or v
                if isinstance(v, Reject):
                    stopped = v.value
                    self.rejected.add(v.value)
                    if v in REPAIRABLE:
                        self._repair(keys[i])
                    break
                hits += 1
                nbytes += dn[i]
            if stopped is not None:
                break
            if progress is not None and not progress(hits):
                stopped = "cancelled"
                break
        self._count(gets=1, get_objects=len(hashes), get_hits=hits, get_bytes=nbytes,
                    **({f"get_stopped_{stopped}": 1} if stopped else {}))
        return GetResult(hits, nbytes, stopped)

    # -- writes -------------------------------------------------------------------------
    def put(self, hashes: Sequence[PageHash], kind: "ObjectKind | str", srcs: Sequence[Value]) -> list[bool]:
        """Store objects synchronously (no retry); False where refused, failed or short-circuited.

        Each source is a buffer or a gather list of buffers (the payload is their
        concatenation; nothing is glued together on the way).
        """
        kind = as_kind(kind)
        if len(hashes) != len(srcs):
            raise MisuseError(f"put: {len(hashes)} hashes but {len(srcs)} sources")
        if not hashes:
            return []
        views = [value_views(s, writable=False) for s in srcs]
        keys = [self.key(h, kind) for h in hashes]
        # Deferred headers: a streaming backend hashes each payload just before sending it.
        if getattr(self.backend, "accepts_deferred", False):
            values = [[Deferred(self.codec.header_bytes, partial(self.codec.header, h, kind, v)), *v]
                      for h, v in zip(hashes, views)]
        else:  # a backend written to the plain contract gets bytes
            values = [[self.codec.header(h, kind, v), *v] for h, v in zip(hashes, views)]
        ok, stored = self._call("put", lambda: self.backend.put(keys, values), retry=False)
        stored = list(stored) if ok else [False] * len(keys)
        if self._bad_keys:
            with self._lock:
                self._bad_keys.difference_update(k for k, s in zip(keys, stored) if s)
        good = sum(stored)
        self._count(puts=1, put_objects=len(keys), put_ok=good, put_failed=len(keys) - good,
                    put_bytes=sum(sum(p.nbytes for p in v) for v, s in zip(views, stored) if s))
        return stored

    def _repair(self, key: str) -> None:
        """A read rejected ``key``'s value: delete it and let the next backup overwrite it."""
        with self._lock:
            if len(self._bad_keys) < 65536:
                self._bad_keys.add(key)
        ok, n = self._call("delete", lambda: self.backend.delete([key]), retry=False)
        self._count(repaired_deleted=int(bool(ok and n)))

    def must_overwrite(self, hashes: Sequence[PageHash], kind: "ObjectKind | str") -> list[bool]:
        """Per object: was its stored value rejected by a read (so a backup must rewrite it)?"""
        with self._lock:
            if not self._bad_keys:
                return [False] * len(hashes)
            return [self.key(h, kind) in self._bad_keys for h in hashes]

    def backup_room(self) -> int:
        """Objects worth queueing for backup now: the queue's room while the breaker is
        closed, one object (a probe) once an open breaker's cooldown has passed, else 0."""
        if self._closed or not self.breaker.would_allow():
            return 0
        room = self.backup.room()
        return room if self.breaker.state == "closed" else min(room, 1)

    def delete(self, hashes: Sequence[PageHash], kind: "ObjectKind | str" = ObjectKind.PAGE) -> int:
        keys = [self.key(h, kind) for h in hashes]
        ok, n = self._call("delete", lambda: self.backend.delete(keys), retry=False)
        return n if ok else 0

    # -- asynchronous backup ------------------------------------------------------------
    @property
    def backup(self) -> BackupQueue:
        """The bounded backup queue (started on first use)."""
        if self._backup is None:
            from hicache.storage.backup import BackupQueue

            with self._lock:
                if self._backup is None:
                    self._backup = BackupQueue(self)
        return self._backup

    def put_async(self, hashes: Sequence[PageHash], kind: "ObjectKind | str", srcs: Sequence[Value],
                  *, tag: Any = None, on_done: Optional[Callable] = None):
        """Queue a backup; never blocks. Returns a :class:`~hicache.storage.backup.PutTicket`.

        The caller keeps ``srcs`` alive and unchanged until the ticket is done (poll
        :meth:`poll_backups` or pass ``on_done``, which runs on the worker thread). A ticket
        dropped under backpressure is already done when returned (``ticket.dropped``).
        """
        return self.backup.submit(hashes, kind, srcs, tag=tag, on_done=on_done)

    def poll_backups(self) -> list:
        """Tickets accepted by :meth:`put_async` that completed since the last poll."""
        return [] if self._backup is None else self._backup.poll()

    def flush(self, timeout: Optional[float] = None) -> bool:
        """Wait until every queued backup is done; False if ``timeout`` passed first."""
        return True if self._backup is None else self._backup.flush(timeout)

    # -- stats and lifetime -------------------------------------------------------------
    def stats(self, *, backend: bool = True) -> StoreStats:
        """Counters; ``backend=True`` also asks the backend (a round trip for Redis)."""
        bstats = None
        if backend and self.breaker.state == "closed":
            ok, st = self._call("stats", self.backend.stats, retry=False)
            bstats = st.to_dict() if ok else None
        with self._lock:
            counts = dict(sorted(self._counts.items()))
        bq = self._backup
        if bq is not None:
            counts.update(bq.counters())
        return StoreStats(self.namespace, counts, self.rejected.snapshot(), self.faults.snapshot(),
                          self.breaker.state, self.breaker.trips, self.breaker.refused,
                          bq.pending_objects if bq else 0, bq.pending_bytes if bq else 0, bstats,
                          extra={"last_fault": self._last_fault} if self._last_fault else {}, io=self.io.snapshot())

    def close(self, timeout: float = 5.0) -> None:
        """Finish queued backups (up to ``timeout``), drop the rest, close the backend."""
        if self._closed:
            return
        self._closed = True
        if self._backup is not None:
            self._backup.close(timeout)
        self.backend.close()

    def __enter__(self) -> "L3Store":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
