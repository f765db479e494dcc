"""Publishing a request's pages and snapshots into the tree, and releasing it.

A mixin of :class:`hicache.cache.HiCache`. Snapshot retention (see
:mod:`hicache.tree.retention`): a kept snapshot stays until evicted under pressure; a
provisional one is dropped when its request offers a newer one or releases. A lease pins
the snapshot it resumed from and the newest one it published; older ones it published are
ordinary cache entries (it never reads them again).
"""

from __future__ import annotations

import numpy as np

from hicache.cache.lease import Lease
from hicache.cache.results import PublishResult
from hicache.errors import MisuseError
from hicache.tree import Boundary, Decision, Snapshot, TreeNode


TOKEN_LIMIT = 2 ** 31  # token ids are hashed and compared as int32


def as_tokens(tokens: object) -> np.ndarray:
    """``tokens`` as a contiguous int32 array, or :class:`MisuseError`.

    Ids must be integers in ``[0, 2**31)``: the tree and the page hashes see int32, so a
    larger id would wrap and two different prompts would alias (and share KV).
    """
    arr = np.asarray(tokens)
    if arr.ndim != 1 or (arr.size and (arr.dtype == np.bool_ or not np.issubdtype(arr.dtype, np.integer))):
        raise MisuseError(f"tokens must be a 1-D sequence of integers, got shape {arr.shape} {arr.dtype}")
    if arr.size and arr.dtype != np.int32:
        lo, hi = int(arr.min()), int(arr.max())
        if lo < 0 or hi >= TOKEN_LIMIT:
            bad = lo if lo < 0 else hi
            raise MisuseError(f"token id {bad} is outside [0, 2**31)")
    elif arr.size and int(arr.min()) < 0:
        raise MisuseError(f"token id {int(arr.min())} is outside [0, 2**31)")
    return np.ascontiguousarray(arr, dtype=np.int32)


class PublishMixin:
    # -- publish / release --------------------------------------------------------------
    def publish(self, lease: Lease, tokens: object, num_pages: int, *, snapshot_id: int | None = None,
                why: Boundary | str = Boundary.PREFILL) -> PublishResult:
        """Publish the lease's first ``num_pages`` pages (and a snapshot for that boundary).

        Call it after each prefill chunk (mid-flight: concurrent siblings reuse the prefix
        at once) and at finish. Pages move from the lease into the tree without a copy; an
        identical page someone published first wins and the lease's copy is freed (its
        page table then points at the winner). Everything published stays locked until
        :meth:`release`. ``why`` tells the retention policy what the boundary is.
        """
        self._lease(lease)
        toks = as_tokens(tokens)
        why = Boundary(why)
        P = self.page_tokens
        if not lease.ok:
            raise MisuseError("publish on a lease whose load failed; release it and recompute")
        if not lease.ready():
            raise MisuseError("publish before the lease's loads finished; call lease.wait() first")
        if not (lease.published_pages <= num_pages <= len(lease.page_table)) or len(toks) < num_pages * P:
            raise MisuseError(f"publish of {num_pages} pages: lease has {len(lease.page_table)} pages, "
                              f"{lease.published_pages} already published, {len(toks)} tokens")
        fixed = max(lease.resume_tokens, lease.published_pages * P)
        if not np.array_equal(toks[:fixed], lease.tokens[:fixed]):
            raise MisuseError("publish with tokens that differ from the lease's matched prefix")
        if snapshot_id is not None and snapshot_id not in lease._unpublished_snapshots:
            raise MisuseError(f"snapshot {snapshot_id} was not allocated for this lease")
        table = np.asarray(lease.page_table[lease.published_pages:num_pages], np.int64)
        res = self.tree.insert(toks, table, start=lease._locked_node)
        if res.duplicates.size:
            self._free("device", "page", res.duplicates)
            lease.owned.difference_update(res.duplicates.tolist())
        lease.page_table[lease.published_pages:num_pages] = res.page_ids.tolist()
        private = set(res.private.tolist())
        published = num_pages if not private else min(private)
        for i in range(lease.published_pages, published):
            lease.owned.discard(lease.page_table[i])
        self.counters.published_pages += max(published - lease.published_pages, 0)
        self.counters.duplicate_pages += int(res.duplicates.size)
        self.tree.move_lock(lease._locked_node, res.last)
        lease._locked_node = res.last
        lease.published_pages = max(published, lease.published_pages)
        lease.tokens = toks
        if self.config.write.write_policy == "write_through":
            self._backup_nodes(res.new_nodes)
        for node in res.new_nodes:  # exclusive tier: a recomputed shadow leaves the host
            self._release_host_copy(node)
        outcome = None
        if snapshot_id is not None:
            lease._unpublished_snapshots.discard(snapshot_id)
            if published == num_pages and num_pages > 0 and res.last.parent is not None:
                outcome = self._offer_snapshot(lease, res.last, snapshot_id, num_pages * P, why)
            else:  # the boundary could not be published (a copy there is still loading)
                self._free("device", "state", [snapshot_id])
                self.counters.snapshots_dropped_no_room += 1
        return PublishResult(published_pages=lease.published_pages,
                             duplicates_freed=int(res.duplicates.size), snapshot=outcome)

    def _offer_snapshot(self, lease: Lease, node: TreeNode, sid: int, boundary: int, why: Boundary) -> str:
        c = self.counters
        c.snapshots_offered += 1
        decision = self.retention.decide(boundary, why)
        snap = node.snapshot
        outcome = "kept"
        if snap is not None and not snap.empty:
            if snap.device_id is None:
                snap.device_id = sid          # a host-only snapshot regains its device copy
                self._release_host_snapshot(snap)  # exclusive tier: the host copy goes
            else:
                self._free("device", "state", [sid])
                c.snapshots_duplicate += 1
                outcome = "duplicate"
            if decision is Decision.KEEP and (snap.provisional_owner is not None or snap in self._orphans):
                snap.provisional_owner = None  # a provisional snapshot promoted by a keeper
                self._orphans.pop(snap, None)
                outcome = "kept"
            elif snap in self._orphans:        # an orphan's new owner: it goes when this one moves on
                del self._orphans[snap]
                snap.provisional_owner = lease.lease_id
        else:
            snap = node.snapshot = Snapshot(device_id=sid)
            if decision is Decision.PROVISIONAL:
                snap.provisional_owner = lease.lease_id
                outcome = "provisional"
        if decision is Decision.KEEP and outcome != "duplicate":
            c.snapshots_kept += 1
        elif outcome == "provisional":
            c.snapshots_provisional += 1
        snap.last_access = self.tree.tick()
        self._pin_newest(lease, snap)
        prev, lease._provisional = lease._provisional, None
        if prev is not None and prev[1] is not snap:
            self._drop_provisional(lease, prev)
        if snap.provisional_owner == lease.lease_id:
            lease._provisional = (node, snap)
        elif snap.provisional_owner is None and self.config.write.write_policy == "write_through":
            self._backup_snapshots([(node, snap)])
        return outcome

    def _pin_newest(self, lease: Lease, snap: Snapshot | None) -> None:
        old, lease._newest_snapshot = lease._newest_snapshot, snap
        if snap is not None:
            snap.lock += 1
        if old is not None:
            self._unlock_snapshot(old)

    def _unlock_snapshot(self, snap: Snapshot) -> None:
        snap.lock -= 1
        assert snap.lock >= 0, "snapshot unlocked below zero"
        self._settle_orphan(snap)

    def _drop_provisional(self, lease: Lease, prev: tuple[TreeNode, Snapshot]) -> None:
        """The owner of a provisional snapshot moved on: it goes now, or -- when a sibling
        still resumes from it or a copy reads it -- at its last unlock (an *orphan*)."""
        node, snap = prev
        if snap.provisional_owner != lease.lease_id:
            return
        snap.provisional_owner = None
        if node.snapshot is snap:
            self._orphans[snap] = node
            self._settle_orphan(snap)

    def _settle_orphan(self, snap: Snapshot) -> None:
        """Drop an orphaned provisional snapshot once nothing holds or reads it (counted)."""
        node = self._orphans.get(snap)
        if node is None or snap.lock or snap.backup_pending or snap.put_pending or id(snap) in self._loading_snaps:
            return
        del self._orphans[snap]
        if node.snapshot is snap:
            self._drop_snapshot(node)
            self.counters.snapshots_dropped_retention += 1

    def release(self, lease: Lease) -> None:
        """End a request: unlock its pages and snapshots, free what it never published."""
        self._lease(lease)
        self._pin_newest(lease, None)
        if lease._resume_snapshot is not None:
            snap, lease._resume_snapshot = lease._resume_snapshot, None
            self._unlock_snapshot(snap)
        if lease._provisional is not None:
            self._drop_provisional(lease, lease._provisional)
            lease._provisional = None
        self.tree.lock(lease._locked_node, -1)
        lease._locked_node = None
        self._free("device", "page", sorted(lease.owned))
        self._free("device", "state", sorted(lease._unpublished_snapshots))
        lease.owned.clear()
        lease._unpublished_snapshots.clear()
        lease.released = True
        del self._leases[lease.lease_id]
