"""Allocation with eviction, and the host backups eviction needs: Residency and Copies together.

An allocation that is short first decides feasibility (an impossible ask evicts nothing),
then makes room in the tier: a shared arena compacts and evicts on one scale
(:mod:`hicache.cache.room`); split pools evict page runs or snapshots of that tier. Under
write_back a device victim is copied to a new host row before its device row is reused,
synchronously, so its ack is applied at once through the facade's ``apply`` (the one
route every ack takes)::

    alloc(DEVICE, PAGE, n) -> short? -> feasible? -> evict victims -> backup_pages(sync)
                                                                     -> Copies.run_now -> apply(ack)

The :class:`Allocator` owns no state: Residency owns the ids and the records, Copies the
copies; it only sequences the two, as the facade used to inline.
"""

from __future__ import annotations

from typing import Callable, Sequence

import numpy as np

from hicache.cache.copies import Copies
from hicache.cache.residency import Residency
from hicache.pools import AllocResult, Source, Tier
from hicache.transfer import Ack, Direction
from hicache.tree import Snapshot, TreeNode

DEVICE, HOST = Tier.DEVICE, Tier.HOST
PAGE, STATE = Source.PAGE, Source.STATE


class Allocator:
    """Allocates ids in a tier, evicting (and backing up) to make room (module docstring)."""

    def __init__(self, residency: Residency, copies: Copies, apply: Callable[[Ack], None]):
        self._residency = residency
        self._copies = copies
        self._apply = apply

    def alloc(self, tier: Tier, source: Source, n: int) -> AllocResult:
        """Allocate ``n`` ids, evicting if needed -- but only when eviction can succeed.

        Feasibility comes first: a request for more than the tier could ever free (its
        capacity, or what is free plus what is not pinned) is refused with nothing evicted,
        so an impossible ask never wipes the cache for nothing.
        """
        res = self._residency
        short = res.short_of(tier, source, n)
        if short and res.feasible(tier, source, n):
            if res.shared(tier):   # one arena: compaction, then pages and snapshots on one scale
                res.make_room(tier, source, n, lambda nodes: self.backup_pages(nodes, sync=True),
                              lambda items: self.backup_snapshots(items, sync=True))
            elif source is PAGE and tier is DEVICE:
                self._evict_device_pages(short)
            elif source is PAGE:
                res.evict_host_pages(short)
            else:
                self._evict_snapshots(tier, short)
        return res.take(tier, source, n)

    def _evict_device_pages(self, need: int) -> None:
        # write_back frees leaves only once they are backed up, which is what makes their
        # parents eligible: repeat passes until enough is freed or a pass frees nothing.
        total = 0
        while total < need:
            step = self._residency.evict_device_pages(need - total)
            got = step.freed
            if step.to_backup:
                self.backup_pages(step.to_backup, sync=True)
                # The boundary state goes down with the pages (Residency.snapshots_down_with),
                # synchronously like them: a snapshot backup in flight makes its node busy,
                # and a busy leaf pins its parent's subtree, so the next pass could neither
                # back up the parent (the leaf's host copy is not evictable) nor drop it --
                # the allocation failed with the tree reporting pages evictable (issue 14's
                # livelock under greedy admission).
                self.backup_snapshots(self._residency.snapshots_down_with(step.to_backup), sync=True)
                got -= self._residency.demote_backed_up(step.to_backup)
            if got <= 0:
                break
            total += got

    def _evict_snapshots(self, tier: Tier, need: int) -> None:
        _, to_backup = self._residency.evict_snapshots(tier, need)
        if to_backup:
            self.backup_snapshots(to_backup, sync=True)
            self._residency.drop_backed_up_snapshots(to_backup)

    def backup_pages(self, nodes: Sequence[TreeNode], *, sync: bool = False) -> None:
        """Copy these nodes' device pages to new host rows (``sync``: now, ack applied)."""
        nodes = self._residency.reserve_page_backup(nodes)
        if not nodes:
            return
        tag = self._residency.page_backup(nodes, self.alloc(HOST, PAGE, sum(n.num_pages for n in nodes)))
        if tag is None:
            return
        self._copies.submit(Direction.D2H, PAGE, tag.src, tag.dst, tag)
        if sync:
            self._apply(self._copies.run_now(tag))

    def backup_snapshots(self, items: Sequence[tuple[TreeNode, Snapshot]], *, sync: bool = False) -> None:
        for node, snap in self._residency.reserve_snapshot_backup(items):
            tag = self._residency.snapshot_backup(node, snap, self.alloc(HOST, STATE, 1))
            if tag is None:
                continue
            self._copies.submit(Direction.D2H, STATE, np.asarray([tag.src]), np.asarray([tag.dst]), tag)
            if sync:
                self._apply(self._copies.run_now(tag))
