"""Placement and eviction decisions: the one replaceable part of the cache.

Every *decision* about where copies go and what goes first is asked of one object, a
:class:`PlacementPolicy`; the cache's parts only carry the decisions out. Today's policy,
:class:`ConfiguredPolicy`, is the write policy, host tier, eviction strategy and snapshot
retention of the config::

    question                                   write_through  ..._selective     write_back
    back up pages a publish added?             all new nodes  -                 -
    back up a kept snapshot at publish?        yes            -                 -
    back up a hit's pages (and its snapshot)?  -              after N hits      -
    back up a device victim with no host copy? -              -                 yes
    host tier                                  inclusive | exclusive (write_back only)
    victim order                               strategy (lru | lfu | value), dead tails first
    refresh a branch point's snapshot a        value: yes; lru / lfu: no
    request passes on its way deeper?
    keep an offered snapshot?                  retention (None | 0 | every N tokens)
    demote a write_back victim to the host?    eviction 'value': only what can still serve
                                               a hit; lru / lfu: every victim

A value-aware policy (issue 14) implements the same protocol.
"""

from __future__ import annotations

from typing import Protocol, Sequence

import numpy as np

from hicache.config import HiCacheConfig, TreeConfig
from hicache.tree import (DepthTuner, EvictionStrategy, RetentionPolicy, Snapshot, TreeNode, Value, get_strategy,
                          page_keys)


class PlacementPolicy(Protocol):
    """What a cache asks before it copies, keeps or evicts anything."""

    strategy: EvictionStrategy     # victim order in every tier (pages and snapshots)
    retention: RetentionPolicy     # which offered snapshots are kept
    exclusive_host: bool           # a page loaded back to the device leaves the host
    write_back: bool               # a device victim without a host copy is backed up first

    def backup_on_publish(self, new_nodes: Sequence[TreeNode]) -> list[TreeNode]:
        """Which nodes a publish just added (or gave device pages) to back up now."""
        ...

    def backup_snapshot_on_publish(self, node: TreeNode, snap: Snapshot) -> bool:
        """Back up a snapshot a publish kept (not provisional)?"""
        ...

    def backup_on_hit(self, chain: Sequence[TreeNode], resume: Snapshot | None) -> tuple[list[TreeNode], bool]:
        """A request borrows ``chain``: which of its nodes (and its resume snapshot?) to back up."""
        ...

    def worth_demoting(self, node: TreeNode) -> bool:
        """write_back: back up this device victim before it leaves the device (else drop it)?"""
        ...

    def passed_snapshots(self, chain: Sequence[TreeNode]) -> list[Snapshot]:
        """A request borrows ``chain`` (root first, its resume node last): which snapshots
        above the resume node count as used now (their access time is refreshed)?"""
        ...

    def worth_demoting_snapshot(self, node: TreeNode, snap: Snapshot) -> bool:
        """write_back: back up this device snapshot victim (else drop it)?"""
        ...

    def observe_request(self, tokens: np.ndarray, pages: int, clock: int) -> bool:
        """A request was admitted for the first ``pages`` whole pages of ``tokens``, at
        tree clock ``clock``; True when the strategy's priorities changed (the caller
        reorders)."""
        ...

    def tuning(self) -> dict[str, float]:
        """What the policy learned online (for stats)."""
        ...


class ConfiguredPolicy:
    """The policy the config names: write policy, host tier, eviction, retention."""

    def __init__(self, config: HiCacheConfig, page_tokens: int, *, needs_snapshots: bool = True,
                 ghost_units: tuple[float, float] | None = None):
        write = config.write
        self.strategy: EvictionStrategy = get_strategy(config.tree.eviction)
        self.retention = RetentionPolicy(config.tree.retention_interval, page_tokens)
        self.exclusive_host = write.host_tier == "exclusive"
        self.write_back = write.write_policy == "write_back"
        self._through = write.write_policy == "write_through"
        self._selective = write.write_policy == "write_through_selective"
        self._threshold = write.write_through_threshold
        self._by_value = isinstance(self.strategy, Value)
        self._needs_snapshots = needs_snapshots   # hybrid layouts: a resume point needs a snapshot
        self._depth = _DepthWeight(config.tree, ghost_units, page_tokens) \
            if self._by_value and needs_snapshots and ghost_units is not None else None

    def backup_on_publish(self, new_nodes: Sequence[TreeNode]) -> list[TreeNode]:
        return list(new_nodes) if self._through else []

    def backup_snapshot_on_publish(self, node: TreeNode, snap: Snapshot) -> bool:
        return self._through

    def backup_on_hit(self, chain: Sequence[TreeNode], resume: Snapshot | None) -> tuple[list[TreeNode], bool]:
        if not self._selective or not chain:
            return [], False
        nodes = [n for n in chain if n.hit_count >= self._threshold]
        return nodes, resume is not None and chain[-1].hit_count >= self._threshold

    def worth_demoting(self, node: TreeNode) -> bool:
        # A dead tail (no child, no snapshot at its end) can never be resumed: on the host
        # it would only take the place of pages that can.
        if not (self._by_value and self._needs_snapshots):
            return True
        snap = node.snapshot
        return bool(node.children) or (snap is not None and not snap.empty)

    def passed_snapshots(self, chain: Sequence[TreeNode]) -> list[Snapshot]:
        # A branch point's snapshot (a node where requests diverged, even if its other
        # branches have gone since: TreeNode.forked) is what every sibling of the request's
        # path, and every new one, resumes from, but a request that resumes deeper never
        # touches it: by access time alone it aged while its prefix was in constant use,
        # and went before the leaves below it (agentic traces: +0.2 to +1.0 points at the
        # two tightest budgets). Under lru / lfu access means resuming there, as before.
        if not self._by_value:
            return []
        return [n.snapshot for n in chain[:-1] if n.snapshot is not None and n.forked]

    def worth_demoting_snapshot(self, node: TreeNode, snap: Snapshot) -> bool:
        # An intermediate snapshot (a deeper one on its only path) is what the value order
        # gives up first on the device; it would be the host's first victim too.
        return not (self._by_value and Value.intermediate(node))

    def observe_request(self, tokens: np.ndarray, pages: int, clock: int) -> bool:
        if self._depth is None:
            return False
        ticks = self._depth.observe(tokens, pages, clock)
        if ticks is None:
            return False
        assert isinstance(self.strategy, Value)
        self.strategy.depth_weight = ticks
        return True

    def tuning(self) -> dict[str, float]:
        if self._depth is None:
            return {}
        return {"depth_weight": self._depth.weight, "depth_weight_switches": self._depth.switches}


class _DepthWeight:
    """The value order's depth weight: chosen among ``depth_weights`` by ghost caches
    (:class:`hicache.tree.ghost.DepthTuner`; one weight: fixed, no ghosts), in requests,
    and handed to the strategy in ticks of the tree's clock.

    The exchange rate (ticks per request) is measured, not assumed: a request takes one
    tick per touch, insert and publish, and one per ``expect()`` while it waits in an
    engine's queue, so it depends on chunking, snapshots and queueing. It is
    re-measured when the weight changes and at every power-of-two request count, so a
    fixed weight re-scales O(log requests) times.
    """

    def __init__(self, tree: TreeConfig, ghost_units: tuple[float, float], page_tokens: int):
        weights = tree.depth_weights
        self._page_tokens = page_tokens
        self._tuner = DepthTuner(*ghost_units, weights, tree.depth_window) if len(weights) > 1 else None
        self.weight = min(weights)
        self.switches = 0
        self._requests = 0

    def observe(self, tokens: np.ndarray, pages: int, clock: int) -> float | None:
        """Count a request; the new weight in ticks when the strategy must change."""
        self._requests += 1
        n = self._requests
        changed = self._tuner is not None and self._tuner.observe(page_keys(tokens, self._page_tokens, pages))
        if changed:
            assert self._tuner is not None
            self.weight = self._tuner.weight
            self.switches += 1
        if not self.weight or not (changed or n & (n - 1) == 0):
            return 0.0 if changed else None
        return self.weight * clock / n
