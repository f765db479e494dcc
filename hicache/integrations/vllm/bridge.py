"""The scheduler's half of :class:`~hicache.integrations.vllm.connector.HiCacheConnector`,
written against hicache alone (no vLLM import), so it can be tested without an engine.

vLLM's paged KV blocks are L1. hicache keeps what vLLM computed in its radix tree, its own
pool (the facade's "device" tier, here a staging pool in the worker's memory), its host
pool and L3. One hicache page is one block of the full-attention groups (``page_tokens ==
block_size``), so a page maps to a block with no re-chunking; a sliding-window group may
have smaller blocks that divide it (its snapshot slots are its own blocks). Per request::

    lookup()   get_num_new_matched_tokens: hicache's match (fetching L3 pages into the
               host pool first) beyond the blocks vLLM already holds
    open()     update_state_after_alloc: lease the prefix (hicache queues its host->pool
               copies), plan a copy of pages [vLLM hit, hicache hit) into the new blocks
    plan()     build_connector_meta: pages that become whole this step get hicache pages,
               the worker copies blocks -> pages after each layer's attention
    ack()      the worker finished a step's copies: publish them (mid-flight, so sibling
               requests reuse them at once); failed ones stop that request's saving
    finish()   request_finished: publish to the last whole page, release the lease

Sliding-window models (vLLM's hybrid manager, several KV cache groups): each full-attention
group is a hicache history family, each sliding-window group a state family whose
snapshot is that group's window at a page boundary (:mod:`~.windows`). A save then also
fills one snapshot row, for the deepest boundary the step reached, from the window
blocks; a load copies the resume point's snapshot into the window blocks vLLM allocated.
hicache resumes only where a snapshot exists, so a lookup's answer is always a point whose
window can be loaded. vLLM has no per-block failure path with several groups, so on such a
layout the lease is taken at lookup (what is promised is what is held) rather than at
:meth:`open`.

Why a staging pool instead of hicache reading vLLM's blocks directly: hicache's tree,
eviction and batched host/L3 copies all work on the pages of its own pools; a request's
pages are copied out of vLLM's blocks once (one indexed copy per layer per step) and from
then on every tier move is hicache's, whatever vLLM does with the blocks.

Thread contract: every call here but :meth:`Bridge.wait_load` and
:meth:`Bridge.report_saves` is made on vLLM's scheduler thread, which is the engine thread
hicache's facade expects. The worker (same process) only waits on leases and copies bytes.
"""

from __future__ import annotations

import itertools
import logging
import queue
import threading
from dataclasses import dataclass, field
from typing import Sequence

import numpy as np

from hicache.cache import Boundary, HiCache, Lease, Prefetch
from hicache.errors import HiCacheError
from hicache.integrations.vllm.plan import CopyOp, StepPlan
from hicache.integrations.vllm.windows import group_copies, windows_held

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class _Point:
    """A boundary a save publishes: its pages, the snapshot row filled for it (None
    without state, or without a free row) and why the boundary is there."""

    pages: int
    snapshot: int | None
    why: Boundary


@dataclass(frozen=True)
class _Save:
    """A save in flight: its request and the boundaries published, in order, once it is
    acked (the last one is the deepest the step reached)."""

    req: "_Req"
    points: tuple[_Point, ...]

    @property
    def upto(self) -> int:
        return self.points[-1].pages


@dataclass(eq=False)
class _Req:
    lease: Lease
    planned: int                     # pages given hicache pages (published or in flight)
    prompt_pages: int = 0            # (prompt tokens - 1) // P: the boundary a repeat of it resumes at
    branch_pages: int = 0            # where the prompt leaves hicache's cached path (MatchResult.branch_tokens)
    published: int = 0
    in_flight: int = 0               # save ops not acked yet
    saving: bool = True
    finished: bool = False
    tokens: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int32))


class Bridge:
    """hicache behind one vLLM engine's KV blocks (see module doc)."""

    def __init__(self, cache: HiCache, block_tokens: int, *, windows: Sequence[int] = (0,),
                 group_blocks: Sequence[int] | None = None, async_lookup: bool = False):
        """``block_tokens``: the full-attention groups' block size (hicache's page).
        ``windows``: per KV cache group, in the layout's family order, 0 for a
        full-attention group, its window for a sliding-window one; ``group_blocks``: each
        group's block size (default all ``block_tokens``; a window group's divides it)."""
        if cache.page_tokens != block_tokens:
            raise HiCacheError(f"hicache page_tokens {cache.page_tokens} != vLLM block_size {block_tokens}")
        if not 0 < len(windows) <= len(cache.layout.families):
            raise HiCacheError(f"{len(windows)} KV cache groups for {len(cache.layout.families)} hicache families")
        blocks = tuple(group_blocks) if group_blocks is not None else (block_tokens,) * len(windows)
        if len(blocks) != len(windows) or any(b < 1 or block_tokens % b or (not w and b != block_tokens)
                                               for w, b in zip(windows, blocks)):
            raise HiCacheError(f"group block sizes {blocks} (windows {tuple(windows)}) do not fit page {block_tokens}")
        self.cache = cache
        self.P = block_tokens
        self.groups = tuple(zip(windows, blocks))    # (window, block size) per KV cache group
        self.hybrid = any(windows)
        self.async_lookup = async_lookup
        self._held: dict[str, Lease] = {}                 # hybrid: request -> the lease its lookup took
        self._prefetching: dict[str, Prefetch] = {}       # request -> its L3 lookup in flight
        self._stats_lock = threading.Lock()
        self._reported: dict[str, int] = {}                # counters as last reported to vLLM
        self._reqs: dict[str, _Req] = {}
        self._pending_loads: list[CopyOp] = []
        self._failed_blocks: set[int] = set()
        self._save_ids = itertools.count()
        self._saves: dict[int, _Save] = {}
        self._acks: "queue.SimpleQueue[tuple[int, bool]]" = queue.SimpleQueue()
        self.counters = {k: 0 for k in ("lookups", "lookups_deferred", "lookup_hit_tokens", "loaded_tokens", "load_failed_tokens",
                                        "saved_pages", "save_failures", "published_pages", "finished",
                                        "loaded_snapshots", "saved_snapshots", "published_snapshots")}

    # -- scheduler: lookup and load ---------------------------------------------------------
    def lookup(self, tokens: Sequence[int], vllm_tokens: int, req_id: str | None = None) -> int | None:
        """Tokens hicache can add to vLLM's own (block-aligned) hit of ``vllm_tokens``, or
        None: ask again next step (vLLM's contract), while the L3 lookup is in flight.

        Pages only L3 holds are fetched into the host pool first, so what is promised here
        is resident when :meth:`open` leases it a moment later in the same scheduler step.
        With ``async_lookup`` (and a ``req_id`` to remember it by) nothing of L3 blocks the
        scheduler: the existence round trip and then the fetch of what it found run behind
        it (``HiCache.start_fetch``), the request is asked about again each step (None) and
        answered once the bytes are in the host pool. Without it the fetch waits as the
        configured prefetch policy says."""
        self.counters["lookups"] += 1
        toks = np.asarray(tokens, dtype=np.int32)
        m = self.cache.match(toks)
        pf = self._prefetching.pop(req_id, None) if req_id is not None else None
        if pf is None and m.l3_hashes:
            pf = self.cache.prefetch(m)
        if pf is not None:
            if self.async_lookup and req_id is not None and not (self.cache.start_fetch(pf) and pf.op.wait(0)):
                self._prefetching[req_id] = pf
                self.counters["lookups_deferred"] += 1
                return None
            if self.cache.finish_prefetch(pf):
                m = self.cache.match(toks)
        resume = m.resume_tokens
        if self.hybrid and req_id is not None:
            resume = self._hold(req_id, m, vllm_tokens)
        extra = max(0, resume - vllm_tokens)
        self.counters["lookup_hit_tokens"] += extra
        return extra

    def _hold(self, req_id: str, m, vllm_tokens: int) -> int:
        """Hybrid layouts lease at lookup (vLLM cannot take a failed load back block by
        block with several KV cache groups: it raises), so what is promised is what is
        held; returns the tokens held. The host -> pool copy is waited for here, so the
        worker's copy pool -> blocks cannot fail; a failed copy promises nothing (vLLM
        computes the prefix; hicache keeps its host copy). Asked again (the request was
        not scheduled), the lease it holds answers unless the cache now resumes deeper:
        re-leasing would count the hit, the snapshot's ``resumed`` and the ghosts' lookup
        once per ask. Nothing past vLLM's own hit: nothing is leased or waited for."""
        old = self._held.get(req_id)
        if old is not None and m.resume_tokens <= old.resume_tokens:
            return old.resume_tokens
        if old is not None:
            del self._held[req_id]
            self.cache.release(old)
        if m.resume_tokens <= vllm_tokens:
            return m.resume_tokens
        lease = self.cache.load(m)
        if not lease.wait() or not lease.ok:
            self.cache.release(lease)
            self.counters["load_failed_tokens"] += lease.resume_tokens
            return 0
        self._held[req_id] = lease
        return lease.resume_tokens

    def open(self, req_id: str, tokens: Sequence[int], vllm_tokens: int, external: int,
             block_ids: Sequence[Sequence[int]], prompt_tokens: int | None = None) -> None:
        """vLLM allocated ``block_ids`` (per KV cache group) for ``req_id``, of which
        ``external`` tokens past its own ``vllm_tokens`` are ours to fill: lease the prefix
        (or take the one the lookup leased) and plan the copy. What the lease cannot cover
        (evicted since the lookup) becomes failed blocks, which vLLM recomputes.
        ``prompt_tokens``: the prompt's length (default all of ``tokens``; a request
        scheduled again after a preemption brings its output so far too)."""
        held = self._held.pop(req_id, None)   # before finish(): that releases a held lease
        if req_id in self._reqs:          # preempted and scheduled again
            self.finish(req_id)
        toks = np.array(tokens, dtype=np.int32)
        lease = held or self.cache.load(self.cache.match(toks))
        prompt = len(toks) if prompt_tokens is None else prompt_tokens
        req = _Req(lease, planned=lease.resume_pages, prompt_pages=max(prompt - 1, 0) // self.P, tokens=toks,
                   branch_pages=self.cache.match(toks).branch_tokens // self.P if self.hybrid else 0)
        self._reqs[req_id] = req
        if external <= 0:
            return
        first, last = vllm_tokens // self.P, (vllm_tokens + external) // self.P
        have = min(last, lease.resume_pages)
        if self.hybrid and (have != lease.resume_pages or lease.snapshot_id is None):
            have = first   # the snapshot is the window at the resume point, no other: load none
        if have > first:
            self._pending_loads.append(self._load_op(req_id, lease, first, have, block_ids))
            self.counters["loaded_tokens"] += (have - first) * self.P
        if last > max(have, first):
            lo = max(have, first)
            for (_, block), ids in zip(self.groups, block_ids):
                self._failed_blocks.update(int(b) for b in ids[lo * self.P // block:last * self.P // block] if b)
            self.counters["load_failed_tokens"] += (last - max(have, first)) * self.P
            req.saving = False   # this step computes on blocks vLLM will recompute: keep none of it

    def _load_op(self, req_id: str, lease: Lease, first: int, have: int,
                 block_ids: Sequence[Sequence[int]]) -> CopyOp:
        row = lease.snapshot_id
        assert not self.hybrid or row is not None, "open() loads a hybrid prefix only with its snapshot"
        snaps = ((row, have),) if row is not None and self.hybrid else ()
        pages, blocks = group_copies(self.groups, self.P, lease.page_table, first, have, snaps, block_ids,
                                     from_page=first)
        if self.hybrid:
            self.counters["loaded_snapshots"] += 1
        return CopyOp(req_id, 0, pages, blocks)

    # -- scheduler: saves -------------------------------------------------------------------
    def plan(self, steps: Sequence[tuple[str, Sequence[int], int, Sequence[Sequence[int]]]]) -> StepPlan:
        """This step's copies. ``steps``: per scheduled request, (id, its tokens so far, the
        tokens whose KV exists once this step ran, its block ids per KV cache group). A page
        whole after this step gets a hicache page now; the worker fills it from the block.
        On a hybrid layout the deepest boundary reached also gets a snapshot row, filled
        from the sliding-window groups' window blocks (all still allocated this step: vLLM
        frees the blocks a window left behind only when it next allocates), and so do two
        boundaries the step may pass on the way: the prompt's last whole page before its
        last token (where a repeat of the prompt resumes: a prompt of whole pages reaches
        one page further) and the point it leaves hicache's cached path (``BRANCH``: where
        a sibling sharing the prefix resumes)."""
        self.poll()
        saves = []
        for req_id, tokens, computed, block_ids in steps:
            req = self._reqs.get(req_id)
            if req is None or not req.saving:
                continue
            upto = min(computed, len(tokens)) // self.P
            n = upto - req.planned
            if n <= 0:
                continue
            if not self.cache.alloc_pages(req.lease, n).ok:
                req.saving = False        # hicache's pool is full of running requests' pages
                continue
            points = self._points(req, upto, block_ids)
            sid = next(self._save_ids)
            self._saves[sid] = _Save(req, points)
            saves.append(self._save_op(req_id, sid, req, points, block_ids))
            req.planned, req.in_flight = upto, req.in_flight + 1
            req.tokens = np.array(tokens[:upto * self.P], dtype=np.int32)
        loads, self._pending_loads = tuple(self._pending_loads), []
        failed, self._failed_blocks = tuple(sorted(self._failed_blocks)), set()
        return StepPlan(loads, tuple(saves), failed)

    def _points(self, req: _Req, upto: int, block_ids: Sequence[Sequence[int]]) -> tuple[_Point, ...]:
        """The boundaries a save to ``upto`` publishes, each with a snapshot row on a hybrid
        layout (None when hicache has no free row, or a window block is vLLM's null block --
        freed, as below a local hit vLLM resumed past: the pages still serve deeper points)."""
        if not self.hybrid:
            return (_Point(upto, None, Boundary.PREFILL),)
        why = {req.branch_pages: Boundary.BRANCH, req.prompt_pages: Boundary.PROMPT_END}
        out = []
        for pages in sorted({p for p in why if req.planned < p < upto} | {upto}):
            row = None
            if windows_held(self.groups, pages, self.P, block_ids):
                snap = self.cache.alloc_snapshot(req.lease)
                row = int(snap.ids[0]) if snap.ok else None
            if row is not None or pages == upto:
                out.append(_Point(pages, row, why.get(pages, Boundary.PREFILL)))
        return tuple(out)

    def _save_op(self, req_id: str, sid: int, req: _Req, points: Sequence[_Point],
                 block_ids: Sequence[Sequence[int]]) -> CopyOp:
        snaps = [(p.snapshot, p.pages) for p in points if p.snapshot is not None]
        pages, blocks = group_copies(self.groups, self.P, req.lease.page_table, req.planned, points[-1].pages,
                                     snaps, block_ids)
        return CopyOp(req_id, sid, pages, blocks)

    def poll(self) -> None:
        """Apply the worker's acks (publish) and hicache's finished copies."""
        while True:
            try:
                key, ok = self._acks.get_nowait()
            except queue.Empty:
                break
            save = self._saves.pop(key)   # the incarnation that planned it, even if preempted since
            req = save.req
            req.in_flight -= 1
            if ok:
                self.counters["saved_pages"] += save.upto - req.published
                for point in save.points:
                    self.counters["saved_snapshots"] += point.snapshot is not None
                    self._publish(req, point.pages, point.why, point.snapshot)
            else:
                self.counters["save_failures"] += 1
                req.saving = False
            if req.finished and req.in_flight == 0:
                self._close(req)
        self.cache.poll()

    def _publish(self, req: _Req, upto: int, why: Boundary, snapshot: int | None = None) -> None:
        """Publish ``upto`` pages (with ``snapshot`` for that boundary); a snapshot row not
        published stays the lease's and goes back at release."""
        if not req.saving or upto < req.published:
            return
        lease = req.lease
        if not lease.wait() or not lease.ok:   # its own loads failed: nothing to publish past them
            req.saving = False
            return
        try:
            self.cache.publish(lease, req.tokens[:upto * self.P], upto, snapshot=snapshot, why=why)
            self.counters["published_pages"] += upto - req.published
            self.counters["published_snapshots"] += snapshot is not None
            req.published = upto
        except HiCacheError as exc:            # a bug in the plan, never the engine's problem
            log.warning("hicache vLLM connector: publish failed (%s); saving stops for this request", exc)
            req.saving = False

    def finish(self, req_id: str) -> None:
        """The request ended (or was preempted): publish what was saved, release the lease
        once the last step's copies are acked."""
        self.poll()
        self.cache.cancel_prefetch(self._prefetching.pop(req_id, None))   # aborted while looked up
        held = self._held.pop(req_id, None)
        if held is not None:                 # looked up (hybrid), never scheduled
            self.cache.release(held)
        req = self._reqs.pop(req_id, None)   # a new incarnation (preempted, rescheduled) starts afresh
        if req is None:
            return
        req.finished = True
        self.counters["finished"] += 1
        if req.in_flight == 0:
            self._close(req)

    def _close(self, req: _Req) -> None:
        if req.published:
            self._publish(req, req.published, Boundary.FINISH)
        self.cache.release(req.lease)

    # -- worker (same process, the forward thread) ------------------------------------------
    def wait_load(self, req_id: str, layer: int) -> bool:
        """Block until layer ``layer`` of ``req_id``'s leased prefix is in hicache's pool."""
        req = self._reqs.get(req_id)   # the worker's waits read the scheduler's map (one dict get)
        return req is not None and req.lease.wait(layer=layer)

    def report_saves(self, results: Sequence[tuple[int, bool]]) -> None:
        for r in results:
            self._acks.put(r)

    # -- lifecycle --------------------------------------------------------------------------
    def close(self) -> None:
        self.poll()
        for pf in self._prefetching.values():
            self.cache.cancel_prefetch(pf)
        self._prefetching.clear()
        for lease in self._held.values():
            self.cache.release(lease)
        self._held.clear()
        for req_id, req in list(self._reqs.items()):
            req.in_flight = 0
            self.finish(req_id)
        for req in [save.req for save in self._saves.values()]:   # finished, their last acks never came
            if req.in_flight:
                req.in_flight = 0
                self._close(req)
        self._saves.clear()
        self.cache.close()

    def take_stats_delta(self) -> dict[str, int]:
        """The integer counters' change since the last call, from whichever connector
        object asks: the scheduler's and the worker's connectors share this bridge and vLLM
        sums what both report, so a baseline per connector would count everything twice."""
        with self._stats_lock:
            now = {k: v for k, v in self.stats().items() if isinstance(v, int)}
            delta = {k: v - self._reported.get(k, 0) for k, v in now.items()}
            self._reported = now
        return delta

    def stats(self) -> dict:
        out = dict(self.counters)
        s = self.cache.stats()
        for k in ("hit_tokens", "match_tokens", "loaded_pages", "l3_hit_tokens", "l3_prefetched_pages",
                  "l3_put_objects", "hit_rate"):
            out[f"cache_{k}"] = s[k]
        out["l3_rejected"], out["l3_errors"] = s["l3_rejected"], s["l3_errors"]
        return out
