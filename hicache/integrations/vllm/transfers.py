"""Moving chunks between vLLM's CPU primary tier and an L3 store, off the scheduler thread.

No vLLM import here: the tier (:mod:`hicache.integrations.vllm.tier`) hands over job ids,
keys already split into (block hash, group index), and primary-tier slot numbers; this
module runs the copies on worker threads and reports what finished::

    scheduler thread                      worker threads
    ----------------                      --------------
    submit(job) ---- queue ----------->   store: EXISTS per group, PUT the rest
                                          load:  GET per group into the primary rows
    poll() <------- finished queue -----  TransferDone(job_id, ok, loaded keys, ...)

A primary-tier slot is one row of ``primary`` (``strides[0]`` bytes); objects are the
rows themselves, read and written in place (no staging copy). Each KV cache group gets
its own :class:`~hicache.storage.L3Store` (its own namespace: the group's geometry is part
of the fingerprint), all on one backend and behind one circuit breaker, so a dead server
trips once for every group. An unreachable store is a failed job, never an exception.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from dataclasses import dataclass
from typing import Callable, Literal, Optional, Sequence

from hicache.storage import L3Config, L3Store, StorageBackend

log = logging.getLogger(__name__)
JobKind = Literal["store", "load"]
BlockKey = tuple[bytes, int]          # (block hash, KV cache group index)


@dataclass(frozen=True)
class TransferJob:
    """One batch of chunks: ``keys[i]`` lives in primary slot ``slots[i]``."""

    job_id: int
    kind: JobKind
    keys: tuple[bytes, ...]           # the engine's opaque keys, reported back as given
    blocks: tuple[BlockKey, ...]      # the same keys split into (hash, group)
    slots: tuple[int, ...]


@dataclass(frozen=True)
class TransferDone:
    """A finished job. ``loaded``: for a load that failed part-way, the keys that did load
    (verified into their rows); None when ``ok`` says it for all of them."""

    job_id: int
    kind: JobKind
    ok: bool
    loaded: Optional[tuple[bytes, ...]]
    seconds: float
    nbytes: int
    skipped: int = 0                  # store: keys already in L3, not rewritten


class GroupStores:
    """One :class:`L3Store` per KV cache group, on one backend and one breaker."""

    def __init__(self, backend: StorageBackend, fingerprint_for: Callable[[int], str], salt: str,
                 cfg: L3Config = L3Config()):
        self.backend = backend
        self._fingerprint_for = fingerprint_for
        self._salt = salt
        self._cfg = cfg
        self._lock = threading.Lock()
        self._stores: dict[int, L3Store] = {}

    def __call__(self, group: int) -> L3Store:
        with self._lock:
            store = self._stores.get(group)
            if store is None:
                store = L3Store(self.backend, self._fingerprint_for(group), self._salt, self._cfg)
                if self._stores:  # share the first store's breaker: one server, one health
                    store.breaker = next(iter(self._stores.values())).breaker
                self._stores[group] = store
            return store

    def all(self) -> list[L3Store]:
        with self._lock:
            return [self._stores[g] for g in sorted(self._stores)]

    def close(self) -> None:
        self.backend.close()  # the stores share it; none of them has a backup queue


def _by_group(blocks: Sequence[BlockKey]) -> dict[int, list[int]]:
    out: dict[int, list[int]] = {}
    for i, (_, group) in enumerate(blocks):
        out.setdefault(group, []).append(i)
    return out


class TransferRunner:
    """Runs store and load jobs on ``threads`` worker threads (see module doc)."""

    def __init__(self, stores: GroupStores, primary: memoryview, *, threads: int = 2):
        assert primary.strides, "the primary tier view must have a row stride"
        assert threads >= 1, threads
        self.stores = stores
        self.row_bytes = primary.strides[0]
        self._primary = primary
        self._flat = primary.cast("B") if primary.ndim != 1 or primary.format != "B" else primary
        self._num_rows = self._flat.nbytes // self.row_bytes
        self._todo: "queue.Queue[Optional[TransferJob]]" = queue.Queue()
        self._done: "queue.SimpleQueue[TransferDone]" = queue.SimpleQueue()
        self._idle = threading.Condition()
        self._in_flight = 0
        self._threads = [threading.Thread(target=self._work, name=f"hicache-vllm-tier-{i}", daemon=True)
                         for i in range(threads)]
        for t in self._threads:
            t.start()

    def row(self, slot: int) -> memoryview:
        """Primary slot ``slot`` as a writable byte view (no copy)."""
        assert 0 <= slot < self._num_rows, f"primary slot {slot} out of range [0, {self._num_rows})"
        return self._flat[slot * self.row_bytes:(slot + 1) * self.row_bytes]

    # -- scheduler thread ---------------------------------------------------------------
    def submit(self, job: TransferJob) -> None:
        """Queue a job; never blocks. Its result appears in a later :meth:`poll`."""
        assert len(job.keys) == len(job.blocks) == len(job.slots), "one slot per key"
        with self._idle:
            self._in_flight += 1
        self._todo.put(job)

    def poll(self) -> list[TransferDone]:
        """Jobs finished since the last call, in completion order."""
        out = []
        while True:
            try:
                out.append(self._done.get_nowait())
            except queue.Empty:
                return out

    @property
    def in_flight(self) -> int:
        """Jobs submitted whose result has not been produced yet."""
        with self._idle:
            return self._in_flight

    def drain(self, timeout: Optional[float] = None) -> bool:
        """Wait until every submitted job has produced its result (False on timeout)."""
        with self._idle:
            return self._idle.wait_for(lambda: self._in_flight == 0, timeout)

    def close(self) -> None:
        """Finish the queued jobs, stop the threads."""
        for _ in self._threads:
            self._todo.put(None)
        for t in self._threads:
            t.join()
        if self._flat.obj is not None and self._flat is not self._primary:
            self._flat.release()  # the engine unmaps the primary region after us

    # -- worker threads -----------------------------------------------------------------
    def _work(self) -> None:
        while True:
            job = self._todo.get()
            if job is None:
                return
            t0 = time.perf_counter()
            try:
                done = self._store(job, t0) if job.kind == "store" else self._load(job, t0)
            except Exception:  # a bug, not a store fault (L3Store turns those into values)
                log.exception("hicache vLLM tier: %s job %d failed", job.kind, job.job_id)
                done = TransferDone(job.job_id, job.kind, False, None, time.perf_counter() - t0, 0)
            self._done.put(done)
            with self._idle:
                self._in_flight -= 1
                self._idle.notify_all()

    def _store(self, job: TransferJob, t0: float) -> TransferDone:
        ok, skipped, nbytes = True, 0, 0
        for group, idxs in _by_group(job.blocks).items():
            store = self.stores(group)
            hashes = [job.blocks[i][0] for i in idxs]
            have = store.exists(hashes, "page")
            todo = [i for i, h in zip(idxs, have) if not h]
            skipped += len(idxs) - len(todo)
            if not todo:
                continue
            stored = store.put([job.blocks[i][0] for i in todo], "page", [self.row(job.slots[i]) for i in todo])
            ok = ok and all(stored)
            nbytes += sum(stored) * self.row_bytes
        return TransferDone(job.job_id, "store", ok, None, time.perf_counter() - t0, nbytes, skipped)

    def _load(self, job: TransferJob, t0: float) -> TransferDone:
        loaded: list[bytes] = []
        for group, idxs in _by_group(job.blocks).items():
            res = self.stores(group).get([job.blocks[i][0] for i in idxs], "page",
                                         [self.row(job.slots[i]) for i in idxs])
            loaded.extend(job.keys[i] for i in idxs[:res.hits])
        ok = len(loaded) == len(job.keys)
        return TransferDone(job.job_id, "load", ok, None if ok or not loaded else tuple(loaded),
                            time.perf_counter() - t0, len(loaded) * self.row_bytes)
