"""Eviction order kept current as the tree changes: choosing k victims costs O(k log n).

A cache's eviction asks, again and again, "which unlocked leaf is coldest?". Scanning the
tree for it costs a visit of every node per eviction, which at a million cached pages is a
million-node scan each time the pool runs short. Instead every candidate sits in a binary
heap, and the heap is updated when a node changes -- the tree reports each write of a field
eviction reads (``TreeNode.__setattr__``), so no caller has to remember to::

    event (lock, unlock, touch, insert, split, remove,     EvictionOrder
    residency change, copy in flight or done, snapshot)  ----------------->  refresh(node)
                                                                               |
      eligible?  no  -> drop its entry (lazily: a stale heap entry is skipped) |
                 yes -> key unchanged: nothing; else push a new entry <--------+

One :class:`LazyHeap` per kind of victim: device pages, host pages, device snapshots, host
snapshots (one order per tier, as the cache evicts per tier). Eligibility, per kind::

    device page   has device ids, no child with device ids, no lock, no backup reading it,
                  not busy (its load or its end snapshot's backup / put / load in flight)
    host page     host ids only, no children, no device or host lock, not busy, its end
                  snapshot (if any) unlocked
    snapshot      unlocked, not busy; device tier: has a device copy; host tier: has a host
                  copy and no device copy (a host copy of a device-resident snapshot is its
                  backup, evicted with the device copy's demotion instead)

and the key, smallest evicted first::

    page       (alive, strategy.node_priority(node), node_id)
    snapshot   (strategy.snapshot_priority(node, snap), node_id)

``alive`` is False for a *dead tail*: with state families (hybrid layouts) a childless node
without a snapshot at its end can never be a resume point, so its pages go before any live
one whatever the strategy says. The priority is a pluggable :class:`EvictionStrategy`
(``hicache.tree.eviction``); it is recomputed on every event above, so a strategy may read
any node or snapshot field the tree observes (or call :meth:`RadixTree.reprioritize` when
its score changes for another reason).

Lazy deletion: a changed node pushes a new entry and the old one stays in the heap until it
surfaces; an entry is live only while it is the node's current entry. Stale entries are
bounded: when they outnumber the live ones the heap is rebuilt from the live entries
(O(n), amortised O(1) per update).
"""

from __future__ import annotations

import heapq
import itertools
from typing import TYPE_CHECKING, Callable, Generic, Hashable, Iterator, TypeVar

if TYPE_CHECKING:
    from hicache.tree.eviction import EvictionStrategy
    from hicache.tree.node import Snapshot, TreeNode

T = TypeVar("T", bound=Hashable)
_COMPACT_SLACK = 64


class LazyHeap(Generic[T]):
    """A set of items ordered by a key, with O(log n) insert / re-key / remove.

    Heap entries are ``(key, seq, item)``: the push counter ``seq`` breaks ties (between a
    stale entry and a live one, or between equal keys) so items are never compared.
    """

    __slots__ = ("_heap", "_cur", "_held", "_stale", "_seq")

    def __init__(self) -> None:
        self._seq = itertools.count()
        self._heap: list[tuple] = []
        self._cur: dict[T, tuple] = {}     # item -> its live entry
        self._held: list[tuple] = []       # live entries popped by a running iteration
        self._stale = 0

    def __len__(self) -> int:
        return len(self._cur)

    def __contains__(self, item: T) -> bool:
        return item in self._cur

    def key(self, item: T) -> tuple | None:
        """The item's current key, or None if it is not in the set."""
        entry = self._cur.get(item)
        return None if entry is None else entry[0]

    def set(self, item: T, key: tuple | None) -> None:
        """Put ``item`` in the set with ``key`` (None removes it)."""
        cur = self._cur.get(item)
        if key is None:
            if cur is not None:
                del self._cur[item]
                self._stale += 1
            return
        if cur is not None:
            if cur[0] == key:
                return
            self._stale += 1
        entry = (key, next(self._seq), item)
        self._cur[item] = entry
        heapq.heappush(self._heap, entry)
        if self._stale > len(self._cur) + _COMPACT_SLACK:
            self._compact()

    def _compact(self) -> None:
        self._heap = list(self._cur.values())
        heapq.heapify(self._heap)
        self._held.clear()  # their live entries are back in the heap
        self._stale = 0

    def _restore(self) -> None:
        held, self._held = self._held, []
        cur = self._cur
        for entry in held:
            if cur.get(entry[2]) is entry:
                heapq.heappush(self._heap, entry)
            else:
                self._stale -= 1  # went stale while popped: it leaves with this list

    def ascending(self, skip: Callable[[T], bool] | None = None) -> Iterator[T]:
        """Items in key order, each at most once, reflecting changes made while iterating.

        An item that changes key or leaves and re-enters the set during the iteration is not
        yielded twice; one that enters (e.g. a parent whose last child was evicted) is
        yielded in its place in the order. ``skip(item)`` True passes an item over (it stays
        in the set). Costs O(log n) per item yielded or skipped.
        """
        self._restore()  # entries an abandoned iteration still held
        heap, cur, held = self._heap, self._cur, self._held
        seen: set[T] = set()
        try:
            while True:
                heap = self._heap  # a compaction may have replaced it
                held = self._held
                entry = None
                while heap:
                    e = heapq.heappop(heap)
                    if cur.get(e[2]) is e:
                        entry = e
                        break
                    self._stale -= 1
                if entry is None:
                    return
                held.append(entry)
                item = entry[2]
                if item in seen or (skip is not None and skip(item)):
                    continue
                seen.add(item)
                yield item
        finally:
            self._restore()

    def items(self) -> list[tuple[tuple, T]]:
        """Every live ``(key, item)`` (for integrity checks and tests)."""
        return [(entry[0], item) for item, entry in self._cur.items()]


class EvictionOrder:
    """The four victim orders of one tree under one strategy (see module docstring).

    Built by :meth:`RadixTree.eviction_order` with one scan of the tree, then kept current
    by the tree's change reports; never scans again.
    """

    def __init__(self, strategy: "EvictionStrategy", needs_snapshots: bool):
        self.strategy = strategy
        self.needs_snapshots = needs_snapshots
        self.device: LazyHeap[TreeNode] = LazyHeap()
        self.host: LazyHeap[TreeNode] = LazyHeap()
        self.snapshots: dict[str, LazyHeap[Snapshot]] = {"device": LazyHeap(), "host": LazyHeap()}

    # -- eligibility and keys -------------------------------------------------------------
    @staticmethod
    def device_eligible(n: "TreeNode") -> bool:
        snap = n.snapshot
        return (n.device_ids is not None and n.parent is not None and n.lock_device == 0
                and n.backup_pending == 0 and n.load_ticket is None and n._device_children == 0
                and (snap is None or not (snap.backup_pending or snap.put_pending or snap.loading)))

    @staticmethod
    def host_eligible(n: "TreeNode") -> bool:
        snap = n.snapshot
        return (n.device_ids is None and n.host_ids is not None and n.parent is not None and not n.children
                and n.lock_host == 0 and n.lock_device == 0 and n.load_ticket is None
                and (snap is None or not (snap.lock or snap.backup_pending or snap.put_pending or snap.loading)))

    @staticmethod
    def snapshot_eligible(s: "Snapshot", tier: str) -> bool:
        if s.lock or s.backup_pending or s.put_pending or s.loading:
            return False
        if tier == "device":
            return s.device_id is not None
        return s.host_id is not None and s.device_id is None

    def node_key(self, n: "TreeNode") -> tuple:
        snap = n.snapshot
        alive = (not self.needs_snapshots or bool(n.children)
                 or (snap is not None and (snap.device_id is not None or snap.host_id is not None)))
        return (alive, self.strategy.node_priority(n), n.node_id)

    def snapshot_key(self, node: "TreeNode", s: "Snapshot") -> tuple:
        return (self.strategy.snapshot_priority(node, s), node.node_id)

    # -- updates (called by the tree) ------------------------------------------------------
    def refresh_node(self, n: "TreeNode") -> None:
        # device_eligible / host_eligible inlined: this runs on every observed change.
        snap = n.snapshot
        busy = n.load_ticket is not None or (snap is not None and (snap.backup_pending or snap.put_pending
                                                                   or snap.loading))
        if n.device_ids is not None:
            dev = (not busy and n.lock_device == 0 and n.backup_pending == 0 and n._device_children == 0
                   and n.parent is not None)
            host = False
        else:
            dev = False
            host = (not busy and n.host_ids is not None and not n.children and n.lock_host == 0
                    and n.lock_device == 0 and n.parent is not None and (snap is None or not snap.lock))
        if dev or host:
            key = self.node_key(n)
            self.device.set(n, key if dev else None)
            self.host.set(n, key if host else None)
        else:
            if n in self.device._cur:
                self.device.set(n, None)
            if n in self.host._cur:
                self.host.set(n, None)

    def forget_node(self, n: "TreeNode") -> None:
        self.device.set(n, None)
        self.host.set(n, None)

    def refresh_snapshot(self, node: "TreeNode", s: "Snapshot") -> None:
        for tier, heap in self.snapshots.items():
            heap.set(s, self.snapshot_key(node, s) if self.snapshot_eligible(s, tier) else None)

    def forget_snapshot(self, s: "Snapshot") -> None:
        for heap in self.snapshots.values():
            heap.set(s, None)

    # -- victims ---------------------------------------------------------------------------
    def device_victims(self, busy: Callable[["TreeNode"], bool] | None = None) -> Iterator["TreeNode"]:
        """Nodes whose device pages may go, coldest first; ``busy`` passes more over."""
        return self.device.ascending(busy)

    def host_victims(self) -> Iterator["TreeNode"]:
        """Host-only leaves whose host pages may go, coldest first."""
        return self.host.ascending()

    def snapshot_victims(self, tier: str) -> Iterator[tuple["TreeNode", "Snapshot"]]:
        """Unlocked snapshots holding a ``tier`` copy, coldest first, with their node."""
        for snap in self.snapshots[tier].ascending():
            node = snap._node
            assert node is not None, "a detached snapshot in the eviction order"
            yield node, snap

    def check(self, nodes: list["TreeNode"]) -> None:
        """Assert every entry matches a fresh computation (tests and ``check_integrity``)."""
        for n in nodes:
            dev, host = self.device_eligible(n), self.host_eligible(n)
            key = self.node_key(n)
            assert self.device.key(n) == (key if dev else None), f"{n}: device order entry is stale"
            assert self.host.key(n) == (key if host and not dev else None), f"{n}: host order entry is stale"
            s = n.snapshot
            if s is not None:
                for tier, heap in self.snapshots.items():
                    want = self.snapshot_key(n, s) if self.snapshot_eligible(s, tier) else None
                    assert heap.key(s) == want, f"{n}: {tier} snapshot order entry is stale"
        live = set(map(id, nodes))
        for heap in (self.device, self.host):
            assert all(id(item) in live for _, item in heap.items()), "a detached node in the eviction order"
        snaps = {id(n.snapshot) for n in nodes if n.snapshot is not None}
        for heap in self.snapshots.values():
            assert all(id(s) in snaps for _, s in heap.items()), "a detached snapshot in the eviction order"
