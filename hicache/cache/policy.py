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
from hicache.tree import (ROOT_HASH, EvictionStrategy, PolicySelector, Ranked, RetentionPolicy, Snapshot, TreeNode,
                          get_strategy, page_keys)


class PlacementPolicy(Protocol):
    """What a cache asks before it copies, keeps or evicts anything."""

    retention: RetentionPolicy     # which offered snapshots are kept
    exclusive_host: bool           # a page loaded back to the device leaves the host
    write_back: bool               # a device victim without a host copy is backed up first

    @property
    def strategy(self) -> EvictionStrategy:
        """The victim order in every tier (pages and snapshots), as of now."""
        ...

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

    def observe_lookup(self, request: int, tokens: np.ndarray, pages: int, root: bytes = ROOT_HASH) -> bool:
        """A lease (``request``) opened for the first ``pages`` whole pages of ``tokens``
        under the tenant root ``root``; True when the victim order changed (the caller
        rebuilds it)."""
        ...

    def observe_publish(self, request: int, tokens: np.ndarray, pages: int, why: str, snapshot: bool,
                        root: bytes = ROOT_HASH) -> None:
        """The lease published its first ``pages`` pages of ``tokens`` at a boundary of kind
        ``why`` (a ``Boundary`` value) and, with ``snapshot``, a snapshot at their end."""
        ...

    def observe_expect(self, tokens: np.ndarray, pages: int, root: bytes = ROOT_HASH) -> None:
        """A queued request's resume path was kept warm (:meth:`HiCache.expect`)."""
        ...

    def observe_release(self, request: int) -> None:
        """The lease ended."""
        ...

    def tuning(self) -> dict[str, float | str]:
        """What the policy learned online (for stats)."""
        ...


def _first_class(strategy: EvictionStrategy, node: TreeNode, snap: Snapshot) -> bool:
    """Does ``strategy`` give up this snapshot before any page run (not worth a host copy)?"""
    return isinstance(strategy, Ranked) and strategy.first_class(node, snap)


class ConfiguredPolicy:
    """The policy the config names: write policy, host tier, eviction, retention.

    ``eviction: adaptive`` follows one of ``adaptive_candidates`` at a time, chosen online by
    a :class:`~hicache.tree.PolicySelector` whose ghosts the ``observe_*`` calls feed; the
    fixed orders (``lru``, ``lfu``, ``value``, or one candidate by name) run no ghosts.
    """

    def __init__(self, config: HiCacheConfig, page_tokens: int, *, needs_snapshots: bool = True,
                 ghost_units: tuple[float, float] | None = None):
        write = config.write
        tree = config.tree
        self.retention = RetentionPolicy(tree.retention_interval, page_tokens)
        self.exclusive_host = write.host_tier == "exclusive"
        self.write_back = write.write_policy == "write_back"
        self._through = write.write_policy == "write_through"
        self._selective = write.write_policy == "write_through_selective"
        self._threshold = write.write_through_threshold
        self._needs_snapshots = needs_snapshots   # hybrid layouts: a resume point needs a snapshot
        self._page_tokens = page_tokens
        self._selector: PolicySelector | None = None
        stateless = not needs_snapshots
        self._fixed: EvictionStrategy = get_strategy(tree.eviction if tree.eviction != "adaptive" else "lru",
                                                     stateless=stateless)
        names = _distinct_candidates(tree.adaptive_candidates, needs_snapshots)
        if tree.eviction == "adaptive" and len(names) > 1:
            units = ghost_units if ghost_units is not None else (0.0, 0.0)
            self._selector = PolicySelector([get_strategy(c, stateless=stateless) for c in names],
                                            units[0], units[1], stateless=stateless, window=tree.adaptive_window,
                                            margin=tree.adaptive_margin, margin_hits=tree.adaptive_margin_hits,
                                            floor="lru" if tree.adaptive_floor and "lru" in names else None,
                                            record_windows=tree.adaptive_record, z=tree.adaptive_z,
                                            trial=tree.adaptive_trial,
                                            tails=get_strategy("lru-tails", stateless=stateless),
                                            dead_outputs=tree.adaptive_dead_outputs)
        elif tree.eviction == "adaptive":
            self._fixed = get_strategy(names[0], stateless=stateless)
        self._keys = _PageKeys(page_tokens)

    @property
    def strategy(self) -> EvictionStrategy:
        """The victim order followed now (adaptive: the selector's choice)."""
        return self._selector.strategy if self._selector is not None else self._fixed

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
        # it would only take the place of pages that can. lru and lfu keep their old rule
        # (every victim goes down), so they stay what they were for comparison -- and so
        # adaptive, while it follows one of them, is that policy exactly: its floor is
        # `--eviction lru` itself, not LRU's order with another policy's demotion rule.
        if not self._needs_snapshots or self._plain():
            return True
        snap = node.snapshot
        return bool(node.children) or (snap is not None and not snap.empty)

    def _plain(self) -> bool:
        """The order followed now is lru / lfu (fixed, or adaptive's choice): every
        write_back victim is demoted, as under ``--eviction lru``."""
        return not isinstance(self.strategy, Ranked)

    def passed_snapshots(self, chain: Sequence[TreeNode]) -> list[Snapshot]:
        # A branch point's snapshot (a node where requests diverged, even if its other
        # branches have gone since: TreeNode.forked) is what every sibling of the request's
        # path, and every new one, resumes from, but a request that resumes deeper never
        # touches it: by access time alone it aged while its prefix was in constant use.
        # Orders that rank branch points last count a passing request as a use.
        if not getattr(self.strategy, "refresh_forks", False):
            return []
        return [n.snapshot for n in chain[:-1] if n.snapshot is not None and n.forked]

    def worth_demoting_snapshot(self, node: TreeNode, snap: Snapshot) -> bool:
        # What the order gives up first on the device would be the host's first victim too.
        return not _first_class(self.strategy, node, snap)

    # -- the ghosts' events ------------------------------------------------------------------
    def observe_lookup(self, request: int, tokens: np.ndarray, pages: int, root: bytes = ROOT_HASH) -> bool:
        if self._selector is None:
            return False
        return self._selector.lookup(request, self._keys.of(tokens, pages, root), len(tokens) // self._page_tokens)

    def observe_publish(self, request: int, tokens: np.ndarray, pages: int, why: str, snapshot: bool,
                        root: bytes = ROOT_HASH) -> None:
        if self._selector is not None:
            self._selector.publish(request, self._keys.of(tokens, pages, root), why, snapshot)

    def observe_expect(self, tokens: np.ndarray, pages: int, root: bytes = ROOT_HASH) -> None:
        if self._selector is not None:
            self._selector.expect(self._keys.of(tokens, pages, root))

    def observe_release(self, request: int) -> None:
        if self._selector is not None:
            self._selector.release(request)

    def tuning(self) -> dict[str, float | str]:
        if self._selector is None:
            return {"policy_followed": self.strategy.name}
        st = self._selector.stats()
        out: dict[str, float | str] = {"policy_followed": st.followed, "policy_switches": st.switches,
                                       "policy_trials": st.trials,
                                       "policy_regret_pages": st.regret_pages,
                                       "policy_looked_up_pages": st.looked_up_pages,
                                       "policy_followed_ghost_hit_pages": st.followed_hit_pages}
        for name, hits in st.ghost_hit_pages.items():
            out[f"ghost_hit_pages:{name}"] = hits
        return out


def _distinct_candidates(names: Sequence[str], needs_snapshots: bool) -> list[str]:
    """The candidates that can rank differently: without state (MHA, MLA) there are no
    snapshots, so the snapshot rules are moot and ``value`` and ``reuse`` rank as plain LRU;
    ``lfu`` and ``probation`` rank pages by their hits, and ``reuse-prompt`` /
    ``reuse-prompt-late`` (alike there) a decode's idle pages first, so those stay."""
    if needs_snapshots:
        return list(names)
    out: list[str] = []
    for name in names:
        if name == "reuse-prompt-late":
            name = "reuse-prompt"
        elif name not in ("lfu", "probation", "reuse-prompt"):
            name = "lru"
        if name not in out:
            out.append(name)
    return out


class _PageKeys:
    """Ghost keys of a token array's whole pages, computed once per array and extended as it
    is published further (a lease publishes the same prompt + output array several times;
    the engine expects the same queued prompt every step). Keeps the arrays used last (a
    warm round of a long queue passes many more arrays than the head that comes back)."""

    _KEEP = 1024

    def __init__(self, page_tokens: int):
        self._P = page_tokens
        self._seen: dict[tuple[int, int], tuple[np.ndarray, list[int]]] = {}

    def of(self, tokens: np.ndarray, pages: int, root: bytes = ROOT_HASH) -> list[int]:
        first = int.from_bytes(root[:8], "little")   # 0 for the shared root: the keys of old
        at = (id(tokens), first)
        hit = self._seen.pop(at, None)
        if hit is not None and hit[0] is tokens and len(hit[1]) >= pages:
            self._seen[at] = hit   # the most recent again: the least recent goes first
            return hit[1][:pages]
        keys = page_keys(tokens, self._P, max(pages, len(tokens) // self._P), first)
        if len(self._seen) >= self._KEEP:
            self._seen.pop(next(iter(self._seen)))
        self._seen[at] = (tokens, keys)
        return keys[:pages]
