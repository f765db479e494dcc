"""Routing between the cache's parts: what one part produces goes to the part that acts on it.

The parts of :class:`hicache.cache.facade.HiCache` never call each other. What a copy, an
L3 put or an eviction produces comes back as a record, and this router hands it on::

    an ack of a page backup      -> Residency gives the nodes host ids -> L3Tier puts them
    an ack of a snapshot backup  -> Residency keeps the host copy -> L3Tier puts it;
                                    Publisher settles the snapshot (an orphan may go)
    an ack of a load             -> Residency (exclusive tier: the host copy goes);
                                    Publisher settles the snapshot the load read
    a finished L3 put            -> Residency frees host copies loaded meanwhile;
                                    Publisher settles its snapshot
    rows an L3 fetch gave back   -> Residency frees them
    a node leaves the tree       -> L3Tier forgets its retry, Publisher its orphan
    a snapshot retention let go  -> Residency drops it

The router owns no state: it holds the parts (owned by the facade) and moves records.
"""

from __future__ import annotations

from typing import Sequence

from hicache.cache.copies import Copies
from hicache.cache.l3tier import L3Tier, PutDone
from hicache.cache.publisher import Publisher
from hicache.cache.residency import Residency
from hicache.cache.tags import Load, PageBackup, SnapshotBackup
from hicache.pools import Source, Tier
from hicache.transfer import Ack
from hicache.tree import TreeNode


class Router:
    """Moves the records one part produces to the part that acts on them (module docstring)."""

    def __init__(self, residency: Residency, copies: Copies, publisher: Publisher, l3: L3Tier):
        self._residency = residency
        self._copies = copies
        self._publisher = publisher
        self._l3 = l3

    def apply_acks(self) -> int:
        """Apply every finished copy; returns how many."""
        acks = self._copies.take_acks()
        for ack in acks:
            self.apply(ack)
        return len(acks)

    def apply(self, ack: Ack) -> None:
        """Apply one finished (or failed) copy to the parts it concerns."""
        tag = ack.tag
        if isinstance(tag, PageBackup):
            self._l3.put_pages(self._residency.apply_page_backup(tag, ack.ok))
        elif isinstance(tag, SnapshotBackup):
            if self._residency.apply_snapshot_backup(tag, ack.ok):
                self._l3.put_snapshot(tag.node, tag.snap)
            self.drop(self._publisher.settle(tag.snap))
        elif isinstance(tag, Load):
            self._residency.apply_load(tag, ack.ok)
            if tag.snap is not None:
                self.drop(self._publisher.settle(tag.snap))
        else:
            raise AssertionError(f"an ack of a copy the cache never submitted: {tag!r}")

    def after_puts(self, done: list[PutDone]) -> None:
        """Finished L3 puts: host copies loaded meanwhile may go, snapshots settle."""
        for put in done:
            self._residency.put_finished(put.nodes, put.snap)
            if put.snap is not None:
                self.drop(self._publisher.settle(put.snap))

    def drop(self, nodes: Sequence[TreeNode]) -> None:
        """Drop the snapshots the publisher let go of (retention)."""
        for node in nodes:
            self._residency.drop_snapshot(node)

    def free_fetched_rows(self) -> None:
        """Host rows L3 fetches reserved and no longer need go back to the host pool."""
        pages, states = self._l3.take_free_rows()
        self._residency.free(Tier.HOST, Source.PAGE, pages)
        self._residency.free(Tier.HOST, Source.STATE, states)

    def route_removed(self) -> None:
        """Nodes that left the tree: L3 forgets their retries, the publisher their orphans."""
        removed, detached = self._residency.take_removed()
        if removed:
            self._l3.forget(removed)
        if detached:
            self._publisher.forget(detached)
