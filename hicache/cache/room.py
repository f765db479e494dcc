"""Making room in a shared arena: compaction, then one eviction order for pages and snapshots.

With ``budget: shared`` (every tier) or ``shared_host`` (the host) a tier is one arena
(:mod:`hicache.pools.arena`): pages from the low end, snapshots from the high end, a free
middle between their frontiers. An
allocation of kind K (page or state) that is short gets room here, owned by
:class:`~hicache.cache.residency.Residency`::

    while K does not fit:
        1. compact the OTHER kind's region: move its frontier object into its lowest hole
           (bytes copied inside the tier's buffer by ``TierPools.move``, then its one owner
           updated), until the middle is wide enough or the next frontier cannot move
        2. evict the coldest victim of EITHER kind of this tier (pages: device_victims /
           host_victims; snapshots: snapshot_victims), compared on one priority scale

K's own region is not compacted for K: its holes already count in ``num_free(K)`` (an
allocation takes holes first), so moving K's objects would only widen the middle for the
other kind -- which is what step 1 does when the other kind asks.

One priority scale: a page run's key in the tree's order is ``(alive, node_priority,
node_id)`` (dead tails first) and a snapshot's ``(snapshot_priority, node_id)``; merged,
a page run ranks by ``(alive, node_priority)`` and a snapshot by ``(True,
snapshot_priority)``, so a dead tail goes before any snapshot and otherwise the strategy
decides which is colder (a tie evicts the snapshot: it frees more bytes, and the run it
ended becomes a dead tail). Both orders are read afresh for each victim, so a victim's
eviction (a removed subtree, a snapshot turning a run into a dead tail) is seen at once.

Under write_back a device victim is backed up to the host before it goes when the placement
policy finds it worth a host copy, the same decisions as with split pools: a page run
(``worth_demoting``; under ``value`` a dead tail is dropped) is demoted with its end
snapshot going down with it, and a snapshot victim on its own (``worth_demoting_snapshot``;
under ``value`` a mid-chain one is dropped).

Who may move: an object owned by the tree (a node's page ids on that tier, a snapshot's
row) that nothing reads or writes -- for pages no lease lock (a lease's page table holds
their ids), for snapshots not a running lease's resume snapshot (its row is the lease's
``snapshot_id``); a snapshot locked only as a lease's newest published one moves, since
the lease holds the Snapshot, not its row (left in place, it could pin the state frontier
and starve its own request of pages) -- no load or backup or L3 put in flight, no open
prefetch pin. Ids held elsewhere (a lease's unpublished pages and snapshots, a
backup's or a prefetch's destination rows) have no tree owner and never move. Owners are
found in the tree's owner index (:mod:`hicache.tree.owners`).

Feasibility is decided by the caller before anything is evicted (:meth:`Room.feasible`):
the pinned bytes of both kinds plus the request must fit the arena, and a snapshot request
its cap. It is a bound on bytes: a pinned object stuck at a region's frontier can still
leave an allocation short after colder objects were evicted.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Callable, Iterator, Sequence, TypeVar

import numpy as np

from hicache.pools import Source, Tier, TierPools
from hicache.tree import Snapshot, TreeNode, device_victims, host_victims, snapshot_victims

if TYPE_CHECKING:
    from hicache.cache.residency import Residency

BackupPages = Callable[[Sequence[TreeNode]], None]
BackupSnapshots = Callable[[Sequence[tuple[TreeNode, Snapshot]]], None]
T = TypeVar("T")
_OTHER = {Source.PAGE: Source.STATE, Source.STATE: Source.PAGE}


class Room:
    """Room-making for shared arenas (see module docstring); one per :class:`Residency`."""

    def __init__(self, residency: "Residency"):
        self._res = residency

    def _pools(self, tier: Tier) -> TierPools:
        return self._res.pools.tier(tier)

    # -- feasibility ---------------------------------------------------------------------------
    def feasible(self, tier: Tier, source: Source, n: int) -> bool:
        """Could compaction and eviction make room for ``n`` objects of ``source``?"""
        pools = self._pools(tier)
        arena = pools.arena
        assert arena is not None, "room-making is for shared arenas"
        if n > pools.capacity(source):
            return False
        tree = self._res._tree
        pinned = {s: pools.num_used(s) - tree.evictable(tier.value, s.value) for s in (Source.PAGE, Source.STATE)}
        obj = {s: arena.region(s.value).obj_bytes for s in pinned}
        if source is Source.STATE and pinned[Source.STATE] + n > pools.capacity(source):
            return False
        return sum(pinned[s] * obj[s] for s in pinned) + n * obj[source] <= arena.arena_bytes

    # -- the loop ------------------------------------------------------------------------------
    def make_room(self, tier: Tier, source: Source, n: int, backup_pages: BackupPages,
                  backup_snapshots: BackupSnapshots) -> None:
        """Compact and evict (coldest first, either kind) until ``n`` of ``source`` fit or
        nothing more can go. ``backup_*`` copy write_back victims to the host first."""
        pools = self._pools(tier)
        kept: set[TreeNode] = set()   # device victims that could not go (a subtree read)
        while pools.num_free(source) < n:
            if self._compact(tier, _OTHER[source], self._target_extent(pools, source, n)):
                continue
            victim = self._next_victim(tier, kept)
            if victim is None:
                return
            if isinstance(victim, TreeNode):
                if tier is Tier.DEVICE:
                    if not self._evict_device_node(victim, backup_pages, backup_snapshots):
                        kept.add(victim)
                else:
                    self._res.evict_host_node(victim)
            else:
                node, snap = victim
                if self._res.evict_snapshot(tier, node, snap):   # write_back, worth a host copy
                    backup_snapshots([(node, snap)])
                    self._res.drop_backed_up_snapshots([(node, snap)])

    @staticmethod
    def _target_extent(pools: TierPools, source: Source, n: int) -> int:
        """The other region's largest extent at which ``n`` more ``source`` objects fit."""
        arena = pools.arena
        assert arena is not None
        r = arena.region(source.value)
        return arena.arena_bytes - (r.n_used + n) * r.obj_bytes

    def _next_victim(self, tier: Tier, kept: set[TreeNode]) -> TreeNode | tuple[TreeNode, Snapshot] | None:
        tree, strategy = self._res._tree, self._res._policy.strategy
        order = tree.eviction_order(strategy)
        if tier is Tier.DEVICE:
            pages = device_victims(tree, strategy, kept.__contains__ if kept else None)
            heap = order.device
        else:
            pages, heap = host_victims(tree, strategy), order.host
        node = _first(pages)
        snap = _first(snapshot_victims(tree, strategy, tier.value))
        if node is None or snap is None:
            return node if snap is None else snap
        pkey = heap.key(node)
        skey = order.snapshots[tier.value].key(snap[1])
        assert pkey is not None and skey is not None, "a victim without its order entry"
        return node if (pkey[0], pkey[1]) < (True, skey[0]) else snap

    def _evict_device_node(self, node: TreeNode, backup_pages: BackupPages,
                           backup_snapshots: BackupSnapshots) -> bool:
        """Demote or drop one device victim (write_back: back it up first, when the policy
        finds it worth a host copy); False if it stays.

        The victim goes whole, unlike with split pools (``Residency._trim``): cutting it to
        the ask measured 3.5 points worse on ShareGPT seed 1 at the tightest budget. A
        snapshot ask cannot use the holes a cut tail leaves until compaction moves pages
        into them, and the page frontier is usually a running request's (pinned).
        """
        res, policy = self._res, self._res._policy
        if policy.write_back and not node.on_host and policy.worth_demoting(node):
            backup_pages([node])
            backup_snapshots(res.snapshots_down_with([node]))   # as with split pools
            return res.demote_backed_up([node]) == 0
        return res.drop_device_copy(node)

    # -- compaction ----------------------------------------------------------------------------
    def _compact(self, tier: Tier, source: Source, target: int) -> bool:
        """Move ``source``'s frontier objects into its lowest holes until its extent is at
        most ``target`` or the next one cannot move; True if anything moved."""
        pools = self._pools(tier)
        arena = pools.arena
        assert arena is not None, "compaction is for shared arenas"
        if pools.extent(source.value) <= target or not arena.region(source.value).holes:
            return False
        moves = pools.compaction_moves(source.value)
        # the fewest moves that bring the extent down to the target (all of them when none
        # do): each move shrinks it, so a bisection over the count (each probe O(holes)) ...
        lo, hi = 1, len(moves)
        while lo < hi:
            mid = (lo + hi) // 2
            if pools.extent_after(source.value, mid) <= target:
                hi = mid
            else:
                lo = mid + 1
        moves = moves[:lo]
        # ... of which the leading ones whose frontier object the tree owns and nothing holds
        # move (so only their owners are looked up)
        owners = self._owners(tier, source, {m[0] for m in moves}) if moves else {}
        k = 0
        while k < len(moves) and moves[k][0] in owners:
            k += 1
        if k == 0:
            return False
        old, new = [m[0] for m in moves[:k]], [m[1] for m in moves[:k]]
        pools.move(source.value, old, new)   # one batched copy
        attr = "device_ids" if tier is Tier.DEVICE else "host_ids"
        node_ids: dict[TreeNode, np.ndarray] = {}
        for o, n in zip(old, new):
            owner = owners[o]
            if isinstance(owner, Snapshot):
                if tier is Tier.DEVICE:
                    owner.device_id = n
                else:
                    owner.host_id = n
            else:
                node, pos = owner
                if node not in node_ids:
                    node_ids[node] = getattr(node, attr).copy()
                node_ids[node][pos] = n
        for node, ids in node_ids.items():
            setattr(node, attr, ids)   # one report to the tree per node
        self._res.counters.compaction_moves += k
        return True

    def _owners(self, tier: Tier, source: Source, wanted: set[int]) -> dict[int, tuple[TreeNode, int] | Snapshot]:
        """Of the ``wanted`` ids of ``tier``/``source``, the movable ones -> their one owner
        (looked up in the tree's owner index, :mod:`hicache.tree.owners`)."""
        out: dict[int, tuple[TreeNode, int] | Snapshot] = {}
        index = self._res._tree.owner_index()
        t = tier.value
        if source is Source.PAGE:
            for i in wanted:
                held = index.page(t, i)
                if held is not None and _node_still(held[0]):
                    out[i] = held
            return out
        # A lease's lock on its newest published snapshot keeps it from eviction but holds no
        # row id (the lease refers to the Snapshot), so it may move; a resume snapshot's
        # device row is the lease's snapshot_id, which the engine reads: it stays.
        by_id = {id(s) for s in self._res.resume_snapshots()} if tier is Tier.DEVICE else set()
        for row in wanted:
            s = index.snapshot(t, row)
            if s is not None and not s.busy and id(s) not in by_id:
                out[row] = s
        return out


def _first(items: Iterator[T]) -> T | None:
    """The first of ``items`` (None when empty), closing the iteration: an eviction order's
    iterator holds heap entries until it is closed."""
    try:
        return next(items, None)
    finally:
        close = getattr(items, "close", None)
        if close is not None:
            close()


def _node_still(node: TreeNode) -> bool:
    """Nothing reads or writes ``node``'s page copies now (so its ids may change)."""
    return (node.lock_device == 0 and node.lock_host == 0 and node.backup_pending == 0
            and node.load_ticket is None and node.l3_put is None and node.pins == 0)
