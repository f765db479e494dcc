"""Opening a lease: lock the deepest usable resume point, queue its loads, count the lookup.

:meth:`HiCache.load` in two halves. This half decides *where* a request resumes and holds it
there; the facade then submits the copies and backs up what the policy asks for::

    walk the tree -> resume point (deepest boundary with a snapshot, any tier)
    pin its path and snapshot          (before making room: eviction must not take them)
    device rows for its host pages     (Loader.queue: all or nothing, staged swaps land now)
      no room -> unpin, fall back to the deepest point already on the device
                 (stages of a swap that did land there count as loaded)
    lease: page table = the path's device pages, the snapshot it resumes from
    touch the path; passing snapshots the policy keeps warm are touched too
    count: hit tokens, of which loaded from the host, of which just fetched from L3

``expect`` is the touch alone, for a request still waiting in the engine's queue: the path
to its resume point (split there, as its load would, when the point is inside a node: a
layout without state), the snapshot at it and the snapshots the policy keeps warm count as
used now; nothing is pinned, loaded or counted as a hit.

It owns the lease ids and the lookup counters; the tree, loader, publisher and policy are
the facade's parts, called through their interfaces.
"""

from __future__ import annotations

import itertools
from typing import Callable

import numpy as np

from hicache.cache.lease import Lease
from hicache.cache.loads import Loader, loaded_pages
from hicache.cache.policy import PlacementPolicy
from hicache.cache.publisher import Publisher
from hicache.cache.results import LookupCounters
from hicache.cache.routing import Router
from hicache.cache.tags import Load
from hicache.tree import ROOT_HASH, PathMatch, RadixTree, ResumePoint, Snapshot, TreeNode


class LeaseOpener:
    """The first half of :meth:`HiCache.load` (module docstring)."""

    def __init__(self, tree: RadixTree, loader: Loader, publisher: Publisher, policy: PlacementPolicy,
                 router: Router, launcher: Callable[[], object]):
        self._tree = tree
        self._loader = loader
        self._publisher = publisher
        self._policy = policy
        self._router = router
        self._launcher = launcher
        self._ids = itertools.count(1)
        self.counters = LookupCounters()

    def open(self, toks: np.ndarray, max_pages: int, root_hash: bytes = ROOT_HASH
             ) -> tuple[Lease, ResumePoint, TreeNode, list[Load]]:
        """A lease on the deepest resume point of ``toks`` that can be held, with its loads;
        ``root_hash``: the tenant's (:mod:`hicache.tree.tenants`), whose tree it opens in."""
        r, node, loads = self._lock_resume_point(toks, max_pages, root_hash)
        lease = self._lease(toks, r, node)
        lease.root_hash = root_hash
        loaded, from_l3 = loaded_pages(loads)
        P = lease.page_tokens
        lease.loaded_tokens, lease.l3_tokens = loaded * P, from_l3 * P
        self.counters.count(len(toks), lease.resume_tokens, lease.loaded_tokens, lease.l3_tokens,
                            loaded=bool(loads))
        return lease, r, node, loads

    def expect(self, toks: np.ndarray, max_pages: int, root_hash: bytes = ROOT_HASH) -> int:
        """A queued request's resume path (and its snapshot, and the snapshots on the way
        the policy keeps warm) counts as used now, at a new tick (module docstring). Returns
        the tokens the request would resume with now (0: nothing touched, no tick)."""
        root = self._tree.tenant_root(root_hash, create=False)
        if root is None:
            return 0   # a tenant with nothing cached
        path = self._tree.walk(toks, max_pages, root)
        r = self._tree.resume_point(path)
        if r.pages == 0:
            return 0
        self._touch(self._tree.node_at(path, r.pages), r.snapshot, hit=False)
        self.counters.expects += 1
        return r.pages * self._tree.page_tokens

    def _touch(self, node: TreeNode, snap: Snapshot | None, *, hit: bool) -> list[TreeNode]:
        """Touch the path root..``node``, its resume snapshot and the passed snapshots the
        policy keeps warm, at one new tick; returns the path (root first)."""
        chain = list(node.iter_ancestors())[::-1]
        self._tree.touch(PathMatch(tuple((n, n.num_pages) for n in chain)), hit=hit)
        now = self._tree.clock
        if snap is not None:
            snap.last_access = now
            if hit:
                snap.resumed += 1
            elif not snap.expected:
                snap.expected = True   # a queued request resumes here: not an idle tail
        if hit:
            for n in chain[:-1]:
                if n.snapshot is not None:
                    n.snapshot.passed += 1
        for passed in self._policy.passed_snapshots(chain):
            passed.last_access = now
        return chain

    def _lock_resume_point(self, toks: np.ndarray, max_pages: int, root_hash: bytes
                           ) -> tuple[ResumePoint, TreeNode, list[Load]]:
        path = self._tree.walk(toks, max_pages, self._tree.tenant_root(root_hash, create=True))
        r = self._tree.resume_point(path)
        node = self._tree.node_at(path, r.pages)
        self._pin(node, r.snapshot)  # before making room: eviction must not take them
        loads = self._loader.queue(node, r.snapshot)
        if loads is not None:
            return r, node, loads
        self._unpin(node, r.snapshot)
        self.counters.load_fallbacks += 1
        # a split may have changed the path (and the unpin dropped a tenant root left empty)
        path = self._tree.walk(toks, max_pages, self._tree.tenant_root(root_hash, create=True))
        r = self._tree.resume_point(path, device_only=True)
        node = self._tree.node_at(path, r.pages)
        self._pin(node, r.snapshot)
        return r, node, self._loader.landed_on(node)   # stages of a swap that did land

    def _pin(self, node: TreeNode, snap: Snapshot | None) -> None:
        self._tree.lock(node)
        if snap is not None:
            self._publisher.pin(snap)

    def _unpin(self, node: TreeNode, snap: Snapshot | None) -> None:
        self._tree.lock(node, -1)
        if snap is not None:
            self._router.drop(self._publisher.unpin(snap))

    def _lease(self, toks: np.ndarray, r: ResumePoint, node: TreeNode) -> Lease:
        P = self._tree.page_tokens
        lease = Lease(lease_id=next(self._ids), tokens=toks, resume_tokens=r.pages * P, page_table=[],
                      snapshot_id=None, page_tokens=P, published_pages=r.pages, prompt_pages=len(toks) // P,
                      _locked_node=node, _step=self._launcher)
        chain = self._touch(node, r.snapshot, hit=True)
        lease.page_table = np.concatenate([n.device_ids for n in chain]).tolist() if chain else []
        if r.snapshot is not None:
            lease._resume_snapshot = r.snapshot
            lease.snapshot_id = r.snapshot.device_id
        return lease
