"""The engine-facing ``HiCache``: match, load, alloc, publish, release, poll.

One scheduler step of an engine, in terms of this API::

    cache.expect(queued_tokens)             # the waiting queue's head: keep its prefix
    m = cache.match(tokens)                 # pure lookup: resume point, tiers, L3 hashes
    lease = cache.load(m)                   # lock the prefix, queue host->device loads
    pages = cache.alloc_pages(lease, k)     # device pages for the tokens to compute
    cache.step()                            # launch every queued copy as one batch
    lease.wait(layer=l)                     # per layer, before attention of layer l
    ... compute into pools.device.view(family)[layer_idx, page_id] ...
    cache.publish(lease, tokens, n_pages, snapshot=sid, why=Boundary.PREFILL)
    ... decode ...
    cache.publish(lease, tokens, n_pages, snapshot=sid, why=Boundary.FINISH)
    cache.release(lease)
    cache.poll()                            # apply finished backups and loads

``HiCache`` is a thin facade over parts that each own their state and never call each
other; it routes what one part produces to the part that acts on it::

                     +------------- HiCache (leases; LeaseOpener, Prefetches) -------------+
    engine calls --> |  match/load/alloc/publish/release/prefetch/poll: route records     |
                     +---+---------------+----------------+-----------------+-------------+
                         |               |                |                 |
                    Residency         Copies          Publisher          L3Tier
                    pools, eviction,  controller,     retention,         store, prefetcher,
                    backup/load       copies in       snapshot pins,     puts, retries,
                    records, host     flight, acks    orphans            prefetch rows
                    tier                 |
                         \\______________|________________|_________________/
                                     Router (records between the parts, no state)
                                     RadixTree (the shared map of who holds what)
                                     PlacementPolicy (every placement decision)

The routes (an ack of a copy, a finished L3 put, a node leaving the tree) are listed in
:mod:`hicache.cache.routing`; the first half of :meth:`HiCache.load` (the resume point held,
the lease opened) is :mod:`hicache.cache.opener`; the L3 prefetch path is
:mod:`hicache.cache.prefetches`.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from hicache.units import check_int
from hicache.cache.admission import L3Admission
from hicache.cache.allocator import Allocator
from hicache.cache.copies import Copies
from hicache.cache.l3tier import L3Tier, Prefetch
from hicache.cache.lease import Lease, snapshot_row
from hicache.cache.loads import Loader
from hicache.cache.opener import LeaseOpener
from hicache.cache.policy import ConfiguredPolicy, PlacementPolicy
from hicache.cache.prefetches import Prefetches
from hicache.cache.publisher import Publisher
from hicache.cache.residency import Residency
from hicache.cache.routing import Router
from hicache.cache.results import CacheStats, MatchResult, PublishResult, resumable_pages
from hicache.cache.tokens import as_tokens
from hicache.config import HiCacheConfig, load_config
from hicache.errors import MisuseError
from hicache.layout import CacheLayout
from hicache.pools import AllocResult, Source, Tier, TieredPools, build_pools
from hicache.transfer import FaultInjector, TransferConfig
from hicache.tree import Boundary, PathMatch, RadixTree, chain_hashes, tenant_root_hash

DEVICE, HOST, PAGE, STATE = Tier.DEVICE, Tier.HOST, Source.PAGE, Source.STATE


class HiCache:
    """A three-tier prefix cache for one model layout (see module docstring).

    Not thread-safe: one engine thread drives it (copies and L3 I/O run on their own
    workers; a forward thread may wait on a lease, see :meth:`Lease.wait`).
    """

    def __init__(self, layout: CacheLayout, config: HiCacheConfig | None = None, *,
                 transfer: TransferConfig | None = None, hash_seed: bytes = b"hicache-v1",
                 fault_injector: FaultInjector | None = None, policy: PlacementPolicy | None = None):
        self.layout = layout
        self.config = config or HiCacheConfig()
        self.page_tokens = layout.page_tokens
        pools = build_pools(layout, self.config.pools)
        self._tree = RadixTree(layout.page_tokens, hash_seed=hash_seed, needs_snapshots=layout.has_state)
        self._policy = policy or ConfiguredPolicy(self.config, layout.page_tokens, needs_snapshots=layout.has_state,
                                                  ghost_units=pools.plan.page_units())
        self._residency = Residency(pools, self._tree, self._policy)
        # fault_injector: tests only -- called per copied layer, may raise TransferError.
        self._copies = Copies(pools, transfer or TransferConfig(), fault_injector=fault_injector)
        self._publisher = Publisher(self._tree, self._policy.retention)
        self._l3 = L3Tier(self.config.storage, layout, self._tree, pools.host, pools.plan.host_bytes,
                          pools.plan.page_bytes)
        self._admission = L3Admission(self.config.admit, layout, pools, self._l3.store, self.config.storage.url)
        self._router = Router(self._residency, self._copies, self._publisher, self._l3)
        self._allocator = Allocator(self._residency, self._copies, self._router.apply)
        self._loader = Loader(self._residency, self._allocator, self._copies, self._router.apply,
                              self._policy.exclusive_host)
        self._opener = LeaseOpener(self._tree, self._loader, self._publisher, self._policy, self._router,
                                   self._copies.launcher)
        self._prefetches = Prefetches(self._tree, self._l3, self._allocator, self._residency, self._router)
        self._leases: dict[int, Lease] = {}
        self._residency.resume_snapshots = lambda: [lease._resume_snapshot for lease in self._leases.values()
                                                    if lease._resume_snapshot is not None]
        self._closed = False

    @classmethod
    def from_config(cls, path: str, **overrides: Any) -> "HiCache":
        """Build from a config YAML (``configs/*.yaml``); overrides as in ``load_config``."""
        layout, cfg = load_config(path, **overrides)
        return cls(layout, cfg)

    # -- what the engine reads ----------------------------------------------------------------
    @property
    def pools(self) -> TieredPools:
        """The device and host pools: engines compute into ``pools.device.view(family)``."""
        return self._residency.pools

    @property
    def hash_seed(self) -> bytes:
        return self._tree.hash_seed

    @property
    def num_nodes(self) -> int:
        """Radix-tree nodes the cache holds now (each a run of pages)."""
        return self._tree.num_nodes

    @property
    def counters(self) -> CacheStats:
        """Every counter (a copy, gathered from the parts that count them)."""
        return CacheStats.gather(self._opener.counters, self._residency.counters, self._publisher.counters,
                                 self._l3.counters, self._admission.counters)

    def page_hashes(self, tokens: object, *, salt: str | bytes | None = None) -> list[bytes]:
        """The chained hash of every whole page of ``tokens`` (the L3 keys, the same in
        every process): ``h_i = SHA-256(seed | h_{i-1} | page i as int32 LE)``, from
        ``h_{-1}`` = the salt's root hash (zeros without one)."""
        return chain_hashes(self._tree.hash_seed, tenant_root_hash(self._tree.hash_seed, salt), as_tokens(tokens),
                            self.page_tokens)

    # -- lookup -------------------------------------------------------------------------------
    def _max_pages(self, tokens: np.ndarray) -> int:
        return resumable_pages(len(tokens), self.page_tokens)

    def match(self, tokens: object, *, salt: str | bytes | None = None) -> MatchResult:
        """Find the usable prefix of ``tokens`` across the device and host tiers.

        ``salt`` (a tenant; vLLM's ``cache_salt``): requests with different salts share no
        page or snapshot on any tier, L3 included -- the salt is mixed into the root of
        every page hash chain (:mod:`hicache.tree.tenants`). Without one (or ``""``),
        requests share as they always did. The salt travels with the match into
        :meth:`load` and with the lease into :meth:`publish`."""
        toks = as_tokens(tokens)
        max_pages = self._max_pages(toks)
        root_hash = tenant_root_hash(self._tree.hash_seed, salt)
        root = self._tree.tenant_root(root_hash, create=False)
        path = PathMatch(()) if root is None else self._tree.walk(toks, max_pages, root)
        r = self._tree.resume_point(path)
        hist = path.num_pages
        P = self.page_tokens
        l3 = chain_hashes(self._tree.hash_seed, path.last_hash if path.segments else root_hash,
                          toks[hist * P: max_pages * P], P) if self._l3.enabled else []
        tier = None
        if r.snapshot is not None:
            tier = DEVICE if r.snapshot.device_id is not None else HOST
        return MatchResult(tokens=toks, page_tokens=P, resume_tokens=r.pages * P,
                           device_tokens=r.device_pages * P, host_tokens=(r.pages - r.device_pages) * P,
                           snapshot_tier=tier, history_tokens=hist * P, l3_hashes=tuple(l3), root_hash=root_hash)

    def expect(self, tokens: object, *, salt: str | bytes | None = None) -> int:
        """The engine will admit a request for ``tokens`` soon (it waits in the queue): its
        usable prefix counts as used now, so eviction keeps it. Call it for the head of the
        waiting queue at each step, the next to be admitted last; nothing is locked, loaded
        or counted as a hit. Returns the tokens it would resume with now. ``salt``: the
        request's tenant, as in :meth:`match`."""
        self._check_open()
        toks = as_tokens(tokens)
        root_hash = tenant_root_hash(self._tree.hash_seed, salt)
        self._policy.observe_expect(toks, self._max_pages(toks), root_hash)
        return self._opener.expect(toks, self._max_pages(toks), root_hash)

    # -- load ---------------------------------------------------------------------------------
    def load(self, match: MatchResult, *, start: bool = True) -> Lease:
        """Lock the usable prefix of ``match`` and queue the loads it needs from the host.

        All-or-nothing per request: if the device cannot take every host page and the
        snapshot, the lease resumes from the deepest point that is already on the device
        (nothing is loaded, but for the stages of a staged swap that landed before it came
        up short: they stay, and count as loaded if the lease resumes on them).
        ``start=False`` leaves the copies queued for the next :meth:`step`, so a scheduler
        can batch the loads of many requests into one copy --
        except on an exclusive host tier when the load is bigger than the device's free
        rows: then its leading pages are swapped in stages, copied and applied inside this
        call (:mod:`hicache.cache.loads`; that launches every queued copy).
        """
        self._check_open()
        if not isinstance(match, MatchResult):
            raise MisuseError(f"load() takes the MatchResult of match(), got {type(match).__name__}")
        toks = match.tokens
        lease, r, node, loads = self._opener.open(toks, self._max_pages(toks), match.root_hash)
        if self._policy.observe_lookup(lease.lease_id, toks, self._max_pages(toks), match.root_hash):
            self._tree.reorder()   # the policy follows another order: rebuilt once, on first use
        self._loader.submit(loads)
        chain = list(node.iter_ancestors())[::-1]
        deps = [n.load_ticket for n in chain if n.load_ticket is not None]
        if r.snapshot is not None and r.snapshot.load_ticket is not None:
            deps.append(r.snapshot.load_ticket)
        lease._deps = list(dict.fromkeys(deps))
        self._leases[lease.lease_id] = lease
        nodes, snap = self._policy.backup_on_hit(chain, r.snapshot)
        self._allocator.backup_pages(nodes)
        if snap and r.snapshot is not None:
            self._allocator.backup_snapshots([(chain[-1], r.snapshot)])
        if lease.resume_tokens and (r.snapshot is not None or not self.layout.has_state):
            self._admission.reused(chain[-1], r.snapshot)
        self._router.route_removed()
        if start:
            self._copies.step()
        return lease

    # -- requests' pages ----------------------------------------------------------------------
    def _lease(self, lease: Lease) -> Lease:
        if not isinstance(lease, Lease) or self._leases.get(lease.lease_id) is not lease:
            raise MisuseError("unknown or released lease")
        return lease

    def alloc_pages(self, lease: Lease, n: int) -> AllocResult:
        """Append ``n`` device pages to the lease's page table (evicting if needed)."""
        self._lease(lease)
        count = check_int("alloc_pages: n", n, minimum=0, misuse=True)
        assert count is not None
        res = self._allocator.alloc(DEVICE, PAGE, count)
        if res.ok:
            new = res.ids.tolist()
            lease.page_table.extend(new)
            lease.owned.update(new)
        return res

    def alloc_snapshot(self, lease: Lease) -> AllocResult:
        """One device state row for the engine to save a boundary's state into; pass the
        allocation (or its id) to :meth:`publish` as ``snapshot``."""
        self._lease(lease)
        if not self.layout.object_bytes("state"):
            raise MisuseError("this layout has no state families; publish without a snapshot")
        res = self._allocator.alloc(DEVICE, STATE, 1)
        if res.ok:
            lease._unpublished_snapshots.add(int(res.ids[0]))
        return res

    # -- publish / release --------------------------------------------------------------------
    def publish(self, lease: Lease, tokens: object, num_pages: int, *, snapshot: object = None,
                snapshot_id: int | None = None, why: Boundary | str = Boundary.PREFILL) -> PublishResult:
        """Publish the lease's first ``num_pages`` pages (and a snapshot for that boundary).

        Call it after each prefill chunk (mid-flight: concurrent siblings reuse the prefix
        at once) and at finish. Pages move from the lease into the tree without a copy; an
        identical page someone published first wins and the lease's copy is freed (its
        page table then points at the winner). Everything published stays locked until
        :meth:`release`. ``snapshot`` is what :meth:`alloc_snapshot` returned (or its row
        id; ``snapshot_id=`` is the older spelling); ``why`` tells the retention policy
        what the boundary is.
        """
        self._lease(lease)
        toks = as_tokens(tokens)
        try:
            why = Boundary(why)
        except ValueError:
            raise MisuseError(f"publish: why={why!r} is not one of {[b.value for b in Boundary]}") from None
        sid = snapshot_row(snapshot if snapshot is not None else snapshot_id)
        lease.check_publish(toks, num_pages, sid)
        past = num_pages * self.page_tokens > lease.resume_tokens and lease._resume_snapshot is not None
        done = self._publisher.publish_pages(lease, toks, num_pages, finish=why is Boundary.FINISH)
        self._residency.free(DEVICE, PAGE, done.duplicates)
        self._allocator.backup_pages(self._policy.backup_on_publish(done.new_nodes))
        for node in done.new_nodes:  # exclusive tier: a recomputed shadow leaves the host
            self._residency.release_host_copy(node)
        outcome = None
        offered = False
        if sid is not None:
            lease._unpublished_snapshots.discard(sid)
            if done.complete and num_pages > 0 and done.last.parent is not None:
                offered = True
                offer = self._publisher.offer_snapshot(lease, done.last, sid, num_pages * self.page_tokens, why)
                outcome = offer.outcome
                if offer.free_row is not None:
                    self._residency.free(DEVICE, STATE, [offer.free_row])
                self._residency.release_host_snapshot(offer.regained)  # exclusive: the host copy goes
                self._router.drop(offer.drop)
                if offer.kept is not None and self._policy.backup_snapshot_on_publish(*offer.kept):
                    self._allocator.backup_snapshots([offer.kept])
                if offer.kept is not None:
                    self._admission.offer(*offer.kept, why.value)
            else:  # the boundary could not be published (a copy there is still loading)
                self._residency.free(DEVICE, STATE, [sid])
                self._publisher.unpublishable()
        elif not self.layout.has_state and done.complete and num_pages > 0 and done.last.parent is not None:
            self._admission.offer(done.last, None, why.value)   # no state: the pages are the chain
        if past:
            self._router.drop(self._publisher.past_resume(lease))
        self._router.route_removed()
        self._policy.observe_publish(lease.lease_id, toks, num_pages, why.value, offered, lease.root_hash)
        return PublishResult(published_pages=lease.published_pages,
                             duplicates_freed=int(done.duplicates.size), snapshot=outcome)

    def release(self, lease: Lease) -> None:
        """End a request: unlock its pages and snapshots, free what it never published."""
        self._lease(lease)
        self._policy.observe_release(lease.lease_id)
        out = self._publisher.release(lease)
        self._router.drop(out.drop)
        self._residency.free(DEVICE, PAGE, out.pages)
        self._residency.free(DEVICE, STATE, out.snapshot_rows)
        del self._leases[lease.lease_id]
        self._router.route_removed()

    # -- L3 prefetch ---------------------------------------------------------------------------
    def prefetch(self, match: MatchResult) -> Prefetch | None:
        """Start looking up (in L3) the pages past the host hit; None if there is nothing to ask.

        Never blocks: the lookup runs on a storage worker. The prefix the pages will extend
        stays in the tree until :meth:`finish_prefetch` or :meth:`cancel_prefetch`.
        """
        self._check_open()
        return self._prefetches.start(match)

    def finish_prefetch(self, pf: Prefetch | None, *, landed_pages: int | None = None) -> int:
        """Apply the prefetch policy, insert what arrived as host nodes; returns tokens added.

        ``landed_pages`` is for callers that keep their own clock (a simulator such as the
        reference engine, which decides from bytes and bandwidth what would have arrived
        by now): the lookup and the fetch are then waited for in full, whatever the policy,
        and only the first ``landed_pages`` fetched pages are inserted -- none when the plan
        carries a state snapshot and ``landed_pages`` is short of the whole plan (history
        without its state is of no use). ``None`` (the default): the policy decides.
        """
        if pf is None:
            return 0
        if pf.finished:
            return pf.inserted_tokens
        check_int("finish_prefetch: landed_pages", landed_pages, minimum=0, optional=True, misuse=True)
        return self._prefetches.finish(pf, landed_pages)

    def start_fetch(self, pf: Prefetch | None) -> bool:
        """Start fetching what ``pf``'s finished lookup found into host rows, without
        waiting for anything; False while the lookup is still in flight (call again).

        For callers that must never block (a scheduler asked to answer at once, such as
        vLLM's ``get_num_new_matched_tokens``): once this returns True, ``pf.op.wait(0)``
        tells when the bytes have landed, and :meth:`finish_prefetch` then inserts them
        without waiting. Without it, :meth:`finish_prefetch` starts the fetch itself and
        waits as the prefetch policy says.
        """
        if pf is None:
            return True
        self._check_open()
        return self._prefetches.start_fetch(pf)

    def cancel_prefetch(self, pf: Prefetch | None) -> None:
        """Give up on a prefetch that will not be finished (releases its memory budget)."""
        if pf is not None:
            self._prefetches.cancel(pf)

    # -- progress -----------------------------------------------------------------------------
    def step(self) -> None:
        """Launch every queued copy (one batched transfer per family and direction)."""
        self._copies.step()

    def poll(self, *, wait: bool = False, now: float | None = None) -> int:
        """Launch queued copies and apply finished ones to the tree; returns acks applied.

        ``wait``: first launch and wait for every device <-> host copy queued so far, the
        leases' loads included, and for every queued L3 put (not L3 fetches), so what is
        applied does not depend on the copy and put threads' timing -- a simulation that
        polls at its step boundaries is then reproducible. ``now``: the caller's clock
        (seconds; None: monotonic), which paces L3 admission (:mod:`.admission`)."""
        if wait:
            self._copies.wait_all()
        self._copies.step()
        n = self._router.apply_acks()
        self._admission.run(now)
        self._router.after_puts(self._l3.settle() if wait else self._l3.poll())
        self._admission.finish(self._l3.take_foreign())
        self._router.free_fetched_rows()
        self._router.route_removed()
        return n

    def drain(self, timeout: float | None = 30.0) -> None:
        """Wait for every queued and in-flight copy and apply them (tests, shutdown)."""
        self._copies.wait_all(timeout)
        self._router.apply_acks()
        self._router.after_puts(self._l3.drain(timeout))
        self._admission.finish(self._l3.take_foreign())
        self._router.free_fetched_rows()
        self._router.apply_acks()
        self._router.route_removed()

    def close(self) -> None:
        """Finish in-flight copies, apply them, and stop the copy workers."""
        if self._closed:
            return
        self.drain()
        self._router.after_puts(self._l3.close())
        self._router.free_fetched_rows()
        self._router.route_removed()
        self._copies.shutdown()
        self._closed = True

    def _check_open(self) -> None:
        if self._closed:
            raise MisuseError("this HiCache is closed")

    # -- stats and checks ---------------------------------------------------------------------
    def stats(self) -> dict:
        """Counters plus current occupancy of each tier (see docs/api.md for names)."""
        out: dict[str, Any] = dict(self.counters.as_dict())
        for tier in (DEVICE, HOST):
            pools = self.pools.tier(tier)
            for source in (PAGE, STATE):
                out[f"{tier.value}_{source.value}s_used"] = pools.num_used(source)
                out[f"{tier.value}_{source.value}s_total"] = pools.capacity(source)
        out["running_requests"] = len(self._leases)
        out.update(self._policy.tuning())
        l3 = self.l3_stats()
        # faults are counted by type ("timeout") and by operation ("get.timeout"): one of each
        out["l3_errors"] = sum(v for k, v in l3.get("faults", {}).items() if "." not in k) if l3 else 0
        out["l3_rejected"] = sum(l3.get("rejected", {}).values()) if l3 else 0
        c = self._opener.counters
        out["hit_rate"] = c.hit_tokens / c.match_tokens if c.match_tokens else 0.0
        return out

    def l3_stats(self) -> dict:
        """The L3 store's counters, faults by type, rejections, breaker and I/O histograms
        (``{}`` without L3)."""
        return self._l3.stats()

    def transfer_stats(self) -> dict:
        """Per direction (``d2h``, ``h2d``): bytes, seconds and GB/s of successful copies,
        ops, batches, launches, failures; the copy backend and what is queued."""
        return self._copies.stats()

    def set_fault_injector(self, fault_injector: FaultInjector | None) -> None:
        """Tests and stress runs: a hook called per copied layer; raising fails that copy."""
        self._copies.set_fault_injector(fault_injector)

    def check_integrity(self) -> None:
        """Assert every pool balances and every id is owned by exactly one holder."""
        from hicache.cache.integrity import check_cache

        check_cache(self.pools, self._tree, list(self._leases.values()), self._copies, self._l3, self._publisher)
