"""Who lives where: eviction per tier, backups (write policies) and copy acks.

A mixin of :class:`hicache.cache.HiCache`; split out to keep the facade readable. Every
id the tree gives up is freed here, in the pools, and nowhere else.

Device eviction of a node (leaf-first, unlocked, no copy in flight)::

    on host too        -> demote: free device ids, node becomes a shadow (still matches)
    write_back policy  -> back up now (synchronously, one batched copy), then demote
    otherwise          -> drop: free device ids, remove the node (and any shadow subtree)

Exclusive host tier (``host_tier: exclusive``, with write_back): when a load from the host
lands, the host copy it read is freed (unless another reader still holds it), so a page
lives on one tier at a time and the two budgets add up; the device evicting it again backs
it up again.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Iterable

import numpy as np

from hicache.transfer import CopyHandle, LoadHandle
from hicache.tree import Snapshot, TreeNode, device_victims, host_victims, snapshot_victims


@dataclass(eq=False)
class PageBackup:
    """An in-flight D2H copy of the pages of ``nodes`` (device ids -> host ids)."""

    nodes: list[TreeNode]
    src: np.ndarray
    dst: np.ndarray


@dataclass(eq=False)
class SnapshotBackup:
    node: TreeNode
    snap: Snapshot
    src: int
    dst: int


@dataclass(eq=False)
class Load:
    """An in-flight H2D copy for one lease: its shadow nodes, or its snapshot.

    The nodes are host-locked (``lock_host``) until the ack so their source rows stay.
    """

    nodes: list[TreeNode] = field(default_factory=list)
    page_dst: np.ndarray | None = None
    snap: Snapshot | None = None
    snap_src: int | None = None
    snap_dst: int | None = None


class ResidencyMixin:
    """Eviction, backup and ack handling; expects the attributes HiCache sets up."""

    # -- helpers ------------------------------------------------------------------------
    def _free(self, tier: str, source: str, ids: Iterable[int] | np.ndarray) -> None:
        arr = np.asarray(list(ids) if not isinstance(ids, np.ndarray) else ids, np.int64)
        if arr.size:
            getattr(self.pools, tier).free(source, arr)

    def _drop_snapshot(self, node: TreeNode) -> None:
        snap = node.snapshot
        if snap is None:
            return
        assert snap.lock == 0 and not snap.backup_pending, f"dropping a pinned snapshot on {node}"
        if snap.device_id is not None:
            self._free("device", "state", [snap.device_id])
        if snap.host_id is not None:
            self._free("host", "state", [snap.host_id])
        node.snapshot = None
        self._orphans.pop(snap, None)

    def _remove_subtree(self, node: TreeNode) -> int:
        """Free every copy under and including ``node`` and detach it; returns host pages freed."""
        removed = self.tree.remove_subtree(node, on_detach=self._forget_unstored if self.store is not None else None)
        self._free("device", "page", removed.device_pages)
        self._free("host", "page", removed.host_pages)
        self._free("device", "state", removed.device_snapshots)
        self._free("host", "state", removed.host_snapshots)
        for snap in removed.snapshots:
            self._orphans.pop(snap, None)
        return len(removed.host_pages)

    def _alloc(self, tier: str, source: str, n: int):
        """Allocate ``n`` ids, evicting if needed -- but only when eviction can succeed.

        Feasibility comes first: a request for more than the tier could ever free (its
        capacity, or what is free plus what is not pinned) is refused with nothing evicted,
        so an impossible ask never wipes the cache for nothing.
        """
        pools = getattr(self.pools, tier)
        short = n - pools.num_free(source)
        if short > 0 and (n > pools.capacity(source) or short > self.tree.evictable(tier, source)):
            return pools.alloc(source, n)  # NoRoom: nothing allocated, nothing evicted
        if short > 0:
            evict = {("device", "page"): self._evict_device_pages,
                     ("host", "page"): self._evict_host_pages,
                     ("device", "state"): lambda k: self._evict_snapshots("device", k),
                     ("host", "state"): lambda k: self._evict_snapshots("host", k)}[(tier, source)]
            evict(short)
        return pools.alloc(source, n)

    # -- eviction -----------------------------------------------------------------------
    def _drop_device_copy(self, node: TreeNode) -> bool:
        """Evict ``node``'s device pages: demote if it has a host copy, else drop the node
        (and its shadow subtree). False if it must stay (something reads the subtree)."""
        if not node.on_host and self.tree.subtree_pinned(node, busy=self._prefetch_pins.__contains__):
            return False
        ids, node.device_ids = node.device_ids, None
        self._free("device", "page", ids)
        if node.on_host:
            self.counters.device_demoted_pages += node.num_pages
        else:
            self.counters.device_evicted_pages += node.num_pages
            self._remove_subtree(node)
        return True

    def _evict_device_pages(self, need: int) -> int:
        # write_back frees leaves only once they are backed up, which is what makes their
        # parents eligible: repeat passes until enough is freed or a pass frees nothing.
        total = 0
        while total < need:
            got = self._evict_device_pass(need - total)
            if got <= 0:
                break
            total += got
        return total

    def _evict_device_pass(self, need: int) -> int:
        freed, to_backup = 0, []
        write_back = self.config.write.write_policy == "write_back"
        for node in device_victims(self.tree, self.strategy):
            if freed >= need:
                break
            if write_back and not node.on_host:
                to_backup.append(node)   # backed up below, in one batched copy
                freed += node.num_pages
            elif self._drop_device_copy(node):
                freed += node.num_pages
        if to_backup:
            self._backup_nodes(to_backup, sync=True)
            # The boundary state goes down with the pages: without it a host (and later L3)
            # copy of the prefix could never be resumed from its end.
            self._backup_snapshots([(n, n.snapshot) for n in to_backup
                                    if n.on_host and n.snapshot is not None
                                    and n.snapshot.provisional_owner is None])
            for node in to_backup:
                if node.parent is not None and node.on_device and not self._drop_device_copy(node):
                    freed -= node.num_pages
        return freed

    def _evict_host_pages(self, need: int) -> int:
        freed = 0
        for node in host_victims(self.tree, self.strategy):
            if freed >= need:
                break
            if node.busy or (node.snapshot is not None and node.snapshot.lock) or node in self._prefetch_pins:
                continue
            freed += self._remove_subtree(node)
            self.counters.host_evicted_pages += node.num_pages
        return freed

    def _evict_snapshots(self, tier: str, need: int) -> int:
        freed, to_backup = 0, []
        for node, snap in snapshot_victims(self.tree, self.strategy, tier):
            if freed >= need:
                break
            if id(snap) in self._loading_snaps:
                continue
            if tier == "host":
                self._free("host", "state", [snap.host_id])
                snap.host_id = None
                self.counters.snapshots_evicted_host += 1
            elif snap.host_id is not None:
                self._free("device", "state", [snap.device_id])
                snap.device_id = None
            elif self.config.write.write_policy == "write_back":
                to_backup.append((node, snap))
            else:
                self._free("device", "state", [snap.device_id])
                snap.device_id = None
                self.counters.snapshots_evicted_device += 1
            if snap.empty and node.snapshot is snap:
                node.snapshot = None
                self._orphans.pop(snap, None)
            freed += 1
        if to_backup:
            self._backup_snapshots(to_backup, sync=True)
            for node, snap in to_backup:
                self._free("device", "state", [snap.device_id])
                snap.device_id = None
                if snap.empty:
                    self.counters.snapshots_evicted_device += 1
                    node.snapshot = None
                    self._orphans.pop(snap, None)
        return freed

    # -- backups ------------------------------------------------------------------------
    def _backup_nodes(self, nodes: list[TreeNode], *, sync: bool = False) -> None:
        nodes = [n for n in nodes if n.on_device and not n.on_host and n.backup_pending == 0
                 and n.load_ticket is None and n.parent is not None]
        if not nodes:
            return
        src = np.concatenate([n.device_ids for n in nodes])
        for n in nodes:  # pin before host eviction can look at them
            n.backup_pending += 1
        alloc = self._alloc("host", "page", len(src))
        if not alloc.ok:
            for n in nodes:
                n.backup_pending -= 1
            self.counters.backup_skipped_no_room += 1
            return
        tag = PageBackup(nodes, src, alloc.ids.numpy())
        self._submit("d2h", "page", src, tag.dst, tag, sync=sync)
        self.counters.backups += 1

    def _backup_snapshots(self, items: list[tuple[TreeNode, Snapshot]], *, sync: bool = False) -> None:
        items = [(n, s) for n, s in items
                 if s.device_id is not None and s.host_id is None and not s.backup_pending]
        for node, snap in items:
            snap.backup_pending = True
            alloc = self._alloc("host", "state", 1)
            if not alloc.ok:
                snap.backup_pending = False
                self.counters.backup_skipped_no_room += 1
                continue
            tag = SnapshotBackup(node, snap, snap.device_id, int(alloc.ids[0]))
            self._submit("d2h", "state", np.asarray([tag.src]), np.asarray([tag.dst]), tag, sync=sync)

    def _submit(self, direction: str, source: str, src: np.ndarray, dst: np.ndarray, tag: Any,
                *, sync: bool = False):
        """Queue one copy; under backpressure, wait for in-flight copies and queue again.

        Never applies an ack of another copy: waiting for room only *collects* finished
        acks (:meth:`_collect_acks`); they take effect in :meth:`poll`/:meth:`drain`, between
        engine calls. ``load()``, ``alloc_pages()`` and ``publish()`` therefore see a tree
        that changes only by what they do themselves -- a load that failed meanwhile keeps
        its ticket (and its lease sees the failure) until the engine polls. ``sync=True``
        (write_back eviction) waits for this copy and applies its own ack alone.
        """
        handle = self.ctl.copy(direction, source, src, dst, tag=tag)
        while not isinstance(handle, (CopyHandle, LoadHandle)):  # QueueFull
            self._wait_for_queue_room()
            handle = self.ctl.copy(direction, source, src, dst, tag=tag)
        self._inflight[id(tag)] = tag
        self._handles[id(tag)] = handle
        if sync:
            self.ctl.step()
            handle.wait()
            self._collect_acks()
            self._apply_acks(own=tag)
        return handle

    def _wait_for_queue_room(self) -> None:
        """Launch what is queued and wait for every in-flight copy; collect, not apply, acks."""
        self.ctl.step()
        for handle in list(self._handles.values()):
            handle.wait()
        before = len(self._acks)
        self._collect_acks()
        assert len(self._acks) > before, "transfer queue full with no copy in flight"

    # -- acks ---------------------------------------------------------------------------
    def _collect_acks(self) -> None:
        """Take finished acks from the controller (freeing queue room) without applying them."""
        self._acks.extend(self.ctl.poll())

    def _process_acks(self) -> int:
        """Apply every finished ack (only from ``poll``/``drain``: never inside an engine call)."""
        self._collect_acks()
        return self._apply_acks()

    def _apply_acks(self, own: Any = None) -> int:
        """Apply collected acks in submission order; ``own``: only the ack of that tag."""
        if own is None:
            acks, self._acks = self._acks, []
        else:
            acks = [a for a in self._acks if a.tag is own]
            self._acks = [a for a in self._acks if a.tag is not own]
        for ack in acks:
            tag = ack.tag
            self._inflight.pop(id(tag), None)
            if isinstance(tag, PageBackup):
                self._ack_page_backup(tag, ack.ok)
            elif isinstance(tag, SnapshotBackup):
                tag.snap.backup_pending = False
                if ack.ok and tag.snap.device_id is not None:
                    tag.snap.host_id = tag.dst
                    self.counters.snapshots_backed_up += 1
                    if tag.node.snapshot is tag.snap:
                        self._l3_put_snapshot(tag.node, tag.snap)
                else:
                    self._free("host", "state", [tag.dst])
                    self.counters.backup_failures += not ack.ok
                self._settle_orphan(tag.snap)
            elif isinstance(tag, Load):
                self._ack_load(tag, ack.ok)
            self._handles.pop(id(tag), None)
        return len(acks)

    def _ack_page_backup(self, tag: PageBackup, ok: bool) -> None:
        mapping = dict(zip(tag.src.tolist(), tag.dst.tolist()))
        used: set[int] = set()
        seen: set[int] = set()
        visited: list[TreeNode] = []
        for start in tag.nodes:
            for node in start.iter_ancestors():  # a split may have moved pages to new parents
                if node.node_id in seen or node.backup_pending == 0 or node.device_ids is None:
                    break
                ids = node.device_ids.tolist()
                if not all(i in mapping for i in ids):
                    break
                seen.add(node.node_id)
                visited.append(node)
                node.backup_pending -= 1
                if ok and node.host_ids is None:
                    node.host_ids = np.asarray([mapping[i] for i in ids], np.int64)
                    used.update(node.host_ids.tolist())
                    self.counters.backed_up_pages += len(ids)
        self._l3_put_pages([n for n in visited if n.host_ids is not None])
        leftover = [d for d in tag.dst.tolist() if d not in used]
        self._free("host", "page", leftover)
        if not ok:
            self.counters.backup_failures += 1

    def _release_host_copy(self, node: TreeNode) -> None:
        """Exclusive tier: free ``node``'s host pages now that its device copy landed.

        A no-op on an inclusive tier, so callers need not ask which tier they run on.
        """
        if self.config.write.host_tier != "exclusive":
            return
        if node.host_ids is None or node.device_ids is None or node.backup_pending:
            return
        # lock_host counts every reader of the host rows: in-flight loads and the L3 put.
        if node.lock_host > (node.l3_put is not None):
            return  # another load still reads the host rows: the last one frees them
        if node.l3_put is not None:
            self._release_after_put.add(node)  # the put reads them: it frees them when done
            return
        self._free("host", "page", node.host_ids)
        self.counters.host_released_pages += len(node.host_ids)
        node.host_ids = None
        self._release_host_snapshot(node.snapshot)

    def _release_host_snapshot(self, snap: Snapshot | None) -> None:
        """Exclusive tier: free a snapshot's host copy when its device copy exists (else no-op)."""
        if (self.config.write.host_tier != "exclusive" or snap is None or snap.host_id is None or snap.device_id is None
                or snap.backup_pending or id(snap) in self._loading_snaps):
            return
        if snap.put_pending:
            self._release_after_put.add(snap)  # the L3 put reads the row: freed when it is done
            return
        self._free("host", "state", [snap.host_id])
        snap.host_id = None
        self.counters.snapshots_released_host += 1

    def _ack_load(self, tag: Load, ok: bool) -> None:
        handle = self._handles.get(id(tag))
        done: list[TreeNode] = []
        for start in tag.nodes:
            # A split during the load moved some of its pages into new parents that carry
            # the same ticket: finish those too.
            for node in start.iter_ancestors():
                if node.load_ticket is None or (handle is not None and node.load_ticket is not handle):
                    break
                if node not in done:
                    done.append(node)
        for node in sorted(done, key=self.tree.depth_pages, reverse=True):  # children first
            node.load_ticket = None
            node.lock_host -= 1
            if ok:
                self._release_host_copy(node)  # exclusive tier: the host copy was read
            else:
                # The device copy never arrived: back to a shadow. Dependent leases see the
                # failure through their handles and must not publish (publish checks).
                assert not any(c.on_device for c in node.children.values()), \
                    f"{node}: device children under a failed load"
                self._free("device", "page", node.device_ids)
                node.device_ids = None
        if tag.snap is not None:
            self._loading_snaps.pop(id(tag.snap), None)
            tag.snap.loading = False
            if ok:
                self._release_host_snapshot(tag.snap)
            else:
                self._free("device", "state", [tag.snap.device_id])
                tag.snap.device_id = None
            self._settle_orphan(tag.snap)
        if ok:
            self.counters.loaded_pages += sum(n.num_pages for n in done)
            self.counters.snapshots_loaded += tag.snap is not None
        else:
            self.counters.load_failures += 1
