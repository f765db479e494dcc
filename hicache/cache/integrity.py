"""``HiCache.check_integrity()``: every id has exactly one holder, every lock a reason.

Holders of each kind of id::

    device pages      tree nodes' device_ids + leases' owned (unpublished) pages
    host pages        tree nodes' host_ids   + in-flight backups' destinations
    device snapshots  tree snapshots         + leases' allocated, unpublished snapshots
    host snapshots    tree snapshots         + in-flight snapshot backups' destinations

and together they must equal each anchor's used ids. Node lock counts must equal the leases
whose locked node lies below, host locks the in-flight loads, snapshot locks the leases
that pin them.
"""

from __future__ import annotations

from collections import Counter
from typing import TYPE_CHECKING

from hicache.cache.residency import PageBackup, SnapshotBackup

if TYPE_CHECKING:
    from hicache.cache.facade import HiCache


def _expect(name: str, held: Counter, used) -> None:
    dup = [i for i, k in held.items() if k > 1]
    assert not dup, f"{name}: ids held twice: {sorted(dup)[:8]}"
    used = set(int(i) for i in used)
    missing = used - set(held)
    extra = set(held) - used
    assert not missing, f"{name}: allocated ids with no holder (leak): {sorted(missing)[:8]}"
    assert not extra, f"{name}: ids held but not allocated: {sorted(extra)[:8]}"


def check_cache(cache: "HiCache") -> None:
    cache.pools.check_integrity()
    cache.tree.check_integrity()
    nodes = list(cache.tree.nodes())
    leases = list(cache._leases.values())
    inflight = list(cache._inflight.values())

    dev_pages, host_pages, dev_snaps, host_snaps = Counter(), Counter(), Counter(), Counter()
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
        dev_snaps.update(lease._unpublished_snapshots)
    for pf in cache._prefetch_rows:
        host_pages.update(int(i) for i in pf.page_rows)
        if pf.state_row is not None:
            host_snaps[pf.state_row] += 1
    for tag in inflight:
        if isinstance(tag, PageBackup):
            host_pages.update(int(i) for i in tag.dst)
        elif isinstance(tag, SnapshotBackup):
            host_snaps[tag.dst] += 1
    _expect("device pages", dev_pages, cache.pools.device.anchors["page"].used_ids())
    _expect("host pages", host_pages, cache.pools.host.anchors["page"].used_ids())
    _expect("device snapshots", dev_snaps, cache.pools.device.anchors["state"].used_ids())
    _expect("host snapshots", host_snaps, cache.pools.host.anchors["state"].used_ids())

    locks, host_locks, snap_locks = Counter(), Counter(), Counter()
    pins = Counter()
    for pf in cache._open_prefetches:  # an open prefetch keeps the prefix it extends in the tree
        if pf.pinned is not None and not pf.pinned.is_root:
            pins[pf.pinned] += 1
    assert pins == Counter(cache._prefetch_pins), "prefetch pins do not match the open prefetches"
    for n in pins:
        assert n.parent is not None and n.parent.children.get(n.first_page_key(cache.page_tokens)) is n, \
            f"{n}: a prefetch-pinned node left the tree"
    for lease in leases:
        assert lease._locked_node is not None, f"lease {lease.lease_id} holds no lock"
        for n in lease._locked_node.iter_ancestors():
            locks[n.node_id] += 1
        for s in (lease._resume_snapshot, lease._newest_snapshot):
            if s is not None:
                snap_locks[id(s)] += 1
        assert lease.published_pages <= len(lease.page_table), f"lease {lease.lease_id}: page table short"
        chain = list(lease._locked_node.iter_ancestors())[::-1]
        if lease.ok and all(n.on_device for n in chain):
            tree_ids = [int(i) for n in chain for i in n.device_ids]
            assert lease.page_table[:len(tree_ids)] == tree_ids, \
                f"lease {lease.lease_id}: page table is not its locked chain's device pages"
            assert set(lease.page_table[len(tree_ids):]) <= lease.owned, \
                f"lease {lease.lease_id}: unpublished pages it does not own"
        else:
            assert not lease.ok, f"lease {lease.lease_id}: locked chain has pages off the device"
    for n in nodes:  # one load and one L3 put at most; splits share their tickets
        if n.load_ticket is not None:
            host_locks[n.node_id] += 1
            assert n.on_device, f"{n}: loading without device rows"
        if n.l3_put is not None:
            host_locks[n.node_id] += 1
            assert n.on_host, f"{n}: an L3 put without host rows"
    for n in nodes:
        assert n.lock_device == locks[n.node_id], \
            f"{n}: lock_device {n.lock_device} but {locks[n.node_id]} leases hold it"
        assert n.lock_host == host_locks[n.node_id], \
            f"{n}: lock_host {n.lock_host} but {host_locks[n.node_id]} loads read it"
        if n.snapshot is not None:
            assert n.snapshot.lock == snap_locks[id(n.snapshot)], f"{n}: snapshot lock count is off"
            assert not n.snapshot.empty, f"{n}: empty snapshot left attached"
            assert n.snapshot.loading == (id(n.snapshot) in cache._loading_snaps), \
                f"{n}: Snapshot.loading disagrees with the loads in flight"
    for snap, node in cache._orphans.items():  # nothing silently kept: each still has a holder
        assert node.snapshot is snap and snap.provisional_owner is None, f"{node}: stale orphan snapshot"
        assert snap.lock or snap.backup_pending or snap.put_pending or id(snap) in cache._loading_snaps, \
            f"{node}: an orphaned provisional snapshot nobody holds was kept"
    live = {id(h) for h in cache._handles.values()}
    for n in nodes:
        assert n.load_ticket is None or id(n.load_ticket) in live, f"{n}: load ticket of no in-flight copy"
