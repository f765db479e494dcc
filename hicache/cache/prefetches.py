"""The L3 prefetch path of :class:`hicache.cache.facade.HiCache`.

A prefetch asks L3 for the pages past a request's host hit while the request waits in the
engine's queue::

    start   the prefix it extends is walked and kept; the lookup runs on a storage worker
    finish  the plan (what L3 has, in order) gets host rows, all or nothing -- pages and,
            when the plan ends at a stored snapshot, one state row -- and the fetch runs;
            what landed is inserted as host nodes (never history without its state)
    cancel  the lookup or fetch is abandoned and its memory budget released

It owns no state: the plan and its rows are the L3 tier's until inserted, the rows come
from the allocator (evicting host victims as any host allocation does).
"""

from __future__ import annotations

from hicache.cache.allocator import Allocator
from hicache.cache.l3tier import L3Tier, Prefetch
from hicache.cache.residency import Residency
from hicache.cache.results import MatchResult
from hicache.cache.routing import Router
from hicache.pools import Source, Tier
from hicache.tree import RadixTree


class Prefetches:
    """Start, finish and cancel L3 prefetches (module docstring)."""

    def __init__(self, tree: RadixTree, l3: L3Tier, allocator: Allocator, residency: Residency, router: Router):
        self._tree = tree
        self._l3 = l3
        self._allocator = allocator
        self._residency = residency
        self._router = router

    def start(self, match: MatchResult) -> Prefetch | None:
        """The lookup of ``match``'s L3 pages, or None when there is nothing to ask."""
        if not self._l3.enabled or not match.l3_hashes or self._residency.pools.host.host_layout != "page_first":
            return None  # fetches land straight in host objects; layer_first has none
        base = match.history_tokens // match.page_tokens
        root = self._tree.tenant_root(match.root_hash, create=True)   # the request's tenant
        assert root is not None
        path = self._tree.walk(match.tokens, base, root)
        pf = None
        if path.num_pages == base:   # else the tree changed since the match: match again
            pf = self._l3.start(match.tokens, match.l3_hashes, base, self._tree.node_at(path, base))
        self._tree.prune_root(root)   # a tenant root no prefetch pins and nothing hangs below
        return pf

    def start_fetch(self, pf: Prefetch) -> bool:
        """Carry out ``pf``'s plan now if its lookup is done, without waiting; True once
        nothing but the fetch itself is left (then ``pf.op.wait(0)`` says when it landed)."""
        if pf.finished or pf.fetch_started:
            return pf.fetch_started
        if not pf.op.wait_planned(0):
            return False
        pf.fetch_started = True
        if pf.op.plan is not None and pf.op.status.value == "planned":
            self._fetch(pf, pf.op.plan)
        return True

    def _fetch(self, pf: Prefetch, plan) -> None:
        HOST, PAGE, STATE = Tier.HOST, Source.PAGE, Source.STATE
        pages = self._allocator.alloc(HOST, PAGE, plan.pages)
        state = self._allocator.alloc(HOST, STATE, 1) if pages.ok and plan.state_index is not None else None
        if pages.ok and (state is None or state.ok):
            self._l3.fetch(pf, pages.ids.numpy(), int(state.ids[0]) if state is not None else None)
        else:
            if pages.ok:
                self._residency.free(HOST, PAGE, pages.ids.numpy())
            self._l3.abandon(pf)

    def finish(self, pf: Prefetch, landed_pages: int | None) -> int:
        """Fetch what the plan offers into host rows (unless :meth:`start_fetch` did) and
        insert it; returns tokens added."""
        if pf.fetch_started:
            pf.finished = True
        else:
            plan = self._l3.await_plan(pf, landed_pages)
            if plan is not None:
                self._fetch(pf, plan)
        tokens = self._l3.complete(pf, landed_pages)
        self._router.free_fetched_rows()
        self._router.route_removed()
        return tokens

    def cancel(self, pf: Prefetch) -> None:
        """Abandon ``pf`` (its memory budget goes back)."""
        self._l3.cancel(pf)
