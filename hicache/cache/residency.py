"""Who lives where: the pools, their allocation and eviction, and the copies' bookkeeping.

:class:`Residency` owns the pools (the only code that allocates or frees an id) and carries
out the placement policy's decisions on the tree: which victim goes, demote or drop, the
records of backups and loads and what their acks change, the exclusive host tier. It never
submits a copy or talks to L3: it hands the facade records (a :class:`PageBackup` to
submit, nodes that gained a host copy) and the facade routes them.

Device eviction of a node (leaf-first, unlocked, no copy in flight)::

    on host too        -> demote: free device ids, node becomes a shadow (still matches)
    write_back policy  -> the facade backs it up now (one synchronous batched copy), then
                          :meth:`demote_backed_up` demotes it
    otherwise          -> drop: free device ids, remove the node (and any shadow subtree)

Exclusive host tier: when a load from the host lands, the host copy it read is freed
(unless another reader still holds it), so a page lives on one tier at a time and the two
budgets add up; the device evicting it again backs it up again. A host copy an L3 put is
still reading is freed when the put ends (:meth:`put_finished`).

A tier that is one arena for pages and snapshots (``budget: shared``, or the host under
``shared_host``): a short allocation there gets room from :class:`~hicache.cache.room.Room` (compaction, then one
eviction order over both kinds); :meth:`feasible` asks it in that mode.

Removals are reported, not routed: every node that leaves the tree (with its parent at
that moment) and every snapshot detached with it is queued for :meth:`take_removed`, which
the facade forwards to the parts that keep such objects in their own tables.
"""

from __future__ import annotations

from typing import Callable, Iterable

import numpy as np

from hicache.cache.policy import PlacementPolicy
from hicache.cache.results import ResidencyCounters
from hicache.cache.room import BackupPages, BackupSnapshots, Room
from hicache.cache.tags import EvictionPass, Load, LoadPlan, PageBackup, SnapshotBackup
from hicache.pools import AllocResult, Source, Tier, TieredPools
from hicache.tree import RadixTree, Snapshot, TreeNode, device_victims, host_victims, snapshot_victims


class Residency:
    """The pools and everything about where copies live (see module docstring)."""

    def __init__(self, pools: TieredPools, tree: RadixTree, policy: PlacementPolicy):
        self.pools = pools
        self._tree = tree
        self._policy = policy
        self.counters = ResidencyCounters()
        # exclusive tier: nodes and snapshots loaded back while an L3 put read their host
        # copy; the put's end frees it
        self._release_after_put: set[TreeNode | Snapshot] = set()
        self._removed: list[tuple[TreeNode, TreeNode | None]] = []   # (node, its parent)
        self._detached: list[Snapshot] = []
        self.room = Room(self)   # shared arenas: compaction and the merged eviction order
        # Snapshots whose device row a lease hands out by id (its resume snapshot): set by
        # the facade; compaction never moves them.
        self.resume_snapshots: Callable[[], Iterable[Snapshot]] = tuple

    # -- ids -------------------------------------------------------------------------------
    def free(self, tier: Tier, source: Source, ids: Iterable[int | None] | np.ndarray | None) -> None:
        """Give ids back to ``tier``'s pools (the only place besides allocation that
        changes them). Every id must be a held one: ``None`` is a bug in the caller."""
        assert ids is not None, "freeing the ids of a copy that has none"
        if not isinstance(ids, np.ndarray):
            ids = list(ids)
            assert None not in ids, "freeing a row id that is not set"
        arr = np.asarray(ids, np.int64)
        if arr.size:
            self.pools.tier(tier).free(source, arr)

    def short_of(self, tier: Tier, source: Source, n: int) -> int:
        """How many ids an allocation of ``n`` lacks now (0: it fits)."""
        return max(n - self.pools.tier(tier).num_free(source), 0)

    def feasible(self, tier: Tier, source: Source, n: int) -> bool:
        """Could eviction make room for ``n``? (Capacity, and free plus unpinned; in a
        shared arena, the pinned bytes of both kinds plus the request.)"""
        pools = self.pools.tier(tier)
        if pools.arena is not None:
            return self.room.feasible(tier, source, n)
        return n <= pools.capacity(source) and n - pools.num_free(source) <= self._tree.evictable(tier, source)

    def shared(self, tier: Tier) -> bool:
        """Is ``tier`` one shared arena (``budget: shared``; the host under ``shared_host``)?"""
        return self.pools.tier(tier).arena is not None

    def make_room(self, tier: Tier, source: Source, n: int, backup_pages: BackupPages,
                  backup_snapshots: BackupSnapshots) -> None:
        """Shared arena: compact and evict either kind, coldest first, until ``n`` fit."""
        self.room.make_room(tier, source, n, backup_pages, backup_snapshots)

    def take(self, tier: Tier, source: Source, n: int) -> AllocResult:
        """Allocate from what is free (no eviction): ``NoRoom`` when short."""
        return self.pools.tier(tier).alloc(source, n)

    # -- removal ---------------------------------------------------------------------------
    def _remove_subtree(self, node: TreeNode) -> int:
        """Free every copy under and including ``node`` and detach it; returns host pages freed."""
        removed = self._tree.remove_subtree(node, on_detach=lambda n: self._removed.append((n, n.parent)))
        self.free(Tier.DEVICE, Source.PAGE, removed.device_pages)
        self.free(Tier.HOST, Source.PAGE, removed.host_pages)
        self.free(Tier.DEVICE, Source.STATE, removed.device_snapshots)
        self.free(Tier.HOST, Source.STATE, removed.host_snapshots)
        self._detached.extend(removed.snapshots)
        return len(removed.host_pages)

    def drop_snapshot(self, node: TreeNode) -> None:
        """Free both copies of ``node``'s snapshot and detach it."""
        snap = node.snapshot
        if snap is None:
            return
        assert snap.lock == 0 and not snap.backup_pending, f"dropping a pinned snapshot on {node}"
        if snap.device_id is not None:
            self.free(Tier.DEVICE, Source.STATE, [snap.device_id])
        if snap.host_id is not None:
            self.free(Tier.HOST, Source.STATE, [snap.host_id])
        node.snapshot = None
        self._detached.append(snap)

    def _detach_if_empty(self, node: TreeNode, snap: Snapshot) -> None:
        if snap.empty and node.snapshot is snap:
            node.snapshot = None
            self._detached.append(snap)

    def take_removed(self) -> tuple[list[tuple[TreeNode, TreeNode | None]], list[Snapshot]]:
        """Nodes that left the tree (with their parent then) and snapshots detached since
        the last call, in order."""
        out = (self._removed, self._detached)
        self._removed, self._detached = [], []
        return out

    # -- eviction --------------------------------------------------------------------------
    def drop_device_copy(self, node: TreeNode) -> bool:
        """Evict ``node``'s device pages: demote if it has a host copy, else drop the node
        (and its shadow subtree). False if it must stay (something reads the subtree)."""
        if not node.on_host and self._tree.subtree_pinned(node):
            return False
        ids, node.device_ids = node.device_ids, None
        self.free(Tier.DEVICE, Source.PAGE, ids)
        if node.on_host:
            self.counters.device_demoted_pages += node.num_pages
        else:
            self.counters.device_evicted_pages += node.num_pages
            self._remove_subtree(node)
        return True

    def evict_device_pages(self, need: int) -> EvictionPass:
        """Free up to ``need`` device pages, coldest first. Under write_back a victim with
        no host copy is not dropped but returned for the caller to back up (then
        :meth:`demote_backed_up`); it counts toward ``freed`` already."""
        freed, to_backup = 0, []
        for node in device_victims(self._tree, self._policy.strategy):
            if freed >= need:
                break
            demote = node.on_host or (self._policy.write_back and self._policy.worth_demoting(node))
            self._trim(node, need - freed, keeps_head=demote or not self._tree.needs_snapshots)
            if demote and not node.on_host:   # write_back, worth a host copy: back it up first
                to_backup.append(node)
                freed += node.num_pages
            elif self.drop_device_copy(node):
                freed += node.num_pages
        return EvictionPass(freed, to_backup)

    def _trim(self, node: TreeNode, need: int, *, keeps_head: bool) -> None:
        """Cut a victim longer than ``need`` pages so only its last ``need`` pages go.

        Whole-node victims freed 1.6x what allocations asked for on ShareGPT (a node is a
        turn's worth of pages), and every page freed beyond the ask sat idle: at tight
        budgets about 6% of the bytes. The head stays where it is, which is only worth it
        when the head can still serve a hit: its tail is demoted (the chain resumes by
        loading it back), or the layout has no state (any page boundary is a resume point).
        A dropped tail of a hybrid chain takes the snapshot at its end with it, which
        leaves the head dead, so that victim goes whole.
        """
        if keeps_head and 0 < need < node.num_pages:
            self._tree.split(node, node.num_pages - need)

    def snapshots_down_with(self, nodes: Iterable[TreeNode]) -> list[tuple[TreeNode, Snapshot]]:
        """The end snapshots that go to the host with these backed-up page runs: without one,
        a host (and later L3) copy of the prefix could never be resumed from its end --
        unless the policy finds it not worth host bytes (under value an intermediate one: a
        deeper snapshot on its only path; on a 1M-token chain those are a quarter of its
        host bytes). Split pools and shared arenas alike."""
        return [(n, n.snapshot) for n in nodes
                if n.on_host and n.snapshot is not None and n.snapshot.provisional_owner is None
                and n.snapshot.device_id is not None and self._policy.worth_demoting_snapshot(n, n.snapshot)]

    def demote_backed_up(self, nodes: list[TreeNode]) -> int:
        """After their backup: demote (or, when it failed, drop) write_back victims.
        Returns the pages that could *not* be freed after all."""
        kept = 0
        for node in nodes:
            if node.parent is not None and node.on_device and not self.drop_device_copy(node):
                kept += node.num_pages
        return kept

    def evict_host_node(self, node: TreeNode) -> int:
        """Remove a host victim (and its shadow subtree); returns host pages freed."""
        freed = self._remove_subtree(node)
        self.counters.host_evicted_pages += node.num_pages
        return freed

    def evict_host_pages(self, need: int) -> int:
        freed = 0
        for node in host_victims(self._tree, self._policy.strategy):
            if freed >= need:
                break
            self._trim(node, need - freed, keeps_head=not self._tree.needs_snapshots)
            freed += self.evict_host_node(node)
        return freed

    def evict_snapshot(self, tier: Tier, node: TreeNode, snap: Snapshot) -> bool:
        """Free one snapshot victim's ``tier`` row; True when (write_back, no host copy) it
        must be backed up first instead (then :meth:`drop_backed_up_snapshots`)."""
        if tier is Tier.HOST:
            self.free(Tier.HOST, Source.STATE, [snap.host_id])
            snap.host_id = None
            self.counters.snapshots_evicted_host += 1
        elif snap.host_id is not None:
            self.free(Tier.DEVICE, Source.STATE, [snap.device_id])
            snap.device_id = None
        elif self._policy.write_back and self._policy.worth_demoting_snapshot(node, snap):
            return True
        else:
            self.free(Tier.DEVICE, Source.STATE, [snap.device_id])
            snap.device_id = None
            self.counters.snapshots_evicted_device += 1
        self._detach_if_empty(node, snap)
        return False

    def evict_snapshots(self, tier: Tier, need: int) -> tuple[int, list[tuple[TreeNode, Snapshot]]]:
        """Free up to ``need`` snapshot rows of ``tier``; under write_back a device snapshot
        with no host copy is returned to back up first (then :meth:`drop_backed_up_snapshots`)."""
        freed, to_backup = 0, []
        for node, snap in snapshot_victims(self._tree, self._policy.strategy, tier):
            if freed >= need:
                break
            if self.evict_snapshot(tier, node, snap):
                to_backup.append((node, snap))
            freed += 1
        return freed, to_backup

    def drop_backed_up_snapshots(self, items: list[tuple[TreeNode, Snapshot]]) -> None:
        for node, snap in items:
            self.free(Tier.DEVICE, Source.STATE, [snap.device_id])
            snap.device_id = None
            if snap.empty:
                self.counters.snapshots_evicted_device += 1
                self._detach_if_empty(node, snap)

    # -- backups ---------------------------------------------------------------------------
    def reserve_page_backup(self, nodes: Iterable[TreeNode]) -> list[TreeNode]:
        """The nodes among ``nodes`` a backup can copy now, marked as being backed up
        (so eviction leaves them alone while their host rows are made)."""
        picked = [n for n in nodes if n.on_device and not n.on_host and n.backup_pending == 0
                  and n.load_ticket is None and n.parent is not None]
        for n in picked:
            n.backup_pending += 1
        return picked

    def page_backup(self, nodes: list[TreeNode], alloc: AllocResult) -> PageBackup | None:
        """The backup record for reserved ``nodes`` into ``alloc``'s host rows, or None
        (unmarked, counted) when there was no host room."""
        if not alloc.ok:
            for n in nodes:
                n.backup_pending -= 1
            self.counters.backup_skipped_no_room += 1
            return None
        self.counters.backups += 1
        return PageBackup(nodes, np.concatenate([n.device_ids for n in nodes]), alloc.ids.numpy())

    def reserve_snapshot_backup(self, items: Iterable[tuple[TreeNode, Snapshot]]) -> list[tuple[TreeNode, Snapshot]]:
        picked = [(n, s) for n, s in items if s.device_id is not None and s.host_id is None and not s.backup_pending]
        for _, s in picked:
            s.backup_pending = True
        return picked

    def snapshot_backup(self, node: TreeNode, snap: Snapshot, alloc: AllocResult) -> SnapshotBackup | None:
        if not alloc.ok:
            snap.backup_pending = False
            self.counters.backup_skipped_no_room += 1
            return None
        assert snap.device_id is not None, "a snapshot backup needs a device copy"
        return SnapshotBackup(node, snap, snap.device_id, int(alloc.ids[0]))

    def apply_page_backup(self, tag: PageBackup, ok: bool) -> list[TreeNode]:
        """A page backup's ack: give the nodes their host ids; returns the nodes that now
        have a host copy (for L3). A split since submission moved some pages into new
        parents; they are found by walking up."""
        mapping = dict(zip(tag.src.tolist(), tag.dst.tolist()))
        used: set[int] = set()
        seen: set[int] = set()
        gained: list[TreeNode] = []
        for start in tag.nodes:
            for node in start.iter_ancestors():
                if node.node_id in seen or node.backup_pending == 0 or node.device_ids is None:
                    break
                ids = node.device_ids.tolist()
                if not all(i in mapping for i in ids):
                    break
                seen.add(node.node_id)
                node.backup_pending -= 1
                if ok and node.host_ids is None:
                    node.host_ids = np.asarray([mapping[i] for i in ids], np.int64)
                    used.update(node.host_ids.tolist())
                    self.counters.backed_up_pages += len(ids)
                if node.host_ids is not None:
                    gained.append(node)
        self.free(Tier.HOST, Source.PAGE, [d for d in tag.dst.tolist() if d not in used])
        if not ok:
            self.counters.backup_failures += 1
        return gained

    def apply_snapshot_backup(self, tag: SnapshotBackup, ok: bool) -> bool:
        """A snapshot backup's ack; True when the snapshot now has a host copy to put to L3."""
        snap = tag.snap
        snap.backup_pending = False
        if ok and snap.device_id is not None:
            snap.host_id = tag.dst
            self.counters.snapshots_backed_up += 1
            return tag.node.snapshot is snap
        self.free(Tier.HOST, Source.STATE, [tag.dst])
        self.counters.backup_failures += not ok
        return False

    # -- loads -----------------------------------------------------------------------------
    def load_plan(self, node: TreeNode, snap: Snapshot | None) -> LoadPlan | None:
        """What resuming at ``node`` (with ``snap``) must load; None when it cannot load
        now (a shadow below a copy that is still loading: that copy could still fail)."""
        chain = list(node.iter_ancestors())
        shadows = [n for n in chain if not n.on_device][::-1]
        if shadows and any(n.load_ticket is not None for n in chain if n.on_device):
            return None
        return LoadPlan(shadows, sum(n.num_pages for n in shadows),
                        snap if snap is not None and snap.device_id is None else None)

    @staticmethod
    def hold_sources(plan: LoadPlan, delta: int) -> None:
        """Keep (``+1``) or let go (``-1``) the host rows a load will read."""
        for n in plan.shadows:
            n.lock_host += delta

    def loads_for(self, plan: LoadPlan, pages: AllocResult | None, state: AllocResult | None) -> list[Load]:
        """Give the plan's shadows and snapshot their new device rows; the loads to submit.

        The snapshot is marked loading at once, before anything is submitted: a copy
        finishing under backpressure must not free the host row it is about to read."""
        loads = []
        if plan.pages:
            assert pages is not None
            dst = pages.ids.numpy()
            off = 0
            for n in plan.shadows:
                n.device_ids = dst[off: off + n.num_pages].copy()
                off += n.num_pages
            loads.append(Load(nodes=plan.shadows, page_dst=dst))
        snap = plan.snapshot
        if snap is not None:
            assert state is not None
            loads.append(Load(snap=snap, snap_src=snap.host_id, snap_dst=int(state.ids[0])))
            snap.device_id = int(state.ids[0])
            snap.loading = True
        return loads

    def apply_load(self, tag: Load, ok: bool) -> None:
        """A load's ack: the device copy is in place (exclusive tier: the host copy goes),
        or it failed (the nodes become shadows again; dependent leases see the failure
        through their handles and must not publish)."""
        done: list[TreeNode] = []
        for start in tag.nodes:
            # A split during the load moved some of its pages into new parents that carry
            # the same ticket: finish those too.
            for node in start.iter_ancestors():
                if node.load_ticket is None or node.load_ticket is not tag.ticket:
                    break
                if node not in done:
                    done.append(node)
        for node in sorted(done, key=lambda n: n.depth, reverse=True):  # children first
            node.load_ticket = None
            node.lock_host -= 1
            if ok:
                self.release_host_copy(node)
            else:
                assert not any(c.on_device for c in node.children.values()), \
                    f"{node}: device children under a failed load"
                self.free(Tier.DEVICE, Source.PAGE, node.device_ids)
                node.device_ids = None
        snap = tag.snap
        if snap is not None:
            snap.loading = False
            snap.load_ticket = None
            if ok:
                self.release_host_snapshot(snap)
            else:
                self.free(Tier.DEVICE, Source.STATE, [snap.device_id])
                snap.device_id = None
        if ok:
            self.counters.loaded_pages += sum(n.num_pages for n in done)
            self.counters.snapshots_loaded += snap is not None
        else:
            self.counters.load_failures += 1

    # -- exclusive host tier -----------------------------------------------------------------
    def release_host_copy(self, node: TreeNode) -> None:
        """Exclusive tier: free ``node``'s host pages now that its device copy is in place.

        A no-op on an inclusive tier, so callers need not ask which tier they run on."""
        if not self._policy.exclusive_host:
            return
        if node.host_ids is None or node.device_ids is None or node.backup_pending or node.lock_host:
            return  # another load still reads the host rows: the last one frees them
        if node.l3_put is not None:
            self._release_after_put.add(node)  # the put reads them: freed when it is done
            return
        self.free(Tier.HOST, Source.PAGE, node.host_ids)
        self.counters.host_released_pages += len(node.host_ids)
        node.host_ids = None
        self.release_host_snapshot(node.snapshot)

    def release_host_snapshot(self, snap: Snapshot | None) -> None:
        """Exclusive tier: free a snapshot's host copy when its device copy exists (else no-op)."""
        if (not self._policy.exclusive_host or snap is None or snap.host_id is None or snap.device_id is None
                or snap.backup_pending or snap.loading):
            return
        if snap.put_pending:
            self._release_after_put.add(snap)  # the L3 put reads the row: freed when it is done
            return
        self.free(Tier.HOST, Source.STATE, [snap.host_id])
        snap.host_id = None
        self.counters.snapshots_released_host += 1

    def put_finished(self, nodes: Iterable[TreeNode], snap: Snapshot | None) -> None:
        """An L3 put stopped reading these host copies: free the ones loaded meanwhile."""
        for n in nodes:
            if n in self._release_after_put:
                self._release_after_put.discard(n)
                self.release_host_copy(n)
        if snap is not None and snap in self._release_after_put:
            self._release_after_put.discard(snap)
            self.release_host_snapshot(snap)
