"""Publishing a request's pages and snapshots into the tree, and what a lease pins.

:class:`Publisher` owns snapshot retention: the retention decision for each offered
snapshot, the pins leases hold on snapshots, and the *orphans* -- provisional snapshots
whose owner moved on while another holder still used them. It changes the tree (insert,
lock moves, snapshot attach) and the lease; everything that frees ids or copies bytes it
hands back to the facade as a record (:class:`PagesPublished`, :class:`SnapshotOffer`,
:class:`Released`), which routes it to the residency and the copies.

Retention (see :mod:`hicache.tree.retention`): a kept snapshot stays until evicted under
pressure; a provisional one goes when its request offers a newer one or releases -- or,
when a sibling resumed from it or a copy still reads it, at its last unlock (counted in
``snapshots_dropped_retention``; nothing is kept that no counter records). A lease pins
the snapshot it resumed from until it publishes past it (its engine has read that state by
then), and the newest one it published; older ones it published are ordinary cache entries.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from hicache.cache.lease import Lease
from hicache.cache.results import PublishCounters, SnapshotOutcome
from hicache.tree import Boundary, Decision, RadixTree, RetentionPolicy, Snapshot, TreeNode


@dataclass
class PagesPublished:
    """What inserting a lease's pages did; the facade frees ``duplicates`` and hands
    ``new_nodes`` to the policy (backups) and the residency (exclusive tier)."""

    duplicates: np.ndarray
    new_nodes: list[TreeNode]
    last: TreeNode
    complete: bool      # every requested page is in the tree (none kept private)


@dataclass
class SnapshotOffer:
    """What offering a snapshot did: the outcome, a device row to free, a host-only
    snapshot that got its device copy back, snapshots to drop now, one to back up."""

    outcome: SnapshotOutcome
    free_row: int | None = None
    regained: Snapshot | None = None
    drop: list[TreeNode] = field(default_factory=list)
    kept: tuple[TreeNode, Snapshot] | None = None


@dataclass
class Released:
    """What ending a lease gives up: pages and snapshot rows it never published, and
    snapshots to drop now."""

    pages: list[int]
    snapshot_rows: list[int]
    drop: list[TreeNode]


class Publisher:
    """Publish, retention and snapshot pins (see module docstring)."""

    def __init__(self, tree: RadixTree, retention: RetentionPolicy):
        self._tree = tree
        self.retention = retention
        self.counters = PublishCounters()
        self._orphans: dict[Snapshot, TreeNode] = {}

    # -- pages -----------------------------------------------------------------------------
    def publish_pages(self, lease: Lease, toks: np.ndarray, num_pages: int, *, finish: bool = False) -> PagesPublished:
        """Insert the lease's pages up to ``num_pages``. At a decode's end (``finish``) the
        pages past the prompt's whole pages are the decode's (``TreeNode.decoded``: a
        branch no request has been seen to take); the prompt's own are published first."""
        split = lease.prompt_pages
        if not finish or num_pages <= split:
            return self._insert(lease, toks, num_pages, decoded=False)
        if lease.published_pages >= split:
            return self._insert(lease, toks, num_pages, decoded=True)
        head = self._insert(lease, toks, split, decoded=False)
        if not head.complete:
            return head
        tail = self._insert(lease, toks, num_pages, decoded=True)
        return PagesPublished(np.concatenate([head.duplicates, tail.duplicates]), head.new_nodes + tail.new_nodes,
                              tail.last, tail.complete)

    def _insert(self, lease: Lease, toks: np.ndarray, num_pages: int, *, decoded: bool) -> PagesPublished:
        """Insert the lease's pages up to ``num_pages`` (the caller checked the request).

        Pages move from the lease into the tree without a copy; an identical page someone
        published first wins and the lease's copy is returned for freeing (its page table
        then points at the winner). A page whose tree copy is still loading stays private.
        """
        start = lease.published_pages
        table = np.asarray(lease.page_table[start:num_pages], np.int64)
        res = self._tree.insert(toks, table, start=lease._locked_node, decoded=decoded)
        if res.duplicates.size:
            lease.owned.difference_update(res.duplicates.tolist())
        lease.page_table[start:num_pages] = res.page_ids.tolist()
        published = num_pages if not res.private.size else int(res.private.min())
        for i in range(start, published):
            lease.owned.discard(lease.page_table[i])
        self.counters.published_pages += max(published - start, 0)
        self.counters.duplicate_pages += int(res.duplicates.size)
        assert lease._locked_node is not None, "a released lease publishes"
        self._tree.move_lock(lease._locked_node, res.last)
        lease._locked_node = res.last
        lease.published_pages = max(published, start)
        lease.tokens = toks
        return PagesPublished(res.duplicates, res.new_nodes, res.last, published == num_pages)

    # -- snapshots -------------------------------------------------------------------------
    def offer_snapshot(self, lease: Lease, node: TreeNode, sid: int, boundary: int, why: Boundary) -> SnapshotOffer:
        """The lease offers device row ``sid`` as the snapshot at the end of ``node``."""
        c = self.counters
        c.snapshots_offered += 1
        decision = self.retention.decide(boundary, why)
        snap = node.snapshot
        offer = SnapshotOffer(SnapshotOutcome.KEPT)
        if snap is not None and not snap.empty:
            if snap.device_id is None:
                snap.device_id = sid          # a host-only snapshot regains its device copy
                offer.regained = snap
            else:
                offer.free_row = sid
                c.snapshots_duplicate += 1
                offer.outcome = SnapshotOutcome.DUPLICATE
            if decision is Decision.KEEP and (snap.provisional_owner is not None or snap in self._orphans):
                snap.provisional_owner = None  # a provisional snapshot promoted by a keeper
                self._orphans.pop(snap, None)
                offer.outcome = SnapshotOutcome.KEPT
            elif snap in self._orphans:        # an orphan's new owner: it goes when this one moves on
                del self._orphans[snap]
                snap.provisional_owner = lease.lease_id
        else:
            snap = node.snapshot = Snapshot(device_id=sid, kind=why.value)
            if decision is Decision.PROVISIONAL:
                snap.provisional_owner = lease.lease_id
                offer.outcome = SnapshotOutcome.PROVISIONAL
        if decision is Decision.KEEP and offer.outcome is not SnapshotOutcome.DUPLICATE:
            c.snapshots_kept += 1
        elif offer.outcome is SnapshotOutcome.PROVISIONAL:
            c.snapshots_provisional += 1
        snap.last_access = self._tree.tick()
        offer.drop += self._pin_newest(lease, snap)
        prev, lease._provisional = lease._provisional, None
        if prev is not None and prev[1] is not snap:
            offer.drop += self._drop_provisional(lease, prev)
        if snap.provisional_owner == lease.lease_id:
            lease._provisional = (node, snap)
        elif snap.provisional_owner is None:
            offer.kept = (node, snap)
        return offer

    def unpublishable(self) -> None:
        """A snapshot offered at a boundary that could not be published (counted)."""
        self.counters.snapshots_dropped_no_room += 1

    def pin(self, snap: Snapshot) -> None:
        snap.lock += 1

    def unpin(self, snap: Snapshot) -> list[TreeNode]:
        """Drop one pin; returns the node whose snapshot must now be dropped (an orphan's
        last unlock), if any."""
        snap.lock -= 1
        assert snap.lock >= 0, "snapshot unlocked below zero"
        return self.settle(snap)

    def past_resume(self, lease: Lease) -> list[TreeNode]:
        """The lease computed past its resume point, so its engine has read the resume
        snapshot into its own state: unpin it (a device row a long decode no longer holds
        from every other publish). Returns an orphan to drop, if that was its last pin."""
        snap, lease._resume_snapshot = lease._resume_snapshot, None
        lease.snapshot_id = None
        return self.unpin(snap) if snap is not None else []

    def _pin_newest(self, lease: Lease, snap: Snapshot | None) -> list[TreeNode]:
        old, lease._newest_snapshot = lease._newest_snapshot, snap
        if snap is not None:
            snap.lock += 1
        return self.unpin(old) if old is not None else []

    def _drop_provisional(self, lease: Lease, prev: tuple[TreeNode, Snapshot]) -> list[TreeNode]:
        """The owner of a provisional snapshot moved on: it goes now, or -- when a sibling
        still resumes from it or a copy reads it -- at its last unlock (an *orphan*)."""
        node, snap = prev
        if snap.provisional_owner != lease.lease_id:
            return []
        snap.provisional_owner = None
        if node.snapshot is not snap:
            return []
        self._orphans[snap] = node
        return self.settle(snap)

    def settle(self, snap: Snapshot) -> list[TreeNode]:
        """An orphan nothing holds or reads any more: returns its node, for the caller to
        drop the snapshot (counted here)."""
        node = self._orphans.get(snap)
        if node is None or snap.lock or snap.busy:
            return []
        del self._orphans[snap]
        if node.snapshot is not snap:
            return []
        self.counters.snapshots_dropped_retention += 1
        return [node]

    def forget(self, snapshots: list[Snapshot]) -> None:
        """Snapshots that left the tree (evicted, removed with their node)."""
        for snap in snapshots:
            self._orphans.pop(snap, None)

    def orphans(self) -> dict[Snapshot, TreeNode]:
        """Orphaned provisional snapshots and their nodes (read by ``check_integrity``)."""
        return dict(self._orphans)

    # -- release ---------------------------------------------------------------------------
    def release(self, lease: Lease) -> Released:
        """End a request: unpin its snapshots and path; what it never published goes."""
        drop = self._pin_newest(lease, None)
        if lease._resume_snapshot is not None:
            snap, lease._resume_snapshot = lease._resume_snapshot, None
            drop += self.unpin(snap)
        if lease._provisional is not None:
            drop += self._drop_provisional(lease, lease._provisional)
            lease._provisional = None
        assert lease._locked_node is not None, "a lease released twice"
        self._tree.lock(lease._locked_node, -1)
        lease._locked_node = None
        out = Released(sorted(lease.owned), sorted(lease._unpublished_snapshots), drop)
        lease.owned.clear()
        lease._unpublished_snapshots.clear()
        lease.released = True
        return out
