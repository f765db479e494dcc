"""Ghost caches: metadata-only replicas of the cache, one per candidate policy.

Why. No fixed eviction order is best on every shape of traffic: a rule that is right when
each turn continues through the previous turn's output is wrong when the next turn resumes
at the previous *prompt's* end (reasoning models, traces without conversation ids), and
a recency order that suits chat lets one-off prompts displace reused ones on production
traffic. So the cache runs several whole policies side by side, in ghosts, and follows the
one that has hit most lately (:class:`hicache.tree.selector.PolicySelector`). A ghost is
only as useful as it is faithful, so it is fed the *real cache's* events, not a model of
the traffic: every lookup (the resume path a lease opens), every publish (the pages and the
snapshot a request offers, with the boundary that offered it), every ``expect`` of a
queued request and every release, and it ranks victims with the *same* strategy object the
real tree uses (:mod:`hicache.tree.eviction`), read off ghost nodes that carry the fields a
strategy reads (``last_access``, ``depth``, ``children``, ``forked``, ``snapshots_below``,
``hit_count``, and per snapshot ``last_access``, ``kind``, ``resumed``, ``passed``,
``expected``).

What a ghost holds::

    a trie of page keys (one node per page, keyed by the chained page hash)
    per node: a snapshot for the boundary at its end, or none
    capacity in page units: a page is 1, a snapshot its bytes in pages; sized like the
    cache (device pages + host bytes): with write_back and an exclusive host tier the two
    tiers hold different pages, so the pair behaves as one cache of their summed bytes

    lookup    hit = the deepest page boundary on the cached prefix with a snapshot
              (history must cover the prefix, state sits at the resume point); the path
              and that snapshot are touched, the snapshot counts ``resumed``, those on
              the path above it ``passed``; the path is pinned for the request; where
              the prompt leaves the ghost's history past that point is its fork
    publish   pages added (re-added when the ghost had evicted them) and pinned, a
              decode's marked ``decoded`` until a request goes through them; the snapshot
              attached with the boundary's kind; once past the request's fork, a
              ``branch`` snapshot there if it has none (the engine leaves one where its
              own tree forks: each ghost takes the forks of its own tree); room for
              the pages made while the request still holds the snapshots it held
              before (the engine allocated them meanwhile), which are let go after
    expect    the resume path and snapshot touched (a queued request), nothing pinned
    release   the request's pins go
    evict     while over capacity: the smallest of
                  page leaf   (has a snapshot at its end, strategy.node_priority)
                  snapshot    (True, strategy.snapshot_priority)
              among what no running request pins; a leaf without a snapshot is dead
              (no request can resume there) and ranks first, as in the real order

A leaf evicted goes with its snapshot; a snapshot evicted may leave its node a dead leaf.
Layouts without state resume at any page boundary: every node counts as having a
snapshot of size 0 (``snapshot_units == 0`` and ``stateless``).

Cost: O(pages of the request) per lookup and publish, plus O(depth) per snapshot attached
or detached (``snapshots_below`` of the ancestors), plus O(log n) per victim.
"""

from __future__ import annotations

import heapq
from typing import TYPE_CHECKING, Hashable, Sequence

from hicache.tree.ghost_nodes import GhostNode, GhostSnapshot, check_trie, copy_trie, heap_top, live_heap

if TYPE_CHECKING:
    from hicache.tree.eviction import EvictionStrategy


class GhostCache:
    """One ghost under one strategy (module docstring).

    ``capacity_units``: the cache's bytes in pages; ``snapshot_units``: a snapshot's bytes
    in pages (0 for layouts without state, with ``stateless=True``).
    """

    def __init__(self, strategy: "EvictionStrategy", capacity_units: float, snapshot_units: float, *,
                 stateless: bool = False):
        self.strategy = strategy
        self.capacity = float(capacity_units)
        self.snapshot_units = float(snapshot_units)
        self.stateless = stateless
        self.root = GhostNode(None, None, 0, 0.0)
        self.nodes: dict[Hashable, GhostNode] = {}
        self.used = 0.0
        self.clock = 0
        self.evicted_pages = 0
        self.evicted_snapshots = 0
        self._pages: list[tuple] = []   # (key tuple, seq, node) of leaves
        self._snaps: list[tuple] = []   # (key tuple, seq, node) of snapshots
        self._seq = 0
        self._held: dict[object, list[GhostNode]] = {}   # request -> nodes it pins (one pin each)
        self._snap_held: dict[object, list[GhostNode | None]] = {}   # request -> [resume node, newest published]
        self._prompt: dict[object, int] = {}   # request -> its prompt's whole pages
        self._fork: dict[object, int] = {}     # request -> where its prompt leaves this ghost's history

    # -- order -------------------------------------------------------------------------------
    def _push_page(self, node: GhostNode) -> None:
        if node.children or node.parent is None:
            node.gen = 0
            return
        self._seq += 1
        node.gen = self._seq
        alive = self.stateless or node.snapshot is not None
        heapq.heappush(self._pages, ((alive, self.strategy.node_priority(node)), self._seq, node))

    def _push_snap(self, node: GhostNode) -> None:
        if node.snapshot is None or self.stateless:
            node.sgen = 0
            return
        self._seq += 1
        node.sgen = self._seq
        heapq.heappush(self._snaps, ((True, self.strategy.snapshot_priority(node, node.snapshot)), self._seq, node))

    def reorder(self, strategy: "EvictionStrategy") -> None:
        """Rank by another strategy from now on (rebuilds both heaps, O(n))."""
        self.strategy = strategy
        self._pages, self._snaps = [], []
        for node in self.nodes.values():
            self._push_page(node)
            self._push_snap(node)

    def clone(self, strategy: "EvictionStrategy") -> "GhostCache":
        """A copy of this ghost (its pages, snapshots, counters and running requests' pins)
        that ranks by ``strategy`` from now on: what the cache would hold if it switched
        to ``strategy`` now, fed the same events from here (the selector's trial). O(n)."""
        twin = GhostCache(strategy, self.capacity, self.snapshot_units, stateless=self.stateless)
        new = copy_trie(self.root, self.nodes, twin.root, twin.nodes)
        twin.used, twin.clock = self.used, self.clock
        twin._held = {r: [new[id(n)] for n in held] for r, held in self._held.items()}
        twin._snap_held = {r: [None if n is None else new[id(n)] for n in slots]
                           for r, slots in self._snap_held.items()}
        twin._prompt = dict(self._prompt)
        twin._fork = dict(self._fork)
        twin.reorder(strategy)
        return twin

    # -- structure ---------------------------------------------------------------------------
    def _adjust_below(self, node: GhostNode, delta: int) -> None:
        """A snapshot attached to (or detached from) ``node``: every ancestor's count of
        snapshots below changes; one whose count leaves or reaches 0 is re-ranked."""
        a = node.parent
        while a is not None and a.parent is not None:
            before = a.snapshots_below
            a.snapshots_below = before + delta
            if a.snapshot is not None and (before == 0 or a.snapshots_below == 0):
                self._push_snap(a)
            a = a.parent

    def _attach(self, node: GhostNode, kind: str) -> None:
        snap = node.snapshot
        if snap is not None:
            snap.last_access = self.clock
            self._push_snap(node)
            return
        node.snapshot = GhostSnapshot(self.clock, kind)
        self.used += self.snapshot_units
        self._adjust_below(node, 1)
        self._push_snap(node)
        self._push_page(node)   # a leaf with a snapshot is alive

    def _detach(self, node: GhostNode) -> None:
        node.snapshot = None
        node.sgen = 0
        self.used -= self.snapshot_units
        self.evicted_snapshots += 1
        self._adjust_below(node, -1)
        self._push_page(node)   # a leaf without one is dead

    def _branch(self, parent: GhostNode | None, delta: int) -> None:
        """``parent`` gained or lost a branch requests were seen to take (RadixTree._branch)."""
        if parent is None:
            return
        parent.branches += delta
        if parent.branches >= 2:
            parent.forked = True
        if parent.snapshot is not None:
            self._push_snap(parent)

    def _taken(self, node: GhostNode) -> None:
        node.decoded = False
        self._branch(node.parent, 1)
        self._push_page(node)   # a strategy may rank a decode's idle pages apart

    def _remove_leaf(self, node: GhostNode) -> None:
        if node.snapshot is not None:
            self._detach(node)
        parent = node.parent
        assert parent is not None and not node.children
        del parent.children[node.key]
        del self.nodes[node.key]
        if not node.decoded:
            self._branch(parent, -1)
        node.gen = node.sgen = 0
        self.used -= 1
        self.evicted_pages += 1
        if parent.snapshot is not None:
            self._push_snap(parent)   # fan-out changed
        self._push_page(parent)

    # -- events ------------------------------------------------------------------------------
    def _walk(self, keys: Sequence[Hashable]) -> tuple[list[GhostNode], int]:
        """The cached path of ``keys`` and the pages of it a request can resume from."""
        path = []
        nodes = self.nodes
        for key in keys:
            node = nodes.get(key)
            if node is None:
                break
            path.append(node)
        resume = len(path)
        if not self.stateless:
            while resume and path[resume - 1].snapshot is None:
                resume -= 1
        return path, resume

    def _touch(self, path: list[GhostNode], resume: int, *, hit: bool) -> None:
        self.clock += 1
        now = self.clock
        for i in range(resume):
            node = path[i]
            node.last_access = now
            if hit:
                node.hit_count += 1
                if node.decoded:
                    self._taken(node)
            snap = node.snapshot
            if snap is not None and hit and i < resume - 1:
                snap.passed += 1
                self._push_snap(node)
            if not node.children:
                self._push_page(node)
        if resume:
            node = path[resume - 1]
            snap = node.snapshot
            if snap is not None:
                snap.last_access = now
                if hit:
                    snap.resumed += 1
                else:
                    snap.expected = True   # a queued request resumes here (expect)
                self._push_snap(node)
            if getattr(self.strategy, "refresh_forks", False):   # forks kept warm for passing requests
                for i in range(resume - 1):
                    n = path[i]
                    if n.snapshot is not None and n.forked:
                        n.snapshot.last_access = now
                        self._push_snap(n)

    def lookup(self, request: object, keys: Sequence[Hashable], prompt_pages: int | None = None) -> int:
        """A lease opens for ``keys`` (its whole prompt pages the cache may resume over):
        returns the pages the ghost would resume from, touches and pins that path.
        ``prompt_pages``: the prompt's whole pages (default ``len(keys)``): what the
        request publishes at its decode's end past them is the decode's."""
        self._prompt[request] = prompt = len(keys) if prompt_pages is None else prompt_pages
        path, resume = self._walk(keys)
        if not self.stateless and resume < len(path) < prompt:
            self._fork[request] = len(path)   # MatchResult.branch_tokens, of this ghost's tree
        self._touch(path, resume, hit=True)
        held = self._held.setdefault(request, [])
        for i in range(resume):
            path[i].pins += 1
            held.append(path[i])
        if resume and path[resume - 1].snapshot is not None:
            self._hold_snapshot(request, 0, path[resume - 1])
        return resume

    def _hold_snapshot(self, request: object, slot: int, node: GhostNode | None,
                       released: list[GhostNode] | None = None) -> None:
        """A running request holds the snapshot of ``node`` in ``slot`` (0: the one it
        resumed from, 1: the newest it published), as a lease pins them; the one held there
        until now is let go, or added to ``released`` for the caller to let go."""
        slots = self._snap_held.setdefault(request, [None, None])
        old = slots[slot]
        if old is node:
            return
        if old is not None:
            if released is None:
                old.spins -= 1
            else:
                released.append(old)
        if node is not None:
            node.spins += 1
        slots[slot] = node

    def expect(self, keys: Sequence[Hashable]) -> None:
        """A queued request's resume path counts as used now (nothing pinned)."""
        path, resume = self._walk(keys)
        if resume:
            self._touch(path, resume, hit=False)

    def publish(self, request: object, keys: Sequence[Hashable], why: str, snapshot: bool = True) -> None:
        """A request published ``keys`` (root first) at a boundary of kind ``why`` (a
        ``Boundary`` value; ``finish``: the pages past the prompt are a decode's) and, with
        ``snapshot``, offered a snapshot at their end."""
        decode_from = self._prompt.get(request, 0) if why == "finish" else len(keys)
        nodes = self.nodes
        held = self._held.setdefault(request, [])
        # held nodes go root first along the request's path (held[d - 1] is the node d pages
        # deep), so a node is the request's already when it sits at its depth in that list
        self.clock += 1
        now = self.clock
        parent = self.root
        for depth, key in enumerate(keys, 1):
            node = nodes.get(key)
            if node is None:
                node = nodes[key] = GhostNode(key, parent, depth, now)
                had = len(parent.children)
                parent.children[key] = node
                self.used += 1
                node.pins = 1
                held.append(node)
                if had == 0:
                    parent.gen = 0          # no longer a leaf
                if depth > decode_from:
                    node.decoded = True
                else:
                    self._branch(parent, 1)
                if parent.snapshot is not None:
                    self._push_snap(parent)
                self._push_page(node)
            else:
                if depth > len(held) or held[depth - 1] is not node:
                    # already cached past the request's resume point (e.g. a chain whose
                    # snapshot went), or off the path it holds: the request now holds and
                    # uses it, as a lease does
                    node.pins += 1
                    held.append(node)
                    node.last_access = now
                    if not node.children:
                        self._push_page(node)
                if node.decoded and depth <= decode_from:
                    self._taken(node)             # a prompt went on through a decode's pages
            parent = node
        fork = self._fork.get(request)
        if fork is not None and len(keys) >= fork:
            # The engine leaves a snapshot where the prompt leaves the cached history
            # (Boundary.BRANCH), at the fork *its* tree shows. A ghost takes the fork its
            # own tree shows: offered only the real tree's, a ghost of LRU fed a cache
            # following another order lost the snapshots of hot shared prefixes (a task
            # prompt, a RAG instruction) the real cache and the other ghosts kept.
            del self._fork[request]
            if nodes[keys[fork - 1]].snapshot is None:
                self._attach(nodes[keys[fork - 1]], "branch")
        # The engine allocated these pages while the request held the snapshots it resumed
        # from and published last, so their room is made with those held (let go first, a
        # reasoning turn's prompt end was the victim of its own finish: docs/policy.md).
        released: list[GhostNode] = []
        slots = self._snap_held.get(request)
        if slots is not None and slots[0] is not None and len(keys) > slots[0].depth:
            self._hold_snapshot(request, 0, None, released)   # published past its resume point: read
        if snapshot and keys:
            self._attach(parent, why)
            self._hold_snapshot(request, 1, parent, released)
        if self.used > self.capacity:
            self._evict()
        for node in released:
            node.spins -= 1
        if released and self.used > self.capacity:
            self._evict()   # nothing else could go: what was held goes now, as it would have

    def release(self, request: object) -> None:
        """The request ended: its pins go."""
        for node in self._held.pop(request, ()):
            node.pins -= 1
        for held in self._snap_held.pop(request, ()):
            if held is not None:
                held.spins -= 1
        self._prompt.pop(request, None)
        self._fork.pop(request, None)

    # -- eviction ----------------------------------------------------------------------------
    def _evict(self) -> None:
        held_p: list[tuple] = []
        held_s: list[tuple] = []
        try:
            while self.used > self.capacity:
                p = heap_top(self._pages, False, held_p)
                s = heap_top(self._snaps, True, held_s)
                if p is None and s is None:
                    return
                if p is not None and (s is None or p[0] <= s[0]):
                    heapq.heappop(self._pages)
                    self._remove_leaf(p[2])
                elif s is not None:
                    heapq.heappop(self._snaps)
                    self._detach(s[2])
        finally:
            for e in held_p:
                heapq.heappush(self._pages, e)
            for e in held_s:
                heapq.heappush(self._snaps, e)
            if len(self._pages) + len(self._snaps) > 4 * len(self.nodes) + 64:
                self._pages, self._snaps = live_heap(self._pages, False), live_heap(self._snaps, True)

    def check(self) -> None:
        """Recount what the ghost holds (tests)."""
        pages = len(self.nodes)
        snaps = sum(1 for n in self.nodes.values() if n.snapshot is not None)
        assert abs(self.used - (pages + snaps * self.snapshot_units)) < 1e-6, (self.used, pages, snaps)
        check_trie(self.root, self.nodes)
