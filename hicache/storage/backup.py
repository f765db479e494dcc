"""Asynchronous backup of host pages to L3: a bounded queue and one worker thread.

The engine step must never wait for L3. :meth:`BackupQueue.submit` only appends to a queue
(under a lock held for microseconds) or, when the queue is over its bound in objects or
bytes, drops the backup and counts it: a page that is not backed up is only a missed
chance to share it, while a blocked step is latency for every request.

The caller owns the source memory (host pool rows) and must keep it unchanged until the
ticket is done; tickets tell it when::

    engine thread                         worker thread
    -------------                         -------------
    t = store.put_async(h, "page", rows)  (header + checksum computed here, off the step)
    lock rows                              exists? skip : put
    ...                                    t.stored = [...]; t done; on_done(t)
    for t in store.poll_backups():
        unlock rows of t.tag

A dropped ticket is done when returned (``ticket.dropped``) and never shows up in
``poll()``; every accepted ticket shows up exactly once.
"""

from __future__ import annotations

import threading
from collections import deque
from typing import Any, Callable, Optional, Sequence

from hicache.errors import MisuseError
from hicache.storage.buffers import Value, value_views
from hicache.storage.objects import ObjectKind, PageHash, as_kind, hash_bytes


class PutTicket:
    """One queued backup: hashes, sources, and (once done) which objects were stored."""

    def __init__(self, hashes: Sequence[PageHash], kind: ObjectKind, views: list[list[memoryview]],
                 tag: Any, on_done: Optional[Callable[["PutTicket"], None]]):
        self.hashes = [hash_bytes(h) for h in hashes]
        self.kind = kind
        self.views = views
        self.tag = tag
        self.on_done = on_done
        self.nbytes = sum(p.nbytes for pieces in views for p in pieces)
        self.dropped = False
        self.stored: Optional[list[bool]] = None  # per object, once done
        self.skipped_existing = 0
        self._done = threading.Event()

    @property
    def done(self) -> bool:
        return self._done.is_set()

    def wait(self, timeout: Optional[float] = None) -> bool:
        return self._done.wait(timeout)

    @property
    def ok(self) -> bool:
        """True when every object is now in L3 (stored now, or already there)."""
        return self.done and not self.dropped and self.stored is not None and bool(self.stored) \
            and all(self.stored)

    def __repr__(self) -> str:
        state = "dropped" if self.dropped else ("done" if self.done else "pending")
        return f"PutTicket({len(self.hashes)} {self.kind.value} objects, {state})"


class BackupQueue:
    """A bounded FIFO of :class:`PutTicket` drained by one daemon thread."""

    def __init__(self, store: Any):
        cfg = store.cfg
        self._store = store
        self.max_objects = cfg.backup_queue_objects
        self.max_bytes = cfg.backup_queue_bytes
        self.batch = cfg.backup_batch
        self.skip_existing = cfg.backup_skip_existing
        self._cv = threading.Condition()
        self._queue: deque[PutTicket] = deque()
        self._completed: deque[PutTicket] = deque()
        self._pending_objects = 0
        self._pending_bytes = 0
        self._busy = False
        self._closing = False
        self._counts = {"backup_queued": 0, "backup_dropped": 0, "backup_dropped_objects": 0,
                        "backup_stored": 0, "backup_failed": 0, "backup_skipped_existing": 0}
        self._thread = threading.Thread(target=self._run, name="hicache-l3-backup", daemon=True)
        self._thread.start()

    # -- engine side --------------------------------------------------------------------
    def submit(self, hashes: Sequence[PageHash], kind: "ObjectKind | str", srcs: Sequence[Value],
               *, tag: Any = None, on_done: Optional[Callable[[PutTicket], None]] = None) -> PutTicket:
        if len(hashes) != len(srcs):
            raise MisuseError(f"put_async: {len(hashes)} hashes but {len(srcs)} sources")
        ticket = PutTicket(hashes, as_kind(kind), [value_views(s, writable=False) for s in srcs], tag, on_done)
        n = len(ticket.hashes)
        with self._cv:
            full = (self._pending_objects + n > self.max_objects
                    or self._pending_bytes + ticket.nbytes > self.max_bytes)
            if self._closing or full or n == 0:
                if n:
                    self._counts["backup_dropped"] += 1
                    self._counts["backup_dropped_objects"] += n
                ticket.dropped = n > 0
                ticket.stored = [False] * n
                ticket._done.set()
                return ticket
            self._queue.append(ticket)
            self._pending_objects += n
            self._pending_bytes += ticket.nbytes
            self._counts["backup_queued"] += n
            self._cv.notify_all()
        return ticket

    def poll(self) -> list[PutTicket]:
        with self._cv:
            out = list(self._completed)
            self._completed.clear()
        return out

    def flush(self, timeout: Optional[float] = None) -> bool:
        with self._cv:
            return self._cv.wait_for(lambda: not self._queue and not self._busy, timeout)

    def room(self) -> int:
        """Objects a :meth:`submit` would accept now (by the object bound; 0 when closing)."""
        with self._cv:
            if self._closing:
                return 0
            return max(self.max_objects - self._pending_objects, 0)

    @property
    def pending_objects(self) -> int:
        with self._cv:
            return self._pending_objects

    @property
    def pending_bytes(self) -> int:
        with self._cv:
            return self._pending_bytes

    def counters(self) -> dict[str, int]:
        with self._cv:
            return dict(self._counts)

    def close(self, timeout: float = 5.0) -> None:
        """Let the worker finish what is queued for up to ``timeout``; drop the rest."""
        self.flush(timeout)
        with self._cv:
            self._closing = True
            leftover = list(self._queue)
            self._queue.clear()
            self._cv.notify_all()
        for t in leftover:
            self._finish(t, [False] * len(t.hashes), dropped=True)
        self._thread.join(timeout)

    # -- worker -------------------------------------------------------------------------
    def _run(self) -> None:
        while True:
            with self._cv:
                self._cv.wait_for(lambda: self._queue or self._closing)
                if not self._queue:
                    return
                ticket = self._queue.popleft()
                self._busy = True
            try:
                stored = self._store_ticket(ticket)
            except Exception:  # a bug must not kill the worker and strand every later ticket
                stored = [False] * len(ticket.hashes)
                self._store.faults.add("backup_worker_error")
            self._finish(ticket, stored)

    def _store_ticket(self, t: PutTicket) -> list[bool]:
        store = self._store
        stored: list[bool] = []
        for s in range(0, len(t.hashes), self.batch):
            hs, vs = t.hashes[s:s + self.batch], t.views[s:s + self.batch]
            have = store.exists(hs, t.kind) if self.skip_existing else [False] * len(hs)
            if any(have):  # a value a read rejected is rewritten, never skipped
                have = [h and not bad for h, bad in zip(have, store.must_overwrite(hs, t.kind))]
            todo = [i for i, h in enumerate(have) if not h]
            t.skipped_existing += len(hs) - len(todo)
            result = store.put([hs[i] for i in todo], t.kind, [vs[i] for i in todo]) if todo else []
            chunk = list(have)
            for i, ok in zip(todo, result):
                chunk[i] = ok
            stored.extend(chunk)
        return stored

    def _finish(self, t: PutTicket, stored: list[bool], dropped: bool = False) -> None:
        t.stored = stored
        t.dropped = dropped
        with self._cv:
            self._pending_objects -= len(t.hashes)
            self._pending_bytes -= t.nbytes
            if dropped:
                self._counts["backup_dropped"] += 1
                self._counts["backup_dropped_objects"] += len(t.hashes)
            else:
                self._counts["backup_stored"] += sum(stored) - t.skipped_existing
                self._counts["backup_failed"] += len(stored) - sum(stored)
                self._counts["backup_skipped_existing"] += t.skipped_existing
                self._busy = False
            self._completed.append(t)
            t._done.set()
            self._cv.notify_all()
        if t.on_done is not None:
            try:
                t.on_done(t)
            except Exception:
                self._store.faults.add("backup_callback_error")
