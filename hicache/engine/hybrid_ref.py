"""A reference for hybrid models: kvcache-simulator's LRU, counted at snapshot boundaries.

kvcache-simulator models an attention-only prefix cache: a request hits every leading block
still cached, so a conversation whose newest blocks were evicted still hits its older ones.
A hybrid model (DeepSeek-V4's sliding-window and compressor state) can resume only at a
boundary whose state snapshot is cached, so the same cache contents serve fewer tokens.
This module replays a simulator trace through the simulator's own LRU -- the same trie of
blocks (a block is its whole prefix), the same touches (the hit prefix), the same insertion
(one least recently used unprotected leaf evicted per new block; a request stops inserting
when none is left), the same measurement (hit tokens / hashed tokens over the last half of
the requests, no figure when the cache was not full before that half) -- and counts each
request's hit twice::

    block LRU    the leading blocks still cached, a partial last block's tokens included
                 (= kvcache-simulator's LRU)
    hybrid LRU   the same, cut back to the deepest whole-block boundary with a snapshot;
                 snapshots (free, one goes when the block it ends goes) sit where
                 hicache's engine offers one: the end of every earlier request's whole
                 blocks, the point where a request left a cached path (the fork,
                 ``Boundary.BRANCH``), and with ``chunk_blocks`` every prefill chunk end
                 (each ``chunk_blocks`` blocks past the resume point)

The cache contents are the same for both, so the difference is what the resume rule alone
costs an LRU cache at that capacity. It is a reference, not a bound: its order is the
simulator's pure LRU, which keeps dead tails (blocks past the last snapshot) as long as any
other block, where hicache evicts them first. ``hicache sweep`` reports it beside the
simulator's figures (``ref_hybrid_lru``, with the engine's chunk size); ``hicache ref`` runs
it alone.
"""

from __future__ import annotations

import heapq
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

from hicache.engine.workloads import ParsedTrace, parse_trace
from hicache.units import check_int


@dataclass(frozen=True)
class RefPoint:
    """Last-half hit rates of both counts at one capacity; None when the cache was not full
    before the measured half (the simulator's ``underfilled``)."""

    capacity_blocks: int
    block_lru: float | None
    hybrid_lru: float | None


@dataclass(frozen=True)
class TracePlan:
    """The trace as a trie: per request, its blocks' node ids and token counts."""

    requests: tuple[tuple[tuple[int, ...], tuple[int, ...]], ...]   # (nodes, lengths)
    parent: tuple[int, ...]                                          # node -> parent (0: root)
    block_size: int


def plan_trace(trace: ParsedTrace) -> TracePlan:
    """Intern each request's blocks into trie nodes, as the simulator's execution plan does."""
    edges: dict[tuple[int, str], int] = {}
    parent = [0]
    requests = []
    for line in trace.lines:
        node, nodes = 0, []
        for key in line.keys:
            nxt = edges.get((node, key))
            if nxt is None:
                nxt = edges[(node, key)] = len(parent)
                parent.append(node)
            nodes.append(nxt)
            node = nxt
        requests.append((tuple(nodes), line.lengths))
    return TracePlan(tuple(requests), tuple(parent), trace.block_size)


def hit_rates(plan: TracePlan, capacity_blocks: int, *, chunk_blocks: int = 0) -> tuple[float | None, float | None]:
    """(block LRU, hybrid LRU) last-half hit rates at ``capacity_blocks`` (module docstring)."""
    check_int("capacity_blocks", capacity_blocks, minimum=1, reason="must be a positive integer")
    check_int("chunk_blocks", chunk_blocks, minimum=0, reason="must be 0 (no chunk snapshots) or a block count")
    parent, bs = plan.parent, plan.block_size
    present = bytearray(len(parent))
    present[0] = 1
    children = [0] * len(parent)
    key = [0] * len(parent)           # access clock of each cached node
    heap: list[tuple[int, int]] = []  # (key, node): leaves, lazily deleted
    snapshots: set[int] = set()       # nodes whose end has a snapshot
    size = clock = 0
    warmup = len(plan.requests) // 2
    full = False
    hit = hyb = total = 0

    def touch(node: int) -> None:
        nonlocal clock
        clock += 1
        key[node] = clock
        if not children[node]:
            heapq.heappush(heap, (clock, node))

    def evict(protected: set[int]) -> bool:
        nonlocal size
        held = []
        try:
            while heap:
                k, node = heapq.heappop(heap)
                if not present[node] or children[node] or key[node] != k:
                    continue                   # stale entry
                if node in protected:
                    held.append((k, node))
                    continue
                present[node] = 0
                size -= 1
                snapshots.discard(node)
                p = parent[node]
                children[p] -= 1
                if p and present[p] and not children[p]:
                    heapq.heappush(heap, (key[p], p))
                return True
            return False
        finally:
            for entry in held:
                heapq.heappush(heap, entry)

    for i, (nodes, lengths) in enumerate(plan.requests):
        if i >= warmup and not full:
            return None, None
        k = 0
        while k < len(nodes) and present[nodes[k]]:
            k += 1
        whole = 0
        while whole < len(lengths) and lengths[whole] == bs:
            whole += 1
        fork = resume = min(k, whole)
        while resume and nodes[resume - 1] not in snapshots:
            resume -= 1
        if i >= warmup:
            total += sum(lengths)
            hit += sum(lengths[:k])
            hyb += sum(lengths[:resume])
        for node in nodes[:k]:
            touch(node)
        protected = set(nodes[:k])
        for node in nodes[k:]:
            if size >= capacity_blocks and not evict(protected):
                break
            if size >= capacity_blocks or not present[parent[node]]:
                break
            present[node] = 1
            size += 1
            children[parent[node]] += 1
            touch(node)
            if size >= capacity_blocks and i < warmup:
                full = True
        ends = list(range(resume + chunk_blocks, whole, chunk_blocks)) if chunk_blocks else []
        ends.append(whole)
        if 0 < fork < whole:
            ends.append(fork)
        snapshots.update(nodes[q - 1] for q in ends if q and present[nodes[q - 1]])
    if not full or not total:
        return None, None
    return hit / total, hyb / total


def reference(path: str | Path, capacities_blocks: Sequence[int], *, chunk_blocks: int = 0,
              block_size: int | None = None) -> list[RefPoint]:
    """Both counts at each capacity, on the trace at ``path`` read as kvcache-simulator reads
    it (:func:`hicache.engine.workloads.trace_parse.parse_trace`; ConfigError where it
    refuses the trace); ``block_size`` the fallback for lines without one."""
    plan = plan_trace(parse_trace(path, block_size=block_size))
    return [RefPoint(c, *hit_rates(plan, c, chunk_blocks=chunk_blocks)) for c in capacities_blocks]
