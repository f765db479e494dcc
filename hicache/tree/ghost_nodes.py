"""The nodes of a ghost cache, and the keys its pages go by (:mod:`hicache.tree.ghost`).

A ghost node carries exactly the fields of a real tree node that an eviction strategy
reads, so the same strategy object ranks victims in the real tree and in every ghost.
"""

from __future__ import annotations

import heapq
from typing import Hashable

import numpy as np
import xxhash

__all__ = ["GhostNode", "GhostSnapshot", "check_trie", "copy_trie", "heap_top", "live_heap", "page_keys"]


class GhostSnapshot:
    """The fields of a real :class:`~hicache.tree.node.Snapshot` a strategy reads."""

    __slots__ = ("last_access", "kind", "resumed", "passed", "expected")

    def __init__(self, now: float, kind: str):
        self.last_access = now
        self.kind = kind
        self.resumed = 0
        self.passed = 0
        self.expected = False


class GhostNode:
    """One page of a ghost, with the fields of a :class:`~hicache.tree.node.TreeNode` a
    strategy reads."""

    __slots__ = ("key", "parent", "children", "depth", "last_access", "hit_count", "snapshot", "forked",
                 "snapshots_below", "pins", "spins", "gen", "sgen", "decoded", "branches")

    def __init__(self, key: Hashable, parent: "GhostNode | None", depth: int, now: float):
        self.key = key
        self.parent = parent
        self.children: dict[Hashable, GhostNode] = {}
        self.depth = depth
        self.last_access = now
        self.hit_count = 0
        self.snapshot: GhostSnapshot | None = None
        self.forked = False
        self.decoded = False
        self.branches = 0
        self.snapshots_below = 0
        self.pins = 0    # running requests whose path covers this page
        self.spins = 0   # running requests that hold this page's snapshot (resume point, newest published)
        self.gen = 0     # sequence number of its live page-heap entry (0: none)
        self.sgen = 0    # sequence number of its live snapshot-heap entry (0: none)


def copy_trie(root: GhostNode, nodes: dict[Hashable, GhostNode], new_root: GhostNode,
              new_nodes: dict[Hashable, GhostNode]) -> dict[int, GhostNode]:
    """Copy the trie under ``root`` (its pages ``nodes`` by key, snapshots and counters
    included) under ``new_root`` into ``new_nodes``; returns old node id -> its copy (the
    root's too), for the caller's references into the trie (a ghost's pins)."""
    new: dict[int, GhostNode] = {id(root): new_root}
    for key, old in nodes.items():   # every node first, then the links between them
        node = GhostNode(key, None, old.depth, old.last_access)
        new[id(old)] = node
        for name in ("hit_count", "forked", "decoded", "branches", "snapshots_below", "pins", "spins"):
            setattr(node, name, getattr(old, name))
        snap = old.snapshot
        if snap is not None:
            copy = node.snapshot = GhostSnapshot(snap.last_access, snap.kind)
            copy.resumed, copy.passed, copy.expected = snap.resumed, snap.passed, snap.expected
        new_nodes[key] = node
    for old in (root, *nodes.values()):
        node = new[id(old)]
        if old.parent is not None:
            node.parent = new[id(old.parent)]
        node.children = {k: new[id(c)] for k, c in old.children.items()}
    for name in ("branches", "forked", "snapshots_below"):
        setattr(new_root, name, getattr(root, name))
    return new


def check_trie(root: GhostNode, nodes: dict[Hashable, GhostNode]) -> None:
    """Recount every node's ``branches`` (children not a decode's), ``forked`` and
    ``snapshots_below`` (tests)."""
    for node in list(nodes.values()) + [root]:
        taken = sum(not c.decoded for c in node.children.values())
        assert node.branches == taken, (node.key, node.branches, taken)
        assert node.forked or taken < 2 or node is root, (node.key, "branches but not forked")
    for node in nodes.values():
        below = 0
        stack = list(node.children.values())
        while stack:
            c = stack.pop()
            below += c.snapshot is not None
            stack.extend(c.children.values())
        assert below == node.snapshots_below, (node.key, below, node.snapshots_below)


def page_keys(tokens: np.ndarray, page_tokens: int, pages: int, root: int = 0) -> list[int]:
    """Ghost keys of the first ``pages`` whole pages of ``tokens``: each a 64-bit hash of
    its parent's key and its tokens (xxh3, seeded with the parent), so equal keys mean
    equal prefixes and every process computes the same keys (a ghost needs no more: a
    collision costs a ghost one wrong hit, never a byte served). ``root``: the first
    parent key, a tenant's (so ghosts share no page between tenants, as the cache does)."""
    keys, key = [], root
    raw = np.ascontiguousarray(tokens[: pages * page_tokens], dtype="<i4").tobytes()
    width = page_tokens * 4
    digest = xxhash.xxh3_64_intdigest
    for i in range(pages):
        key = digest(raw[i * width: (i + 1) * width], seed=key)
        keys.append(key)
    return keys


def heap_top(heap: list[tuple], snaps: bool, held: list[tuple]) -> tuple | None:
    """The first live entry of a ghost's victim heap (``(key, seq, node)``; ``snaps``: the
    snapshot heap, live while the node's ``sgen`` is ``seq``, else its ``gen``) that no
    running request pins. Stale entries (lazy deletion) are popped; pinned ones are moved
    to ``held``, for the caller to push back once it is done evicting."""
    while heap:
        entry = heap[0]
        node = entry[2]
        if entry[1] != (node.sgen if snaps else node.gen):
            heapq.heappop(heap)
        elif node.spins if snaps else node.pins:
            held.append(heapq.heappop(heap))
        else:
            return entry
    return None


def live_heap(heap: list[tuple], snaps: bool) -> list[tuple]:
    """The heap without its stale entries (lazy deletion leaves one per re-push)."""
    out = [e for e in heap if e[1] == (e[2].sgen if snaps else e[2].gen)]
    heapq.heapify(out)
    return out
