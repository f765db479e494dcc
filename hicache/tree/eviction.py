"""Eviction order per tier, with a pluggable strategy.

Victims are chosen leaf-first among unlocked nodes, lowest priority first::

    device tier: nodes on the device, no child on the device, no lock, no copy in flight
    host tier:   nodes on the host only (no device copy), no children, no host lock

After the caller evicts a victim its parent may become eligible; the generators re-check
it, so one pass evicts a whole cold branch bottom-up.

Dead tails go first. With state families (hybrid models) a request can only resume at a
boundary that has a snapshot, so a childless node whose end has none (its snapshot was
evicted or never kept) can never be a resume point: its pages serve no hit. Such nodes are
evicted before any live one, whatever the strategy says; layouts without state have no
snapshots at all, so for them every node ranks alike and the strategy alone decides::

    key = (has children or a snapshot at its end, strategy.priority(...), node_id)
"""


from __future__ import annotations

import heapq
from typing import Callable, Iterator, Protocol

from hicache.errors import ConfigError
from hicache.tree.node import Snapshot, TreeNode
from hicache.tree.radix import RadixTree


class EvictionStrategy(Protocol):
    """Orders victims: the smallest ``priority`` is evicted first."""

    name: str

    def priority(self, last_access: float, hit_count: int) -> tuple: ...


class LRU:
    """Least recently used first."""

    name = "lru"

    def priority(self, last_access: float, hit_count: int) -> tuple:
        return (last_access,)


class LFU:
    """Least frequently used first; ties broken by age."""

    name = "lfu"

    def priority(self, last_access: float, hit_count: int) -> tuple:
        return (hit_count, last_access)


STRATEGIES: dict[str, type] = {"lru": LRU, "lfu": LFU}


def get_strategy(name: str | EvictionStrategy) -> EvictionStrategy:
    if not isinstance(name, str):
        return name
    try:
        return STRATEGIES[name]()
    except KeyError:
        raise ConfigError("eviction", name, f"must be one of {sorted(STRATEGIES)}") from None


def _victims(tree: RadixTree, strategy: EvictionStrategy,
             eligible: Callable[[TreeNode], bool]) -> Iterator[TreeNode]:
    def key(n: TreeNode) -> tuple:
        alive = (not tree.needs_snapshots or bool(n.children)
                 or (n.snapshot is not None and not n.snapshot.empty))
        return (alive, strategy.priority(n.last_access, n.hit_count))

    heap = [(key(n), n.node_id, n) for n in tree.nodes() if eligible(n)]
    heapq.heapify(heap)
    seen = {n.node_id for _, _, n in heap}
    while heap:
        _, _, node = heapq.heappop(heap)
        if not eligible(node):  # changed since it was queued
            seen.discard(node.node_id)
            continue
        parent = node.parent
        yield node
        if parent is not None and not parent.is_root and parent.node_id not in seen and eligible(parent):
            seen.add(parent.node_id)
            heapq.heappush(heap, (key(parent), parent.node_id, parent))


def device_victims(tree: RadixTree, strategy: EvictionStrategy,
                   busy: Callable[[TreeNode], bool] = lambda n: False) -> Iterator[TreeNode]:
    """Nodes whose device pages may go, coldest first (the caller demotes or drops each)."""

    def eligible(n: TreeNode) -> bool:
        return (n.parent is not None and n.on_device and n.lock_device == 0 and n.backup_pending == 0
                and not busy(n) and not any(c.on_device for c in n.children.values()))

    return _victims(tree, strategy, eligible)


def host_victims(tree: RadixTree, strategy: EvictionStrategy) -> Iterator[TreeNode]:
    """Host-only leaves whose host pages may go, coldest first (the caller removes each)."""

    def eligible(n: TreeNode) -> bool:
        return (n.parent is not None and n.is_shadow and not n.children and n.lock_host == 0
                and n.lock_device == 0)

    return _victims(tree, strategy, eligible)


def snapshot_victims(tree: RadixTree, strategy: EvictionStrategy, tier: str) -> Iterator[tuple[TreeNode, Snapshot]]:
    """Unlocked snapshots holding a ``tier`` copy, coldest first.

    On the host, only snapshots without a device copy are candidates (the device copy is
    the one in use; its host copy is its backup).
    """
    def eligible(s: Snapshot) -> bool:
        if s.lock or s.backup_pending or s.put_pending:
            return False
        if tier == "device":
            return s.device_id is not None
        return s.host_id is not None and s.device_id is None

    heap = [(strategy.priority(s.last_access, 0), n.node_id, n, s)
            for n, s in tree.snapshots() if eligible(s)]
    heapq.heapify(heap)
    while heap:
        _, _, node, snap = heapq.heappop(heap)
        if node.snapshot is snap and eligible(snap):
            yield node, snap
