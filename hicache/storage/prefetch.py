"""Prefetch from L3 into host memory: lookup, plan, fetch, take -- without blocking a step.

The tree (someone else's layer) owns host rows and nodes; this module owns the L3 side and
hands the caller decisions at points where the caller's own thread can act::

    caller (engine thread)                      prefetch worker
    ----------------------                      ---------------
    op = prefetcher.start(hashes, need_state)   lookup pages in batches (leading hits);
                                                if need_state, probe state objects from
                                                the deepest hit backwards; cut the plan to
                                                the host-memory cap; apply the threshold
    op.status == PLANNED (poll, or wait_planned)
    rows = alloc exactly op.plan.pages (+1 snapshot)
    op.fetch(page_rows, state_row)              read state first, then pages in batches,
                                                verifying each; progress after each batch
    res = op.take()   # policy decides waiting
    insert res.usable_pages pages as host nodes
    once op.settled: free the other rows        (the worker never touches rows after settled)

History and state are fetched together or not used: when the plan has a state snapshot,
``usable_pages`` is either all planned pages (every page and the snapshot verified) or 0.
Without state (MHA, MLA), any verified leading run of pages is usable.

``take()`` applies the policy: ``best_effort`` uses what is complete now, ``wait_complete``
waits for the end, ``timeout`` waits until ``timeout_s`` after ``start``. Whatever is not
complete at that point is cancelled; rows past ``usable_pages`` may still be written until
``settled`` (the current batch finishes), so free them only then.

The host-memory cap (``max_host_bytes``) counts the bytes of every plan from the moment it
is made until its op is both taken and settled (or cancelled before fetching).
"""

from __future__ import annotations

import threading
import time
import weakref
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from enum import Enum
from typing import Callable, Optional, Sequence

from hicache.errors import MisuseError
from hicache.layout import CacheLayout
from hicache.storage.buffers import Value
from hicache.storage.config import PrefetchConfig
from hicache.storage.objects import ObjectKind, PageHash, hash_bytes
from hicache.storage.store import L3Store


class PrefetchStatus(str, Enum):
    LOOKUP = "lookup"        # the worker is asking L3 what exists
    PLANNED = "planned"      # plan ready: the caller allocates rows and calls fetch()
    FETCHING = "fetching"
    DONE = "done"            # fetch finished (fully or not: see progress)
    SKIPPED = "skipped"      # nothing worth fetching (see skip_reason)
    CANCELLED = "cancelled"


@dataclass(frozen=True)
class PrefetchPlan:
    """Fetch the first ``pages`` pages; ``state_index`` is the page after which the state
    snapshot to fetch sits (``pages - 1``), or None for layouts without state."""

    pages: int
    state_index: Optional[int]
    page_bytes: int
    state_bytes: int
    l3_pages: int  # leading pages L3 holds before the state and memory cuts

    @property
    def nbytes(self) -> int:
        return self.pages * self.page_bytes + (self.state_bytes if self.state_index is not None else 0)


@dataclass(frozen=True)
class PrefetchResult:
    """What the caller may use: the first ``usable_pages`` page rows (and the state row
    when ``state_ok``) hold verified bytes. ``complete``: everything planned arrived."""

    usable_pages: int
    state_ok: bool
    fetched_pages: int
    complete: bool
    reason: Optional[str] = None


class PrefetchOp:
    """One prefetch; see the module doc for its life cycle."""

    def __init__(self, owner: "Prefetcher", hashes: list[bytes], need_state: bool):
        self._owner = owner
        self.hashes = hashes
        self.need_state = need_state
        self.started = owner._clock()
        self.status = PrefetchStatus.LOOKUP
        self.plan: Optional[PrefetchPlan] = None
        self.skip_reason: Optional[str] = None
        self.stop_reason: Optional[str] = None
        self._cv = threading.Condition()
        self._pages_done = 0
        self._state_ok = False
        self._cancel = False
        self._settled = False
        self._taken = False
        self._held = 0

    # -- caller side --------------------------------------------------------------------
    def wait_planned(self, timeout: Optional[float] = None) -> bool:
        """Wait until the lookup finished (planned or skipped)."""
        with self._cv:
            return self._cv.wait_for(lambda: self.status != PrefetchStatus.LOOKUP, timeout)

    def fetch(self, page_dsts: Sequence[Value], state_dst: Optional[Value] = None) -> None:
        """Start reading into the rows the caller allocated for exactly this plan."""
        with self._cv:
            if self.status != PrefetchStatus.PLANNED or self.plan is None:
                raise MisuseError(f"fetch() on a prefetch that is {self.status.value}, not planned")
            plan = self.plan
            if len(page_dsts) != plan.pages:
                raise MisuseError(f"fetch(): plan has {plan.pages} pages, got {len(page_dsts)} rows")
            if (state_dst is None) != (plan.state_index is None):
                raise MisuseError("fetch(): pass state_dst exactly when plan.state_index is set")
            self.status = PrefetchStatus.FETCHING
        self._owner._submit(self._run_fetch, list(page_dsts), state_dst)

    def progress(self) -> int:
        """Leading pages verified so far."""
        with self._cv:
            return self._pages_done

    def usable(self) -> PrefetchResult:
        """What may be used now, without waiting."""
        with self._cv:
            return self._result_locked()

    def take(self) -> PrefetchResult:
        """Apply the policy (maybe wait), cancel what is unfinished, return what is usable."""
        cfg = self._owner.cfg
        if cfg.policy == "wait_complete":
            self.wait()
        elif cfg.policy == "timeout":
            self.wait(max(0.0, self.started + cfg.timeout_s - self._owner._clock()))
        with self._cv:
            if self.status in (PrefetchStatus.LOOKUP, PrefetchStatus.PLANNED, PrefetchStatus.FETCHING):
                self._cancel = True
                if self.status != PrefetchStatus.FETCHING:
                    # lookup: the worker sees the flag and skips; planned: nothing in flight
                    if self.status == PrefetchStatus.PLANNED:
                        self._settle_locked(PrefetchStatus.CANCELLED)
            self._taken = True
            result = self._result_locked()
        self._owner._maybe_release(self)
        return result

    def cancel(self) -> None:
        """Give up on this prefetch (rows, if any, may be freed once ``settled``)."""
        with self._cv:
            self._cancel = True
            self._taken = True
            if self.status == PrefetchStatus.PLANNED:
                self._settle_locked(PrefetchStatus.CANCELLED)
        self._owner._maybe_release(self)

    def wait(self, timeout: Optional[float] = None) -> bool:
        """Wait until nothing is in flight: settled, or planned and waiting for fetch()."""
        with self._cv:
            return self._cv.wait_for(lambda: self._settled or self.status == PrefetchStatus.PLANNED,
                                     timeout)

    @property
    def settled(self) -> bool:
        """True once the worker will never write into this op's rows again."""
        with self._cv:
            return self._settled

    def wait_settled(self, timeout: Optional[float] = None) -> bool:
        with self._cv:
            return self._cv.wait_for(lambda: self._settled, timeout)

    # -- internals ----------------------------------------------------------------------
    def _result_locked(self) -> PrefetchResult:
        plan = self.plan
        if plan is None:
            return PrefetchResult(0, False, 0, False, self.skip_reason or "not planned")
        complete = self._pages_done == plan.pages and (plan.state_index is None or self._state_ok)
        if plan.state_index is not None:
            usable = plan.pages if complete else 0
        else:
            usable = self._pages_done
        reason = None if complete else (self.stop_reason or ("cancelled" if self._cancel else "in flight"))
        return PrefetchResult(usable, self._state_ok and complete, self._pages_done, complete, reason)

    def _settle_locked(self, status: PrefetchStatus) -> None:
        self.status = status
        self._settled = True
        self._cv.notify_all()

    def _run_fetch(self, page_dsts: list, state_dst: Optional[Value]) -> None:
        store, plan = self._owner.store, self.plan
        assert plan is not None, "fetch without a plan"
        try:
            if plan.state_index is not None:
                res = store.get([self.hashes[plan.state_index]], ObjectKind.STATE, [state_dst])
                with self._cv:
                    self._state_ok = res.hits == 1
                    if not self._state_ok:
                        self.stop_reason = f"state {res.stopped}"
                if res.hits != 1:
                    return  # history without its state is of no use: do not fetch it

            def progress(hits: int) -> bool:
                with self._cv:
                    self._pages_done = hits
                    self._cv.notify_all()
                    return not self._cancel

            res = store.get(self.hashes[:plan.pages], ObjectKind.PAGE, page_dsts, progress=progress)
            with self._cv:
                self._pages_done = res.hits
                if res.stopped is not None:
                    self.stop_reason = res.stopped
        finally:
            with self._cv:
                self._settle_locked(PrefetchStatus.DONE)
            self._owner._maybe_release(self)

    def __repr__(self) -> str:
        return f"PrefetchOp({self.status.value}, plan={self.plan}, done={self._pages_done})"


class Prefetcher:
    """Runs :class:`PrefetchOp` lookups and fetches on a small worker pool."""

    def __init__(self, store: L3Store, page_bytes: int, state_bytes: int = 0,
                 cfg: PrefetchConfig = PrefetchConfig(), *, workers: int = 2,
                 clock: Callable[[], float] = time.monotonic):
        if page_bytes <= 0:
            raise MisuseError(f"page_bytes must be > 0, got {page_bytes}")
        self.store = store
        self.page_bytes = page_bytes
        self.state_bytes = state_bytes
        self.cfg = cfg
        self._clock = clock
        self._pool = ThreadPoolExecutor(max_workers=workers, thread_name_prefix="hicache-l3-prefetch")
        self._lock = threading.Lock()
        self._held = 0
        self._ops: "weakref.WeakSet[PrefetchOp]" = weakref.WeakSet()
        self.counts = {"started": 0, "planned": 0, "skipped": 0, "cut_by_budget": 0,
                       "pages_fetched": 0, "pages_used": 0}

    @classmethod
    def for_layout(cls, store: L3Store, layout: CacheLayout, cfg: PrefetchConfig = PrefetchConfig(),
                   **kw) -> "Prefetcher":
        """Object sizes from the layout: one page object, one state snapshot object."""
        return cls(store, layout.object_bytes("page"), layout.object_bytes("state"), cfg, **kw)

    @property
    def held_bytes(self) -> int:
        """Host bytes planned by prefetches that are not yet taken and settled."""
        with self._lock:
            return self._held

    def start(self, hashes: Sequence[PageHash], *, need_state: bool = False) -> PrefetchOp:
        """Begin a prefetch of the hash chain that follows the host hit. Never blocks."""
        op = PrefetchOp(self, [hash_bytes(h) for h in hashes], need_state)
        if need_state and self.state_bytes <= 0:
            raise MisuseError("need_state=True but this prefetcher has no state object size")
        with self._lock:
            self.counts["started"] += 1
            self._ops.add(op)
        self._submit(self._lookup, op)
        return op

    def _submit(self, fn, *args) -> None:
        self._pool.submit(fn, *args)

    def _lookup(self, op: PrefetchOp) -> None:
        cfg, store = self.cfg, self.store
        try:
            if op._cancel:
                raise _Skip("cancelled")
            n = store.lookup(op.hashes, ObjectKind.PAGE)
            if n == 0:
                raise _Skip("miss")
            states: list[int] = []
            if op.need_state:
                cands = list(range(n - 1, max(-1, n - 1 - cfg.state_probe_limit), -1))
                flags = store.exists([op.hashes[i] for i in cands], ObjectKind.STATE)
                states = [i for i, f in zip(cands, flags) if f]  # deepest first
                if not states:
                    raise _Skip("no_state")
            pages, state_index = self._fit(n, states)
            if pages == 0:
                raise _Skip("over_budget")
            if pages < cfg.threshold_pages:
                raise _Skip("below_threshold")
            plan = PrefetchPlan(pages, state_index, self.page_bytes, self.state_bytes, n)
            with self._lock:
                self._held += plan.nbytes
                self.counts["planned"] += 1
                if pages < (states[0] + 1 if states else n):
                    self.counts["cut_by_budget"] += 1
            with op._cv:
                op.plan = plan
                op._held = plan.nbytes
                if op._cancel:
                    op._settle_locked(PrefetchStatus.CANCELLED)
                else:
                    op.status = PrefetchStatus.PLANNED
                op._cv.notify_all()
            if op._cancel:
                self._maybe_release(op)
        except _Skip as skip:
            with self._lock:
                self.counts["skipped"] += 1
            with op._cv:
                op.skip_reason = str(skip)
                op._settle_locked(PrefetchStatus.SKIPPED)

    def _fit(self, n: int, states: list[int]) -> tuple[int, Optional[int]]:
        """Pages (and state boundary) that fit the host-memory cap, deepest first."""
        cap = self.cfg.max_host_bytes
        with self._lock:
            avail = None if cap is None else cap - self._held
        if not states:
            pages = n if avail is None else min(n, max(0, avail // self.page_bytes))
            return pages, None
        for s in states:
            need = (s + 1) * self.page_bytes + self.state_bytes
            if avail is None or need <= avail:
                return s + 1, s
        return 0, None

    def _maybe_release(self, op: PrefetchOp) -> None:
        with op._cv:
            if not (op._taken and op._settled) or op._held == 0:
                return
            held, op._held = op._held, 0
            fetched = op._pages_done
            used = op._result_locked().usable_pages
        with self._lock:
            self._held -= held
            self.counts["pages_fetched"] += fetched
            self.counts["pages_used"] += used

    def close(self) -> None:
        """Stop the workers: queued lookups and fetches are cancelled, running ones finish;
        every op still unsettled afterwards is settled as cancelled (its rows may be freed)."""
        self._pool.shutdown(wait=True, cancel_futures=True)
        with self._lock:
            ops = list(self._ops)
        for op in ops:
            with op._cv:
                op._cancel = True
                op._taken = True
                if not op._settled:
                    op._settle_locked(PrefetchStatus.CANCELLED)
            self._maybe_release(op)


class _Skip(Exception):
    pass
