"""The engine-facing ``HiCache``: match, load, alloc, publish, release, poll.

One scheduler step of an engine, in terms of this API::

    m = cache.match(tokens)                 # pure lookup: resume point, tiers, L3 hashes
    lease = cache.load(m)                   # lock the prefix, queue host->device loads
    pages = cache.alloc_pages(lease, k)     # device pages for the tokens to compute
    cache.step()                            # launch every queued copy as one batch
    lease.wait(layer=l)                     # per layer, before attention of layer l
    ... compute into pools.device.view(family)[layer_idx, page_id] ...
    cache.publish(lease, tokens, n_pages, snapshot_id=sid, why=Boundary.PREFILL)
    ... decode ...
    cache.publish(lease, tokens, n_pages, snapshot_id=sid, why=Boundary.FINISH)
    cache.release(lease)
    cache.poll()                            # apply finished backups and loads
"""

from __future__ import annotations

import itertools

import numpy as np

from hicache.cache.l3 import L3Mixin
from hicache.cache.lease import Lease
from hicache.cache.publish import PublishMixin, as_tokens
from hicache.cache.residency import Load, ResidencyMixin
from hicache.cache.results import CacheStats, MatchResult
from hicache.config import HiCacheConfig, load_config
from hicache.errors import MisuseError
from hicache.layout import CacheLayout
from hicache.pools import AllocResult, build_pools
from hicache.transfer import TransferConfig, TransferController
from hicache.tree import (PathMatch, RadixTree, RetentionPolicy, Snapshot,
                          TreeNode, chain_hashes, get_strategy)


class HiCache(PublishMixin, ResidencyMixin, L3Mixin):
    """A three-tier prefix cache for one model layout (see module docstring).

    Not thread-safe: one engine thread drives it (copies run on their own workers).
    """

    def __init__(self, layout: CacheLayout, config: HiCacheConfig | None = None, *,
                 transfer: TransferConfig | None = None, hash_seed: bytes = b"hicache-v1",
                 fault_injector=None):
        self.layout = layout
        self.config = config or HiCacheConfig()
        self.page_tokens = layout.page_tokens
        self.pools = build_pools(layout, self.config.pools)
        # fault_injector: tests only -- called per copied layer, may raise TransferError.
        self.ctl = TransferController(self.pools, transfer or TransferConfig(), fault_injector=fault_injector)
        self.tree = RadixTree(layout.page_tokens, hash_seed=hash_seed, needs_snapshots=layout.has_state)
        self.strategy = get_strategy(self.config.tree.eviction)
        self.retention = RetentionPolicy(self.config.tree.retention_interval, layout.page_tokens)
        self.has_state = layout.has_state
        self.counters = CacheStats()
        self._leases: dict[int, Lease] = {}
        self._lease_ids = itertools.count(1)
        self._loading_snaps: dict[int, object] = {}  # id(snapshot) -> load handle (None: queued)
        # provisional snapshots whose owner moved on while another holder still used them;
        # each is dropped (and counted) at its last unlock
        self._orphans: dict[Snapshot, TreeNode] = {}
        self._release_after_put: set = set()  # exclusive tier: nodes/snapshots loaded while an L3 put read them
        self._inflight: dict[int, object] = {}       # id(tag) -> tag of queued copies
        self._handles: dict[int, object] = {}        # id(tag) -> its copy handle
        self._acks: list = []  # finished copies collected, applied by poll()/drain() only
        self._closed = False
        self._init_l3()

    @classmethod
    def from_config(cls, path: str, **overrides) -> "HiCache":
        """Build from a config YAML (``configs/*.yaml``); overrides as in ``load_config``."""
        layout, cfg = load_config(path, **overrides)
        return cls(layout, cfg)

    # -- lookup -------------------------------------------------------------------------
    def _max_pages(self, tokens: np.ndarray) -> int:
        return max(len(tokens) - 1, 0) // self.page_tokens

    def match(self, tokens: object) -> MatchResult:
        """Find the usable prefix of ``tokens`` across the device and host tiers."""
        toks = as_tokens(tokens)
        max_pages = self._max_pages(toks)
        path = self.tree.walk(toks, max_pages)
        r = self.tree.resume_point(path)
        hist = path.num_pages
        P = self.page_tokens
        l3 = chain_hashes(self.tree.hash_seed, path.last_hash, toks[hist * P: max_pages * P], P)
        tier = None
        if r.snapshot is not None:
            tier = "device" if r.snapshot.device_id is not None else "host"
        return MatchResult(tokens=toks, page_tokens=P, resume_tokens=r.pages * P,
                           device_tokens=r.device_pages * P, host_tokens=(r.pages - r.device_pages) * P,
                           snapshot_tier=tier, history_tokens=hist * P, l3_hashes=tuple(l3))

    # -- load ---------------------------------------------------------------------------
    def load(self, match: MatchResult, *, start: bool = True) -> Lease:
        """Lock the usable prefix of ``match`` and queue the loads it needs from the host.

        All-or-nothing per request: if the device cannot take every host page and the
        snapshot, nothing is loaded and the lease resumes from the deepest point that is
        already on the device. ``start=False`` leaves the copies queued for the next
        :meth:`step`, so a scheduler can batch the loads of many requests into one copy.
        """
        self._check_open()
        toks = match.tokens
        path = self.tree.walk(toks, self._max_pages(toks))
        r = self.tree.resume_point(path)
        node = self.tree.node_at(path, r.pages)
        self._pin(node, r.snapshot, +1)  # before making room: eviction must not take them
        loads = self._queue_load(node, r.snapshot)
        if loads is None:
            self._pin(node, r.snapshot, -1)
            self.counters.load_fallbacks += 1
            path = self.tree.walk(toks, self._max_pages(toks))  # a split may have changed it
            r = self.tree.resume_point(path, device_only=True)
            node = self.tree.node_at(path, r.pages)
            self._pin(node, r.snapshot, +1)
            loads = []
        lease = Lease(lease_id=next(self._lease_ids), tokens=toks, resume_tokens=r.pages * self.page_tokens,
                      page_table=[], snapshot_id=None, page_tokens=self.page_tokens,
                      published_pages=r.pages,
                      _locked_node=node, _step=self.ctl.step)
        chain = list(node.iter_ancestors())[::-1]
        self.tree.touch(PathMatch(tuple((n, n.num_pages) for n in chain)))
        lease.page_table = [int(i) for n in chain for i in n.device_ids]
        for load in loads:
            if load.nodes:
                src = np.concatenate([n.host_ids for n in load.nodes])
                handle = self._submit("h2d", "page", src, load.page_dst, load)
                for n in load.nodes:
                    n.load_ticket = handle
            else:
                handle = self._submit("h2d", "state", np.asarray([load.snap_src]),
                                      np.asarray([load.snap_dst]), load)
                self._loading_snaps[id(load.snap)] = handle
        deps = {id(n.load_ticket): n.load_ticket for n in chain if n.load_ticket is not None}
        if r.snapshot is not None:
            snap = r.snapshot
            snap.last_access = self.tree.clock
            lease._resume_snapshot = snap
            lease.snapshot_id = snap.device_id
            if (h := self._loading_snaps.get(id(snap))) is not None:
                deps[id(h)] = h
        lease._deps = list(deps.values())
        loaded = sum(n.num_pages for load in loads for n in load.nodes)
        from_l3 = sum(n.num_pages for load in loads for n in load.nodes if n.from_l3)
        for load in loads:
            for n in load.nodes:
                n.from_l3 = False
        lease.loaded_tokens = loaded * self.page_tokens
        lease.l3_tokens = from_l3 * self.page_tokens
        c = self.counters
        c.loads += bool(loads)
        c.matches += 1
        c.match_tokens += len(toks)
        c.hit_tokens += lease.resume_tokens
        c.host_hit_tokens += (loaded - from_l3) * self.page_tokens
        c.l3_hit_tokens += from_l3 * self.page_tokens
        c.device_hit_tokens += lease.resume_tokens - loaded * self.page_tokens
        self._leases[lease.lease_id] = lease
        if self.config.write.write_policy == "write_through_selective":
            threshold = self.config.write.write_through_threshold
            self._backup_nodes([n for n in chain if n.hit_count >= threshold])
            if lease._resume_snapshot is not None and chain[-1].hit_count >= threshold:
                self._backup_snapshots([(chain[-1], lease._resume_snapshot)])
        if start:
            self.ctl.step()
        return lease

    def _pin(self, node: TreeNode, snap: Snapshot | None, delta: int) -> None:
        self.tree.lock(node, delta)
        if snap is not None:
            if delta > 0:
                snap.lock += delta
            else:
                self._unlock_snapshot(snap)

    def _queue_load(self, node: TreeNode, snap: Snapshot | None) -> list[Load] | None:
        """Allocate device rows for every shadow page up to ``node`` and for the snapshot.

        Returns the loads to submit, or None (nothing allocated) if there is no room.
        """
        shadows = [n for n in node.iter_ancestors() if not n.on_device][::-1]
        if shadows and any(n.load_ticket is not None for n in node.iter_ancestors() if n.on_device):
            return None  # never load below a copy that is still loading (it could fail)
        need = sum(n.num_pages for n in shadows)
        need_snap = snap is not None and snap.device_id is None
        for n in shadows:  # keep the source rows from host eviction while we make room
            n.lock_host += 1
        pages = self._alloc("device", "page", need) if need else None
        sres = self._alloc("device", "state", 1) if need_snap and (pages is None or pages.ok) else None
        ok = (pages is None or pages.ok) and (sres is None or sres.ok)
        if not ok:
            for n in shadows:
                n.lock_host -= 1
            if pages is not None and pages.ok:
                self._free("device", "page", pages.ids.numpy())
            return None
        loads = []
        if need:
            dst = pages.ids.numpy()
            off = 0
            for n in shadows:
                n.device_ids = dst[off: off + n.num_pages].copy()
                off += n.num_pages
            loads.append(Load(nodes=shadows, page_dst=dst))
        if need_snap:
            loads.append(Load(snap=snap, snap_src=snap.host_id, snap_dst=int(sres.ids[0])))
            snap.device_id = int(sres.ids[0])
            # Loading from now on, before anything is submitted: a drain under backpressure
            # may ack the page load first, and its exclusive-tier release must not free the
            # host row this snapshot load is about to read.
            self._loading_snaps[id(snap)] = None
            snap.loading = True  # the tree's eviction order leaves it (and its node) out
        return loads

    # -- requests' pages ----------------------------------------------------------------
    def _lease(self, lease: Lease) -> Lease:
        if not isinstance(lease, Lease) or self._leases.get(lease.lease_id) is not lease:
            raise MisuseError("unknown or released lease")
        return lease

    def alloc_pages(self, lease: Lease, n: int) -> AllocResult:
        """Append ``n`` device pages to the lease's page table (evicting if needed)."""
        self._lease(lease)
        if isinstance(n, bool) or not isinstance(n, (int, np.integer)) or n < 0:
            raise MisuseError(f"alloc_pages: n must be an integer >= 0, got {n!r}")
        res = self._alloc("device", "page", int(n))
        if res.ok:
            new = res.ids.tolist()
            lease.page_table.extend(new)
            lease.owned.update(new)
        return res

    def alloc_snapshot(self, lease: Lease) -> AllocResult:
        """One device state row for the engine to save a boundary's state into."""
        self._lease(lease)
        if not self.layout.object_bytes("state"):
            raise MisuseError("this layout has no state families; publish without a snapshot")
        res = self._alloc("device", "state", 1)
        if res.ok:
            lease._unpublished_snapshots.add(int(res.ids[0]))
        return res

    # -- progress -----------------------------------------------------------------------
    def step(self) -> None:
        """Launch every queued copy (one batched transfer per family and direction)."""
        self.ctl.step()

    def poll(self) -> int:
        """Launch queued copies and apply finished ones to the tree; returns acks applied."""
        self.ctl.step()
        n = self._process_acks()
        self._poll_l3()
        return n

    def drain(self, timeout: float | None = 30.0) -> None:
        """Wait for every queued and in-flight copy and apply them (tests, shutdown)."""
        self.ctl.step()
        for handle in list(self._handles.values()):
            handle.wait(timeout=timeout)
        self._process_acks()
        self._drain_l3(timeout)
        self._process_acks()

    def close(self) -> None:
        """Finish in-flight copies, apply them, and stop the copy workers."""
        if self._closed:
            return
        self.drain()
        self._close_l3()
        self.ctl.shutdown(wait=True)
        self._closed = True

    def _check_open(self) -> None:
        if self._closed:
            raise MisuseError("this HiCache is closed")

    def stats(self) -> dict:
        """Counters plus current occupancy of each tier (see docs/api.md for names)."""
        out = self.counters.as_dict()
        for tier in ("device", "host"):
            pools = getattr(self.pools, tier)
            for source in ("page", "state"):
                out[f"{tier}_{source}s_used"] = pools.num_used(source)
                out[f"{tier}_{source}s_total"] = pools.capacity(source)
        out["running_requests"] = len(self._leases)
        l3 = self.l3_stats()
        # faults are counted by type ("timeout") and by operation ("get.timeout"): one of each
        out["l3_errors"] = sum(v for k, v in l3.get("faults", {}).items() if "." not in k) if l3 else 0
        out["l3_rejected"] = sum(l3.get("rejected", {}).values()) if l3 else 0
        out["hit_rate"] = self.counters.hit_tokens / self.counters.match_tokens if self.counters.match_tokens else 0.0
        return out

    def check_integrity(self) -> None:
        """Assert every pool balances and every id is owned by exactly one holder."""
        from hicache.cache.integrity import check_cache

        check_cache(self)
