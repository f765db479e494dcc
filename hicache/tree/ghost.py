"""Ghost caches: metadata-only replicas of the cache under other eviction weights.

Why. Recency alone (LRU) is what the value order falls back on, and on multi-turn traffic
it is not the best order at tight budgets: a long conversation is both more likely to come
back (on chat traffic the chance of another turn grows with the turns already taken) and
worth more per byte when it does (its one ~4 MB snapshot is spread over more pages). On
ShareGPT at the tightest budget, weighting a chain's recency by its depth gains 1.5-3 points.
On the built-in agentic traffic a fixed weight loses: a rollout's step count is drawn
uniformly, so the deeper a rollout the likelier it has just ended. No constant fits both, so the weight is
chosen online: a few ghosts replay every request under candidate weights, and the cache
uses the weight whose ghost hit most over the recent window (:class:`DepthTuner`).

A ghost is the cache reduced to its bookkeeping: a trie of page keys (one node per page),
each page costing one unit of capacity and each snapshot ``snapshot_units`` (its bytes in
pages). A request hits its longest cached prefix cut back to the deepest snapshot; it then
inserts its whole pages, with snapshots where the engine offers them (the end of its whole
pages, and the point where it left the cached path), and the ghost evicts until it fits::

    1. dead leaves: no snapshot at their end, they can never be resumed
    2. intermediate snapshots: one child below, a deeper snapshot carries the branch
    3. live leaves, lowest  last_use + weight * ln(depth + 1)  first; a leaf goes with its
       snapshot and with the ancestors that leaves dead

A snapshot at a branch point (two or more children) is never a victim of its own: its
branches resume there. One at a former branch point (one child left) is not intermediate:
it ranks with the live leaves, as in the cache's value order. Time is counted in requests,
so a weight reads as "requests of recency one e-fold of depth is worth". Each step costs
O(pages of the request + victims x log n).
"""

from __future__ import annotations

import heapq
import math
from collections import deque
from typing import Sequence

import numpy as np


class _Page:
    __slots__ = ("key", "parent", "kids", "snap", "forked", "last", "depth", "gen")

    def __init__(self, key: object, parent: "_Page | None", depth: int):
        self.key, self.parent, self.depth = key, parent, depth
        self.kids = 0
        self.snap = False
        self.forked = False   # has had two children or more (RadixTree's TreeNode.forked)
        self.last = 0
        self.gen = 0          # its current heap entry's sequence number (0: none)


class GhostCache:
    """One ghost at one weight (module docstring). Keys are any hashable page ids whose
    equality means "same prefix" (chained page hashes)."""

    def __init__(self, capacity_units: float, snapshot_units: float, weight: float):
        self.capacity = capacity_units
        self.snapshot_units = snapshot_units
        self.weight = weight
        self.pages: dict[object, _Page] = {}
        self.used = 0.0
        self.now = 0
        self._leaves: list[tuple[float, int, object]] = []   # (priority, gen, key)
        self._inter: list[tuple[float, int, object]] = []    # (last, gen, key)
        self._dead: list[object] = []
        self._seq = 0

    # -- bookkeeping --------------------------------------------------------------------------
    def _push(self, p: _Page) -> None:
        """Queue ``p`` by its current role (dead leaf, live leaf or intermediate snapshot)."""
        self._seq += 1
        p.gen = self._seq     # unique across pages: a key removed and added again gets a new gen
        if p.snap and (p.kids == 0 or (p.kids == 1 and p.forked)):
            prio = p.last + self.weight * math.log(p.depth + 1)
            heapq.heappush(self._leaves, (prio, p.gen, p.key))
        elif p.kids == 0:
            self._dead.append(p.key)
        elif p.kids == 1 and p.snap:
            heapq.heappush(self._inter, (p.last, p.gen, p.key))

    def _current(self, key: object, gen: int) -> _Page | None:
        p = self.pages.get(key)
        return p if p is not None and p.gen == gen else None

    def _remove(self, p: _Page) -> None:
        del self.pages[p.key]
        self.used -= 1 + (self.snapshot_units if p.snap else 0)
        parent = p.parent
        if parent is not None:
            parent.kids -= 1
            if parent.kids <= 1:
                self._push(parent)

    def _remove_dead(self, p: _Page | None, protected: set) -> None:
        """Remove ``p`` and then each ancestor it leaves dead (no child, no snapshot)."""
        while p is not None and p.kids == 0 and not p.snap and p.key not in protected:
            parent = p.parent
            self._remove(p)
            p = parent

    def _drop_snapshot(self, p: _Page) -> None:
        p.snap = False
        self.used -= self.snapshot_units
        self._push(p)

    def _evict_one(self, protected: set) -> bool:
        while self._dead:
            p = self.pages.get(self._dead.pop())
            if p is not None and p.kids == 0 and not p.snap and p.key not in protected:
                self._remove(p)
                return True
        for heap in (self._inter, self._leaves):
            held: list[tuple[float, int, object]] = []
            try:
                while heap:
                    entry = heapq.heappop(heap)
                    p = self._current(entry[2], entry[1])
                    if p is None:
                        continue
                    if p.key in protected:
                        held.append(entry)
                        continue
                    if heap is self._inter:
                        self._drop_snapshot(p)
                    else:
                        p.snap = False
                        self.used -= self.snapshot_units
                        self._remove_dead(p, protected)
                    return True
            finally:
                for entry in held:
                    heapq.heappush(heap, entry)
        return False

    # -- one request ---------------------------------------------------------------------------
    def step(self, keys: Sequence[object]) -> int:
        """Replay one request's whole pages (``keys``, root first); returns its hit pages."""
        self.now += 1
        pages = self.pages
        k = 0
        while k < len(keys) and keys[k] in pages:
            k += 1
        hit = k
        while hit and not pages[keys[hit - 1]].snap:
            hit -= 1
        parent = None
        for depth, key in enumerate(keys):
            p = pages.get(key)
            if p is None:
                p = pages[key] = _Page(key, parent, depth)
                self.used += 1
                if parent is not None:
                    parent.kids += 1
                    parent.forked = parent.forked or parent.kids >= 2
                    self._push(parent)
            p.last = self.now
            parent = p
        for end in {len(keys), k}:
            if 0 < end <= len(keys) and not pages[keys[end - 1]].snap:
                pages[keys[end - 1]].snap = True
                self.used += self.snapshot_units
        for key in keys:   # re-queue what a touch re-keys: leaves and pages with a snapshot
            p = pages[key]
            if p.snap or not p.kids:
                self._push(p)
        if self.used > self.capacity:
            protected = set(keys)
            while self.used > self.capacity and self._evict_one(protected):
                pass
        if len(self._leaves) + len(self._inter) + len(self._dead) > 2 * len(pages) + 64:
            self._compact()
        return hit

    def _compact(self) -> None:
        """Drop superseded heap entries (lazy deletion leaves one per re-push), so a ghost
        that rarely evicts stays O(pages) in memory."""
        for heap in (self._leaves, self._inter):
            heap[:] = [e for e in heap if self._current(e[2], e[1]) is not None]
            heapq.heapify(heap)
        self._dead = list(dict.fromkeys(k for k in self._dead if k in self.pages))


class DepthTuner:
    """Runs one ghost per candidate weight and names the weight that hit most lately.

    Ties go to the smallest weight (plain recency unless depth has earned its place).
    """

    def __init__(self, capacity_units: float, snapshot_units: float, weights: Sequence[float], window: int):
        self.weights = tuple(weights)
        self.ghosts = [GhostCache(capacity_units, snapshot_units, w) for w in self.weights]
        self._recent: list[deque[int]] = [deque(maxlen=window) for _ in self.weights]
        self._sums = [0] * len(self.weights)
        self.weight = min(self.weights)
        self.switches = 0

    def observe(self, keys: Sequence[object]) -> bool:
        """Replay one request in every ghost; True when the chosen weight changed."""
        for i, ghost in enumerate(self.ghosts):
            hit = ghost.step(keys)
            recent = self._recent[i]
            if len(recent) == recent.maxlen:
                self._sums[i] -= recent[0]
            recent.append(hit)
            self._sums[i] += hit
        best = max(range(len(self.ghosts)), key=lambda i: (self._sums[i], -self.weights[i]))
        weight = self.weights[best]
        if weight == self.weight:
            return False
        self.weight = weight
        self.switches += 1
        return True


def page_keys(tokens: np.ndarray, page_tokens: int, pages: int) -> list[int]:
    """Ghost keys of the first ``pages`` whole pages of ``tokens``: each the hash of its
    parent's key and its tokens, so equal keys mean equal prefixes (a ghost needs no more:
    a collision costs a ghost one wrong hit, never a byte served)."""
    keys, key = [], 0
    raw = tokens[: pages * page_tokens].tobytes()
    width = len(raw) // pages if pages else 0
    for i in range(pages):
        key = hash((key, raw[i * width: (i + 1) * width]))
        keys.append(key)
    return keys
