"""Eviction order per tier, with a pluggable strategy.

Victims are chosen leaf-first among unlocked nodes, lowest priority first::

    device tier: nodes on the device, no child on the device, no lock, no copy in flight
    host tier:   nodes on the host only (no device copy), no children, no lock, no copy
                 in flight, no locked snapshot at their end

After the caller evicts a victim its parent may become eligible; it then joins the order
at once, so one pass evicts a whole cold branch bottom-up.

Dead tails go first. With state families (hybrid models) a request can only resume at a
boundary that has a snapshot, so a childless node whose end has none (its snapshot was
evicted or never kept) can never be a resume point: its pages serve no hit. Such nodes are
evicted before any live one, whatever the strategy says; layouts without state have no
snapshots at all, so for them every node ranks alike and the strategy alone decides::

    key = (has children or a snapshot at its end, strategy.node_priority(node), node_id)

The order is not computed here: the tree keeps it current as nodes change
(:mod:`hicache.tree.order`), so each victim costs O(log n) whatever the tree's size. The
functions below are the entry points the cache calls.

A strategy is the pluggable part: an object with a ``name`` and two priority functions
(smaller is evicted first). They may read any field of the node or snapshot; the order
recomputes them on every change the tree observes (access, lock, residency, copies,
snapshot changes). A value-aware policy (a score per page run and per snapshot, e.g.
expected hits per byte) plugs in here; since page runs and snapshots are then ranked on
one scale, a caller wanting one budget across both merges ``device_victims`` and
``snapshot_victims`` by that priority.
"""


from __future__ import annotations

import math
from typing import Callable, Iterator, Protocol

from hicache.errors import ConfigError
from hicache.tree.node import Snapshot, TreeNode
from hicache.tree.radix import RadixTree


class EvictionStrategy(Protocol):
    """Orders victims: the smallest priority is evicted first.

    ``name`` identifies the strategy: one tree keeps one order per (strategy type, name),
    so two instances of a type with the same name must rank alike.
    """

    name: str

    def node_priority(self, node: TreeNode) -> tuple: ...

    def snapshot_priority(self, node: TreeNode, snap: Snapshot) -> tuple: ...


class AccessStrategy:
    """A strategy over access time and hit count only: ``priority(last_access, hit_count)``."""

    name = "access"

    def priority(self, last_access: float, hit_count: int) -> tuple:
        raise NotImplementedError

    def node_priority(self, node: TreeNode) -> tuple:
        return self.priority(node.last_access, node.hit_count)

    def snapshot_priority(self, node: TreeNode, snap: Snapshot) -> tuple:
        return self.priority(snap.last_access, 0)


class LRU(AccessStrategy):
    """Least recently used first."""

    name = "lru"

    def priority(self, last_access: float, hit_count: int) -> tuple:
        return (last_access,)


class LFU(AccessStrategy):
    """Least frequently used first; ties broken by age."""

    name = "lfu"

    def priority(self, last_access: float, hit_count: int) -> tuple:
        return (hit_count, last_access)


class Value:
    """Recency within value classes: what a victim's bytes still protect decides first.

    A snapshot is *intermediate* when a deeper snapshot hangs below it on its node's only
    path (``node.snapshots_below`` > 0, at most one child): a request that reaches it almost
    always goes on to the deeper resume point, as a multi-turn conversation resumes at its
    latest turn, so its bytes protect little that the deeper one does not. Intermediate
    snapshots go first. A snapshot at a *branch point* (two or more children: requests
    diverged there, e.g. a task prompt shared by its rollouts) goes last: every branch below
    it, and every new one, resumes there, while its own access time only says when a request
    last resumed exactly there (agentic traces: +0.6 points at the tightest budget over
    ranking it with the leaves). Between them, the snapshot at the end of a path (the newest
    turn) ranks with the page runs, and so does a *former* branch point: a node where
    requests once diverged (``node.forked``) whose other branches have since been evicted.
    It is not intermediate, though it has one child and a deeper snapshot below: the next
    request to leave the path there (a new task on a shared system prompt) resumes at it.
    Ranked as intermediate, it went first, and every new task on a prompt whose other tasks
    had gone recomputed the whole prompt (agentic traces: +1.0 to +1.4 points at the
    tightest budget with this rule)::

        snapshot  (0 intermediate | 1 end of a path | 2 branch point,  score)
        page run  (1,                                                   score)
        score     last_access + depth_weight * ln(depth + 1)      (branch points: last_access)

    ``depth_weight`` (in ticks of the tree's clock; 0 is plain recency) lets a deep chain
    outlast a shallow one of the same age: on chat traffic a long conversation is likelier
    to come back and saves more per byte when it does. No fixed weight fits every workload,
    so the cache sets it online from its ghost caches (:mod:`hicache.tree.ghost`) and calls
    :meth:`RadixTree.reorder` when it changes. Both kinds share one scale, so a tier whose
    pages and snapshots draw on one byte budget can merge the two orders.
    """

    name = "value"

    def __init__(self, depth_weight: float = 0.0):
        self.depth_weight = depth_weight

    def _score(self, last_access: float, depth: int) -> float:
        w = self.depth_weight
        return last_access + w * math.log(depth + 1) if w else last_access

    def node_priority(self, node: TreeNode) -> tuple:
        return (1, self._score(node.last_access, node.depth))

    @staticmethod
    def intermediate(node: TreeNode) -> bool:
        """A deeper snapshot hangs below ``node`` on its only path, and no request ever
        left that path here (``node.forked``)."""
        return node.snapshots_below > 0 and len(node.children) <= 1 and not node.forked

    def snapshot_priority(self, node: TreeNode, snap: Snapshot) -> tuple:
        if len(node.children) >= 2:
            return (2, snap.last_access)
        return (0 if self.intermediate(node) else 1, self._score(snap.last_access, node.depth))


STRATEGIES: dict[str, type] = {"lru": LRU, "lfu": LFU, "value": Value}


def get_strategy(name: str | EvictionStrategy) -> EvictionStrategy:
    if not isinstance(name, str):
        return name
    try:
        return STRATEGIES[name]()
    except KeyError:
        raise ConfigError("eviction", name, f"must be one of {sorted(STRATEGIES)}") from None


def device_victims(tree: RadixTree, strategy: EvictionStrategy,
                   busy: Callable[[TreeNode], bool] | None = None) -> Iterator[TreeNode]:
    """Nodes whose device pages may go, coldest first (the caller demotes or drops each).

    ``busy`` (optional) passes over more nodes, each checked as it comes up; the tree
    already leaves out every node whose copies are in flight.
    """
    return tree.eviction_order(strategy).device_victims(busy)


def host_victims(tree: RadixTree, strategy: EvictionStrategy) -> Iterator[TreeNode]:
    """Host-only leaves whose host pages may go, coldest first (the caller removes each)."""
    return tree.eviction_order(strategy).host_victims()


def snapshot_victims(tree: RadixTree, strategy: EvictionStrategy, tier: str) -> Iterator[tuple[TreeNode, Snapshot]]:
    """Unlocked snapshots holding a ``tier`` copy, coldest first.

    On the host, only snapshots without a device copy are candidates (the device copy is
    the one in use; its host copy is its backup).
    """
    return tree.eviction_order(strategy).snapshot_victims(tier)
