"""The nodes of a ghost cache, and the keys its pages go by (:mod:`hicache.tree.ghost`).

A ghost node carries exactly the fields of a real tree node that an eviction strategy
reads, so the same strategy object ranks victims in the real tree and in every ghost.
"""

from __future__ import annotations

from typing import Hashable

import numpy as np
import xxhash

__all__ = ["GhostNode", "GhostSnapshot", "page_keys"]


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
