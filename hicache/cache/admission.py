"""L3 admission: chains worth sharing go to L3 on their own, not when the host evicts them.

Under ``write_back`` the host receives what the device evicts and L3 what the host evicts,
so with roomy budgets nothing reaches the store and a second engine -- or the same one
after a restart -- finds nothing (issue 26). Admission decouples the two: a *chain* (the
history pages from the root to a boundary plus the snapshot kept there, what a resume
needs) becomes a candidate when it is published (``AdmitConfig.mode = published``, at least
``min_tokens`` deep) or once a request reused it (``reused``), and is written to L3 behind
the step::

    publish / load (hook)    ->  candidate (node, snapshot), ranked:
                                   shared prefixes (a branch point, a BRANCH snapshot) first,
                                   then the most reused, then the shallowest, then the oldest
    poll(now)                ->  token bucket refilled at gbps (caller's clock)
                                 while tokens > 0: take the best candidate, gather its pages
                                 not yet in L3 and its snapshot into a staging buffer, put_async
    L3 ticket done           ->  hashes recorded as stored, skipped (already held) bytes refunded

Why a staging copy: the puts read a private buffer, not pool rows, so nothing is locked,
held or pinned for them and no eviction, load or compaction decision of the device or the
host changes because L3 is being written (the tests of tree/ and cache/ that assert exact
decisions hold with admission on). The copy is one indexed gather per family, bounded per
poll by the budget; its wall time on the engine thread is counted
(``l3_admit_engine_us``). The put worker asks the store first and skips objects it already
holds (``backup_skip_existing``: a fleet writes each shared page once); their bytes are
given back to the budget. A chain whose pages are not readable now (a load filling the
device copy, a backup filling the host copy) waits for a later poll.

Admission holds no pool ids: ``check_integrity`` has nothing to check here. It is off for
a private ``memory://`` store (no name): nobody but this cache reads it.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from collections import OrderedDict
from typing import Any, Iterable, Sequence

import numpy as np
import torch

from hicache.cache.results import AdmitCounters
from hicache.config import NO_L3, AdmitConfig
from hicache.layout import CacheLayout
from hicache.pools import TieredPools, TierPools
from hicache.storage import L3Store, PutTicket, memory_store_name
from hicache.tree import Snapshot, TreeNode

GB = 1e9


def gather_objects(tier: TierPools, source: str, ids: Sequence[int], out: np.ndarray) -> None:
    """Copy rows ``ids`` of ``tier`` into ``out`` (``[len(ids), object_bytes]`` uint8, CPU),
    each laid out as a page_first object (families in layout order, layers within): what an
    L3 object holds, whatever the tier's own layout. numpy on the CPU (torch's strided
    uint8 copies ran ~80x slower on a 2-core machine); a CUDA tier copies to the host first."""
    if source in tier.objects:
        objs = tier.objects[source]
        idx = torch.as_tensor(np.asarray(ids, dtype=np.int64), device=objs.device)
        out[:] = objs.numpy()[np.asarray(ids)] if objs.device.type == "cpu" else objs.index_select(0, idx).cpu().numpy()
        return
    for slot in tier.slots[source]:
        if not slot.unit_bytes:
            continue
        view = tier.view(slot.family)   # [layers, capacity, unit]
        dst = out[:, slot.offset: slot.offset + slot.nbytes].reshape(len(ids), slot.num_layers, slot.unit_bytes)
        if view.device.type == "cpu":
            src = view.numpy()
            for i, row in enumerate(ids):
                dst[i] = src[:, int(row)]
        else:
            idx = torch.as_tensor(np.asarray(ids, dtype=np.int64), device=view.device)
            dst[:] = view.index_select(1, idx).permute(1, 0, 2).cpu().numpy()


def admission_active(cfg: AdmitConfig, url: str) -> bool:
    """Whether a cache with this config and L3 URL admits chains to L3: not with ``off``,
    not without L3, and not for a private in-process store (``memory://`` without a
    name), whose only reader is the cache itself -- the host-eviction path serves it, and
    admission would only fill its capacity with chains still on the device or host (the
    main job: L3 hits 9.0% -> 1.4%). Shared or lasting stores (memory://NAME, file://,
    Redis) admit."""
    private = memory_store_name(url) == ""
    return cfg.mode != "off" and url != NO_L3 and not private


@dataclass(eq=False)
class _Candidate:
    node: TreeNode
    snap: Snapshot | None
    seq: int
    shared: bool
    reused: int = 0
    throttled: bool = False


@dataclass(eq=False)
class _Flight:
    """What one admission put is writing (the staging buffer lives in the ticket's views)."""

    nodes: list[TreeNode] = field(default_factory=list)
    state_key: bytes | None = None
    object_bytes: int = 0


class KeyMemo:
    """A set of keys bounded to ``capacity``, the least recently added or found forgotten
    first (``forgotten`` counts them): what admission knows to be in the store, which a
    long-running engine must not let grow with every key it ever wrote (about 150 bytes a
    key in CPython)."""

    def __init__(self, capacity: int):
        assert capacity >= 1
        self.capacity = capacity
        self.forgotten = 0
        self._keys: OrderedDict[bytes, None] = OrderedDict()

    def __contains__(self, key: object) -> bool:
        if key in self._keys:
            self._keys.move_to_end(key)      # type: ignore[arg-type]
            return True
        return False

    def __len__(self) -> int:
        return len(self._keys)

    def add(self, key: bytes) -> None:
        self._keys[key] = None
        self._keys.move_to_end(key)
        while len(self._keys) > self.capacity:
            self._keys.popitem(last=False)
            self.forgotten += 1

    def update(self, keys: Iterable[bytes]) -> None:
        for k in keys:
            self.add(k)


class L3Admission:
    """Chooses the chains L3 receives and writes them, paced (see module docstring)."""

    def __init__(self, cfg: AdmitConfig, layout: CacheLayout, pools: TieredPools, store: L3Store | None,
                 url: str = ""):
        self.cfg = cfg
        self.counters = AdmitCounters()
        self._store = store if admission_active(cfg, url) else None
        self._pools = pools
        self._page_tokens = layout.page_tokens
        self._page_bytes = layout.object_bytes("page")
        self._state_bytes = layout.object_bytes("state")
        self._candidates: dict[int, _Candidate] = {}     # by node id
        self._seq = 0
        self._tokens = float(cfg.burst_bytes)            # the bucket, in bytes
        self._last: float | None = None
        self._virtual = False                              # the caller passes its own clock
        self._flights: dict[PutTicket, _Flight] = {}
        self._inflight: set[TreeNode] = set()
        self._stored_pages = KeyMemo(cfg.memo_keys)      # page hashes written or found in L3
        self._stored_states = KeyMemo(cfg.memo_keys)     # snapshot keys written or found in L3
        self._inflight_states: set[bytes] = set()

    @property
    def enabled(self) -> bool:
        return self._store is not None

    # -- the rule: what becomes a candidate ----------------------------------------------
    def offer(self, node: TreeNode, snap: Snapshot | None, why: str) -> None:
        """A chain was published ending at ``node`` (with the snapshot kept there)."""
        if self._store is None or node.depth * self._page_tokens < self.cfg.min_tokens:
            return
        shared = why == "branch" or node.forked
        c = self._candidates.get(node.node_id)
        if c is not None:
            c.snap, c.shared = snap, c.shared or shared
            return
        if self.cfg.mode == "published" or shared:
            self._add(_Candidate(node, snap, self._next(), shared))

    def reused(self, node: TreeNode, snap: Snapshot | None) -> None:
        """A request resumed at the end of ``node`` (from ``snap``): the chain is worth more."""
        if self._store is None or node.depth * self._page_tokens < self.cfg.min_tokens:
            return
        c = self._candidates.get(node.node_id)
        if c is None:
            if self._stored(node, snap):
                return
            c = _Candidate(node, snap, self._next(), node.forked)
            self._add(c)
        c.reused += 1

    def _next(self) -> int:
        self._seq += 1
        return self._seq

    def _add(self, c: _Candidate) -> None:
        self._candidates[c.node.node_id] = c
        if len(self._candidates) > self.cfg.max_pending:
            worst = max(self._candidates.values(), key=self._rank)
            del self._candidates[worst.node.node_id]
            self.counters.l3_admit_dropped += 1

    @staticmethod
    def _rank(c: _Candidate) -> tuple:
        """Lower first: shared prefixes, then the most reused, the shallowest, the oldest."""
        return (not c.shared, -c.reused, c.node.depth, c.seq)

    # -- the pace: what is written now ------------------------------------------------
    def run(self, now: float | None = None) -> None:
        """Write the best candidates the budget allows now (called at each poll)."""
        if self._store is None or not self._candidates:
            self._refill(now)
            return
        t0 = time.perf_counter()
        self._refill(now)
        room = self._store.backup_room()
        for c in sorted(self._candidates.values(), key=self._rank):
            if self._tokens <= 0 or room <= 0:
                if not c.throttled:
                    c.throttled = True
                    self.counters.l3_admit_throttled += 1
                continue
            status, nbytes, objects = self._submit(c)
            if status != "wait":
                del self._candidates[c.node.node_id]
            self._tokens -= nbytes
            room -= objects
        self.counters.l3_admit_engine_us += int((time.perf_counter() - t0) * 1e6)

    def _refill(self, now: float | None) -> None:
        # One clock paces the bucket: monotonic until a caller gives its own (a replay's
        # virtual time), that one from then on; a poll without it (a drain, a helper's
        # plain poll) neither refills nor moves the clock, so virtual time keeps pacing.
        if now is None:
            if self._virtual:
                return
            now = time.monotonic()
        elif not self._virtual:
            self._virtual, self._last = True, None
        if self._last is not None and now > self._last:
            self._tokens = min(float(self.cfg.burst_bytes), self._tokens + (now - self._last) * self.cfg.gbps * GB)
        self._last = now if self._last is None else max(self._last, now)

    def _stored(self, node: TreeNode, snap: Snapshot | None) -> bool:
        key = node.hashes[-1] if node.hashes else None
        return (all(self._has(n) for n in node.iter_ancestors())
                and (snap is None or key in self._stored_states))

    def _has(self, node: TreeNode) -> bool:
        """Known to be in L3: put by the host path (``l3_stored``) or by admission. Admission
        keeps its own record rather than setting ``l3_stored``: a store that evicts (an
        LRU capacity, Redis ``allkeys-lru``) may drop the object later, and the host path
        must then still put it when the page reaches the host (its put asks the store
        first, so an object still there is not written twice)."""
        return node.l3_stored or all(h in self._stored_pages for h in node.hashes)

    def _source(self, node: TreeNode) -> tuple[TierPools, np.ndarray] | None:
        """Where ``node``'s pages can be read now: the device copy unless a load is still
        filling it, else a host copy no backup is still filling."""
        if node.device_ids is not None and node.load_ticket is None:
            return self._pools.device, node.device_ids
        if node.host_ids is not None and not node.backup_pending:
            return self._pools.host, node.host_ids
        return None

    def _snap_source(self, snap: Snapshot) -> tuple[TierPools, int] | None:
        if snap.device_id is not None and not snap.loading:
            return self._pools.device, snap.device_id
        if snap.host_id is not None and not snap.backup_pending:
            return self._pools.host, snap.host_id
        return None

    def _submit(self, c: _Candidate) -> tuple[str, int, int]:
        """Stage and queue ``c``'s unstored pages and snapshot; ``(status, bytes, objects)``
        with status ``sent``, ``gone`` (nothing to write, or the chain left the tree) or
        ``wait`` (not readable now)."""
        assert self._store is not None
        node, snap = c.node, c.snap
        if node.parent is None or (snap is not None and (node.snapshot is not snap or snap.empty)):
            return "gone", 0, 0
        key = node.hashes[-1]
        nodes, reads = [], []
        for n in node.iter_ancestors():
            if n in self._inflight or self._has(n):
                continue
            src = self._source(n)
            if src is None:
                return "wait", 0, 0
            nodes.append(n)
            reads.append(src)
        state_src = None
        if snap is not None and key not in self._stored_states and key not in self._inflight_states:
            state_src = self._snap_source(snap)
            if state_src is None:
                return "wait", 0, 0
        if not nodes and state_src is None:
            return "gone", 0, 0
        nbytes = objects = 0
        if nodes:
            nodes.reverse()
            reads.reverse()
            hashes = [h for n in nodes for h in n.hashes]
            staged = np.empty((len(hashes), self._page_bytes), np.uint8)
            at = 0
            for tier, ids in reads:
                gather_objects(tier, "page", ids.tolist(), staged[at: at + len(ids)])
                at += len(ids)
            ticket = self._store.put_async(hashes, "page", [staged[i] for i in range(len(hashes))])
            self._track(ticket, _Flight(nodes=nodes, object_bytes=self._page_bytes))
            self._inflight.update(nodes)
            nbytes += len(hashes) * self._page_bytes
            objects += len(hashes)
        if state_src is not None:
            tier, row = state_src
            staged = np.empty((1, self._state_bytes), np.uint8)
            gather_objects(tier, "state", [row], staged)
            ticket = self._store.put_async([key], "state", [staged[0]])
            self._track(ticket, _Flight(state_key=key, object_bytes=self._state_bytes))
            self._inflight_states.add(key)
            nbytes += self._state_bytes
            objects += 1
        self.counters.l3_admit_chains += 1
        return "sent", nbytes, objects

    def _track(self, ticket: PutTicket, flight: _Flight) -> None:
        self._flights[ticket] = flight
        if ticket.done and ticket.dropped:   # over the queue bound: it never shows up in poll
            self._flights.pop(ticket)
            self.counters.l3_admit_dropped += 1
            self._settle(ticket, flight)

    # -- completions --------------------------------------------------------------------
    def finish(self, tickets: Sequence[Any]) -> None:
        """Tickets of finished puts (the store returns them all; ours are settled here)."""
        for ticket in tickets:
            flight = self._flights.pop(ticket, None)
            if flight is not None:
                self._settle(ticket, flight)

    def _settle(self, ticket: PutTicket, flight: _Flight) -> None:
        stored = list(ticket.stored or [False] * len(ticket.hashes))
        skipped = ticket.skipped_existing
        new = sum(stored) - skipped
        c = self.counters
        c.l3_admit_objects += new
        c.l3_admit_bytes += new * flight.object_bytes
        c.l3_admit_skipped_existing += skipped
        c.l3_admit_failed_objects += len(stored) - sum(stored)
        self._tokens = min(float(self.cfg.burst_bytes), self._tokens + skipped * flight.object_bytes)
        if flight.state_key is not None:
            self._inflight_states.discard(flight.state_key)
            if all(stored):
                self._stored_states.add(flight.state_key)
        if flight.nodes:
            self._stored_pages.update(h for h, s in zip(ticket.hashes, stored) if s)
        c.l3_admit_memo_forgotten = self._stored_pages.forgotten + self._stored_states.forgotten
        for node in flight.nodes:
            self._inflight.discard(node)

    def pending(self) -> int:
        """Candidates waiting (tests, stats)."""
        return len(self._candidates)
