"""What the tree keeps current as nodes change: eviction orders and evictable totals.

Every node and snapshot of a tree reports to the tree's :class:`TreeWatch` when a field
eviction reads is written (``TreeNode.__setattr__``, ``Snapshot.__setattr__``), and the
tree reports structure changes (a node added, removed, split). The watch turns each report
into O(log n) updates of:

* the victim orders, one :class:`~hicache.tree.order.EvictionOrder` per strategy in use;
* evictable totals per tier -- pages of unlocked nodes on the device, pages of unlocked
  shadow nodes, unlocked snapshots with a device copy, unlocked host-only snapshots -- so
  "could eviction free k?" is answered without a scan. Each node and snapshot remembers
  what it adds to the totals (``_counted``), so a report only applies the difference.
* each node's ``snapshots_below``: how many snapshots are attached strictly below it.
  A snapshot with a deeper one on its only path is an *intermediate* resume point: a
  request that can resume there can usually resume deeper. A value-aware strategy reads
  it together with the node's fan-out (``len(children)``: a branch point); attaching or
  detaching a snapshot walks its ancestors once, and a change of a node's children
  refreshes the node's own snapshot entry (``children_changed``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Iterable

from hicache.tree.node import UNCOUNTED as _NONE
from hicache.tree.order import EvictionOrder
from hicache.tree.owners import OwnerIndex

if TYPE_CHECKING:
    from hicache.tree.eviction import EvictionStrategy
    from hicache.tree.node import Snapshot, TreeNode

_set = object.__setattr__


class TreeWatch:
    """The orders and totals of one tree (see module docstring)."""

    def __init__(self, needs_snapshots: bool):
        self.needs_snapshots = needs_snapshots
        self.orders: dict[tuple, EvictionOrder] = {}
        self.pages = {"device": 0, "host": 0}       # unlocked device pages, unlocked shadow pages
        self.snapshots = {"device": 0, "host": 0}   # unlocked snapshots per tier
        self.owners: OwnerIndex | None = None        # built on first use (shared arenas)

    def eviction_order(self, strategy: "EvictionStrategy", nodes: Iterable["TreeNode"]) -> EvictionOrder:
        key = (type(strategy), strategy.name)
        order = self.orders.get(key)
        if order is None:
            order = self.orders[key] = EvictionOrder(strategy, self.needs_snapshots)
            for n in nodes:
                order.refresh_node(n)
                if n.snapshot is not None:
                    order.refresh_snapshot(n, n.snapshot)
        return order

    def owner_index(self, nodes: Iterable["TreeNode"]) -> OwnerIndex:
        if self.owners is None:
            self.owners = OwnerIndex(self, nodes)
        return self.owners

    def node_added(self, node: "TreeNode") -> None:
        """``node`` joined the tree holding ids it was built with (not reported by a write)."""
        if self.owners is not None:
            self.owners.node_ids(node)

    def drop_orders(self) -> None:
        self.orders.clear()

    # -- totals -----------------------------------------------------------------------------
    @staticmethod
    def _settle(totals: dict[str, int], item: "TreeNode | Snapshot", now: tuple[int, int]) -> None:
        """Move ``item``'s share of ``totals`` from what it counted to ``now`` (device, host)."""
        was = item._counted
        if now != was:
            totals["device"] += now[0] - was[0]
            totals["host"] += now[1] - was[1]
            _set(item, "_counted", now)

    def _count(self, n: "TreeNode") -> None:
        if n.lock_device:
            now = _NONE
        elif n.device_ids is not None:
            now = (n.num_pages, 0)
        elif n.host_ids is not None and not n.host_held:
            now = (0, n.num_pages)
        else:
            now = _NONE
        self._settle(self.pages, n, now)

    def _count_snapshot(self, s: "Snapshot", attached: bool = True) -> None:
        now = _NONE
        if attached and not s.lock:
            if s.device_id is not None:
                now = (1, 0)
            elif s.host_id is not None:
                now = (0, 1)
        self._settle(self.snapshots, s, now)

    # -- reports ----------------------------------------------------------------------------
    def node_changed(self, node: "TreeNode", residency: bool = False) -> None:
        """A field eviction reads changed on ``node``; ``residency``: it gained or lost its
        device copy (its parent's count of device children changes)."""
        parent = node.parent
        if parent is None:
            return  # the root or a detached node: never a victim
        if residency:
            _set(parent, "_device_children", parent._device_children + (1 if node.device_ids is not None else -1))
            if parent.parent is not None:
                for order in self.orders.values():
                    order.refresh_node(parent)
        self._count(node)
        for order in self.orders.values():
            order.refresh_node(node)

    def node_touched(self, node: "TreeNode") -> None:
        """Only ``node``'s access time or hit count changed: a new key if it is a candidate
        (a node outside every order has no key to update, and totals ignore access)."""
        for order in self.orders.values():
            if node in order.device or node in order.host:
                order.refresh_node(node)

    def node_locked(self, node: "TreeNode") -> None:
        """``node``'s device lock went from 0 to 1: it leaves the orders and the totals.
        (Runs for every newly locked node on a request's path: kept to dict lookups.)"""
        if node._counted is not _NONE:
            self._settle(self.pages, node, _NONE)
        for order in self.orders.values():
            if node in order.device._cur:
                order.device.set(node, None)
            if node in order.host._cur:
                order.host.set(node, None)

    def node_removed(self, node: "TreeNode") -> None:
        self._settle(self.pages, node, _NONE)
        for order in self.orders.values():
            order.forget_node(node)
        if node.snapshot is not None:
            self.snapshot_detached(node.snapshot, node)

    def _cover(self, node: "TreeNode", delta: int) -> None:
        """Add ``delta`` to ``snapshots_below`` of ``node``'s strict ancestors (and re-rank
        their snapshots: a strategy may read it)."""
        a = node.parent
        while a is not None:
            _set(a, "snapshots_below", a.snapshots_below + delta)
            s = a.snapshot
            if s is not None:
                for order in self.orders.values():
                    order.refresh_snapshot(a, s)
            a = a.parent

    def children_changed(self, node: "TreeNode") -> None:
        """``node`` gained or lost a child: its snapshot's rank may read its fan-out."""
        s = node.snapshot
        if s is not None:
            for order in self.orders.values():
                order.refresh_snapshot(node, s)

    def snapshot_changed(self, node: "TreeNode", snap: "Snapshot", name: str) -> None:
        if name == "attach":
            self._cover(node, +1)
        if self.owners is not None and (name == "attach" or name == "device_id" or name == "host_id"):
            self.owners.snapshot_rows(snap)
        self._count_snapshot(snap)
        for order in self.orders.values():
            order.refresh_snapshot(node, snap)
        if name != "last_access" and name != "attach":  # attach: the node reports itself
            self.node_changed(node)

    def snapshot_detached(self, snap: "Snapshot", node: "TreeNode") -> None:
        self._cover(node, -1)
        self._count_snapshot(snap, attached=False)
        for order in self.orders.values():
            order.forget_snapshot(snap)

    def check(self, nodes: list["TreeNode"]) -> None:
        """Assert the totals and orders match a fresh computation over ``nodes``."""
        pages = {"device": 0, "host": 0}
        snaps = {"device": 0, "host": 0}
        for n in nodes:
            if not n.lock_device:
                if n.device_ids is not None:
                    pages["device"] += n.num_pages
                elif n.host_ids is not None and not n.host_held:
                    pages["host"] += n.num_pages
            s = n.snapshot
            if s is not None and not s.lock and not s.empty:
                snaps["device" if s.device_id is not None else "host"] += 1
        assert pages == self.pages, f"evictable page totals {self.pages} != {pages}"
        assert snaps == self.snapshots, f"evictable snapshot totals {self.snapshots} != {snaps}"
        below: dict[int, int] = {}   # id(node) -> snapshots attached strictly below it
        for n in nodes:  # children before parents (RadixTree.nodes order is not assumed)
            if n.snapshot is not None:
                a = n.parent
                while a is not None:
                    below[id(a)] = below.get(id(a), 0) + 1
                    a = a.parent
        for n in nodes:
            assert n.snapshots_below == below.get(id(n), 0), \
                f"{n}: snapshots_below {n.snapshots_below} != {below.get(id(n), 0)}"
        for order in self.orders.values():
            order.check(nodes)
