"""``HiCache.check_integrity()``: every id has exactly one holder, every lock a reason.

Holders of each kind of id, as each part reports them::

    device pages      tree nodes' device_ids + leases' owned (unpublished) pages
    host pages        tree nodes' host_ids   + in-flight backups' destinations (Copies)
                                             + fetched rows not yet inserted (L3Tier)
    device snapshots  tree snapshots         + leases' allocated, unpublished snapshots
    host snapshots    tree snapshots         + in-flight snapshot backups' destinations
                                             + fetched state rows not yet inserted

and together they must equal each anchor's used ids (the pools). Node lock counts must
equal the leases whose locked node lies below, host locks the loads in flight, prefetch
pins the open prefetches, snapshot locks the leases that pin them.
"""

from __future__ import annotations

from collections import Counter
from typing import Iterable

from hicache.cache.copies import Copies
from hicache.cache.l3tier import L3Tier
from hicache.cache.lease import Lease
from hicache.cache.publisher import Publisher
from hicache.cache.tags import PageBackup, SnapshotBackup
from hicache.pools import TieredPools
from hicache.tree import RadixTree, Snapshot, TreeNode


def _expect(name: str, held: Counter, used: Iterable[int]) -> None:
    dup = [i for i, k in held.items() if k > 1]
    assert not dup, f"{name}: ids held twice: {sorted(dup)[:8]}"
    used = set(int(i) for i in used)
    missing = used - set(held)
    extra = set(held) - used
    assert not missing, f"{name}: allocated ids with no holder (leak): {sorted(missing)[:8]}"
    assert not extra, f"{name}: ids held but not allocated: {sorted(extra)[:8]}"


def check_cache(pools: TieredPools, tree: RadixTree, leases: list[Lease], copies: Copies, l3: L3Tier,
                publisher: Publisher) -> None:
    pools.check_integrity()
    tree.check_integrity()
    nodes = list(tree.nodes())
    _check_ids(pools, nodes, leases, copies, l3)
    _check_locks(tree, nodes, leases, copies, l3, publisher)


def _check_ids(pools: TieredPools, nodes: list[TreeNode], leases: list[Lease], copies: Copies, l3: L3Tier) -> None:
    dev_pages: Counter[int] = Counter()
    host_pages: Counter[int] = Counter()
    dev_snaps: Counter[int] = Counter()
    host_snaps: Counter[int] = Counter()
    for n in nodes:
        if n.device_ids is not None:
            dev_pages.update(int(i) for i in n.device_ids)
        if n.host_ids is not None:
            host_pages.update(int(i) for i in n.host_ids)
        s = n.snapshot
        if s is not None:
            if s.device_id is not None:
                dev_snaps[s.device_id] += 1
            if s.host_id is not None:
                host_snaps[s.host_id] += 1
    for lease in leases:
        dev_pages.update(lease.owned)
        dev_snaps.update(lease.holds().unpublished_snapshots)
    rows, state_rows = l3.held_rows()
    host_pages.update(rows)
    host_snaps.update(state_rows)
    for tag in copies.tags():
        if isinstance(tag, PageBackup):
            host_pages.update(int(i) for i in tag.dst)
        elif isinstance(tag, SnapshotBackup):
            host_snaps[tag.dst] += 1
    _expect("device pages", dev_pages, pools.device.anchors["page"].used_ids())
    _expect("host pages", host_pages, pools.host.anchors["page"].used_ids())
    _expect("device snapshots", dev_snaps, pools.device.anchors["state"].used_ids())
    _expect("host snapshots", host_snaps, pools.host.anchors["state"].used_ids())


def _check_locks(tree: RadixTree, nodes: list[TreeNode], leases: list[Lease], copies: Copies, l3: L3Tier,
                 publisher: Publisher) -> None:
    locks: Counter[TreeNode] = Counter()
    host_locks: Counter[TreeNode] = Counter()
    pins: Counter[TreeNode] = Counter()
    snap_locks: Counter[Snapshot] = Counter()
    for pf in l3.open_prefetches():  # an open prefetch keeps the prefix it extends in the tree
        if pf.pinned is not None and pf.pinned.parent is not None:
            pins[pf.pinned] += 1
    for n in pins:
        assert n.parent is not None and n.parent.children.get(n.first_page_key(tree.page_tokens)) is n, f"{n}: a pinned node left the tree"
    for lease in leases:
        holds = lease.holds()
        assert holds.locked_node is not None, f"lease {lease.lease_id} holds no lock"
        for n in holds.locked_node.iter_ancestors():
            locks[n] += 1
        for s in holds.snapshots:
            snap_locks[s] += 1
        assert lease.published_pages <= len(lease.page_table), f"lease {lease.lease_id}: page table short"
        chain = list(holds.locked_node.iter_ancestors())[::-1]
        if lease.ok and all(n.on_device for n in chain):
            tree_ids = [int(i) for n in chain if n.device_ids is not None for i in n.device_ids]
            assert lease.page_table[:len(tree_ids)] == tree_ids, \
                f"lease {lease.lease_id}: page table is not its locked chain's device pages"
            assert set(lease.page_table[len(tree_ids):]) <= lease.owned, \
                f"lease {lease.lease_id}: unpublished pages it does not own"
        else:
            assert not lease.ok, f"lease {lease.lease_id}: locked chain has pages off the device"
    live = set(copies.handles())
    for n in nodes:  # one load at a time; splits share their tickets
        if n.load_ticket is not None:
            host_locks[n] += 1
            assert n.on_device, f"{n}: loading without device rows"
            assert n.load_ticket in live, f"{n}: load ticket of no in-flight copy"
        assert n.l3_put is None or n.on_host, f"{n}: an L3 put without host rows"
        assert n.lock_device == locks[n], f"{n}: lock_device {n.lock_device} but {locks[n]} leases hold it"
        assert n.lock_host == host_locks[n], f"{n}: lock_host {n.lock_host} but {host_locks[n]} loads read it"
        assert n.pins == pins[n], f"{n}: pinned {n.pins} times but {pins[n]} open prefetches extend it"
        snap = n.snapshot
        if snap is not None:
            s = snap
            assert s.lock == snap_locks[s], f"{n}: snapshot lock count is off"
            assert not s.empty, f"{n}: empty snapshot left attached"
            assert s.loading == (s.load_ticket is not None), f"{n}: Snapshot.loading disagrees with its ticket"
            assert s.load_ticket is None or s.load_ticket in live, f"{n}: snapshot load of no in-flight copy"
    for snap, node in publisher.orphans().items():  # nothing silently kept: each still has a holder
        assert node.snapshot is snap and snap.provisional_owner is None, f"{node}: stale orphan snapshot"
        assert snap.lock or snap.busy, f"{node}: an orphaned provisional snapshot nobody holds was kept"
