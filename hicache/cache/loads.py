"""Loading a resume point's host pages and snapshot back to the device.

:class:`Loader` turns a resume point into loads: the :class:`~hicache.cache.tags.LoadPlan`
(its shadow nodes, root first, and a host-only snapshot), device rows for all of them (all or
nothing: evicting, and under write_back demoting, device victims), and the H2D copies. It
owns no state of its own; the nodes' rows and tickets are the residency's and the tree's.

The staged swap (exclusive host tier). A loaded chain's host rows are freed only when its
load is acked, so while a big load is in flight its chain occupies the host *and* the
device victims it displaces need host rows too: a swap needs scratch host room as large as
the load. Without it a victim that could still hit is dropped, or the host evicts another
chain (on the long-revisit workload a whole 1M-token document went this way). When the
plan's pages exceed the device's free rows, the chain's leading shadows are loaded in
stages, each no larger than what the device and host have free, and each stage is copied
and applied at once (its ack frees its host rows) before the next asks for device rows::

    host:   [ A1 A2 A3 | free ]      device: [ B1 B2 B3 ]      (resume on chain A)
    stage 1: rows for A1 evict B1 -> B1 demoted into the free host rows; A1 lands, its
             host rows are freed
    stage 2: rows for A2 evict B2 -> B2 demoted into A1's old host rows; ...
    last:    what is left goes in the ordinary single load, launched with the others

A stage's copy runs synchronously inside ``load()`` (like a write_back eviction's backup; it
launches every queued copy, other leases' too) and only its own ack is applied; other
copies' acks stay collected for ``poll()``. A load that cannot land whole -- a stage fails,
or the rest finds no room -- keeps the stages that landed on the device (they are cached
pages like any other, and an intermediate snapshot left on the device at one of their ends
makes them resumable) and falls back to the deepest resume point on the device; the stages
on that point's chain count as loaded (:meth:`landed_on`). Measured: gating staging on the
whole load being feasible, so that such a load moved nothing, cost 1.2 points on ShareGPT
s1 at host 0.5 GiB (85.1 -> 83.9).
"""

from __future__ import annotations

from typing import Callable

import numpy as np

from hicache.cache.allocator import Allocator
from hicache.cache.copies import Copies
from hicache.cache.residency import Residency
from hicache.cache.tags import Load, LoadPlan
from hicache.pools import Source, Tier
from hicache.transfer import Ack, Direction, LoadHandle
from hicache.tree import Snapshot, TreeNode

DEVICE, HOST, PAGE, STATE = Tier.DEVICE, Tier.HOST, Source.PAGE, Source.STATE


class Loader:
    """The load path of :meth:`HiCache.load` (see module docstring)."""

    def __init__(self, residency: Residency, allocator: Allocator, copies: Copies,
                 apply: Callable[[Ack], None], exclusive_host: bool):
        self._res = residency
        self._alloc = allocator
        self._copies = copies
        self._apply = apply
        self._exclusive = exclusive_host
        self._landed: list[Load] = []   # the stages of the last queue() that returned None

    def queue(self, node: TreeNode, snap: Snapshot | None) -> list[Load] | None:
        """Device rows for every shadow page up to ``node`` and for the snapshot: the loads
        (staged ones already landed), or None when there is no room (nothing is allocated
        for what did not land)."""
        res = self._res
        plan = res.load_plan(node, snap)
        if plan is None:
            return None
        res.hold_sources(plan, +1)  # keep the source rows from host eviction while we make room
        staged, plan = self._stage(plan)
        if plan is None:
            return None
        pages = self._alloc.alloc(DEVICE, PAGE, plan.pages) if plan.pages else None
        state = (self._alloc.alloc(DEVICE, STATE, 1)
                 if plan.snapshot is not None and (pages is None or pages.ok) else None)
        if (pages is not None and not pages.ok) or (state is not None and not state.ok):
            res.hold_sources(plan, -1)
            if pages is not None and pages.ok:
                res.free(DEVICE, PAGE, pages.ids.numpy())
            self._landed = staged
            return None
        return staged + res.loads_for(plan, pages, state)

    def landed_on(self, node: TreeNode) -> list[Load]:
        """After :meth:`queue` returned None: its stages that landed, cut to the chain of
        ``node`` (the fallback resume point), for the lease to count as loaded."""
        chain = set(node.iter_ancestors())
        out = [Load(nodes=[n for n in load.nodes if n in chain], landed=True) for load in self._landed]
        self._landed = []
        return [load for load in out if load.nodes]

    def _stage(self, plan: LoadPlan) -> tuple[list[Load], LoadPlan | None]:
        """Load the plan's leading shadows stage by stage while the rest does not fit the
        device's free rows (exclusive tier). Returns the landed stages and what is left to
        load, or None for the rest when a stage failed (its sources let go)."""
        staged: list[Load] = []
        if not self._exclusive:
            return staged, plan
        device, host = self._res.pools.device, self._res.pools.host
        shadows, pages = list(plan.shadows), plan.pages
        while shadows:
            free = device.num_free(PAGE)
            if pages <= free:
                break
            room = free + host.num_free(PAGE)   # device victims demote into free host rows
            take, size = 0, 0
            while take < len(shadows) and size + shadows[take].num_pages <= room:
                size += shadows[take].num_pages
                take += 1
            if take == 0 or take == len(shadows):
                break          # no stage fits, or all of it does: the ordinary load decides
            stage, rest = shadows[:take], shadows[take:]
            rows = self._alloc.alloc(DEVICE, PAGE, size)
            if not rows.ok:
                break
            load = self._res.loads_for(LoadPlan(stage, size, None), rows, None)[0]
            self.submit([load])
            ack = self._copies.run_now(load)
            self._apply(ack)    # the stage's device copy is in place; its host rows go
            if not ack.ok:
                self._res.hold_sources(LoadPlan(rest, pages - size, None), -1)
                self._landed = staged
                return staged, None
            load.landed = True
            staged.append(load)
            shadows, pages = rest, pages - size
        return staged, LoadPlan(shadows, pages, plan.snapshot)

    def submit(self, loads: list[Load]) -> None:
        """Queue the loads' copies (staged ones have landed already) and put their tickets
        on the nodes and snapshots they fill."""
        for load in loads:
            if load.landed:
                continue
            if load.nodes:
                assert load.page_dst is not None
                src = np.concatenate([n.host_ids for n in load.nodes if n.host_ids is not None])
                ticket = self._copies.submit(Direction.H2D, PAGE, src, load.page_dst, load)
                assert isinstance(ticket, LoadHandle)
                load.ticket = ticket
                for n in load.nodes:
                    n.load_ticket = ticket
            else:
                assert load.snap is not None
                ticket = self._copies.submit(Direction.H2D, STATE, np.asarray([load.snap_src]),
                                             np.asarray([load.snap_dst]), load)
                assert isinstance(ticket, LoadHandle)
                load.ticket = load.snap.load_ticket = ticket


def loaded_pages(loads: list[Load]) -> tuple[int, int]:
    """(pages the loads bring from the host, how many of those an L3 fetch had just put
    there); clears the nodes' ``from_l3`` marks, so a fetched page counts as an L3 hit once."""
    loaded = from_l3 = 0
    for load in loads:
        for n in load.nodes:
            loaded += n.num_pages
            from_l3 += n.num_pages if n.from_l3 else 0
            n.from_l3 = False
    return loaded, from_l3
