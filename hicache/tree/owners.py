"""Which tree object holds a given pool id: the index compaction reads in a shared arena.

Compaction in a shared arena (:mod:`hicache.cache.room`) moves a region's frontier objects
into its lowest holes and must find each moved id's one owner -- a node's page run (and
the page's position in it) or a snapshot's row -- to rewrite it. A scan of the tree per
compaction pass cost O(nodes) each time, most of a production-size replay at a large host
budget (83 of 224 s on a 1,500-request slice at 14 GiB). This index answers in O(1).

It is kept *lazily exact*: every assignment that gives an object an id records it here
(``TreeNode.__setattr__`` for ``device_ids`` / ``host_ids``, the tree's ``add_child`` and
``split`` which set ids without it, and a snapshot's attach and row changes through the
watch), and nothing is recorded when an id is let go. A lookup then checks that the
recorded owner is still in the tree and still holds the id; an entry that fails is an id
nobody in the tree holds (freed, or held by a lease or an in-flight copy). This is right
because an id has at most one holder at a time and every holder was recorded when it got
the id, so the *last* record of an id names its holder if it has one. ``check`` asserts
the recording half: every id a node or snapshot holds maps back to it.

Built on first use (:meth:`RadixTree.owner_index`), like an eviction order: trees whose
pools are split never pay for it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Iterable

import numpy as np

if TYPE_CHECKING:
    from hicache.tree.node import Snapshot, TreeNode
    from hicache.tree.watch import TreeWatch

TIERS = ("device", "host")


class OwnerIndex:
    """id -> its holder, per tier, for pages (node) and snapshot rows (snapshot)."""

    def __init__(self, watch: "TreeWatch", nodes: Iterable["TreeNode"]):
        self._watch = watch
        self._pages: dict[str, dict[int, "TreeNode"]] = {t: {} for t in TIERS}
        self._rows: dict[str, dict[int, "Snapshot"]] = {t: {} for t in TIERS}
        for n in nodes:
            self.node_ids(n)
            if n.snapshot is not None:
                self.snapshot_rows(n.snapshot)

    # -- recording (every id an object is given) ------------------------------------------------
    def node_ids(self, node: "TreeNode", tier: str | None = None) -> None:
        """``node`` was given its current ids on ``tier`` (both tiers when None)."""
        for t in (TIERS if tier is None else (tier,)):
            ids = node.device_ids if t == "device" else node.host_ids
            if ids is not None and len(ids):
                self._pages[t].update(dict.fromkeys(np.asarray(ids).tolist(), node))

    def snapshot_rows(self, snap: "Snapshot") -> None:
        """``snap`` was attached or given a row."""
        for t, row in (("device", snap.device_id), ("host", snap.host_id)):
            if row is not None:
                self._rows[t][row] = snap

    # -- lookups --------------------------------------------------------------------------------
    def page(self, tier: str, i: int) -> tuple["TreeNode", int] | None:
        """The tree node holding page id ``i`` of ``tier`` and the page's position in it."""
        node = self._pages[tier].get(i)
        if node is None or node._watch is not self._watch:
            return None   # never recorded, or its last holder left the tree
        ids = node.device_ids if tier == "device" else node.host_ids
        if ids is None:
            return None
        at = np.flatnonzero(np.asarray(ids) == i)
        return (node, int(at[0])) if len(at) else None

    def snapshot(self, tier: str, row: int) -> "Snapshot | None":
        """The attached snapshot holding state row ``row`` of ``tier``."""
        s = self._rows[tier].get(row)
        if s is None:
            return None
        node = s._node
        if node is None or node._watch is not self._watch or node.snapshot is not s:
            return None
        return s if (s.device_id if tier == "device" else s.host_id) == row else None

    def check(self, nodes: list["TreeNode"]) -> None:
        """Assert every id a node or snapshot of the tree holds maps back to it."""
        for n in nodes:
            for t in TIERS:
                ids = n.device_ids if t == "device" else n.host_ids
                if ids is not None:
                    for i in np.asarray(ids).tolist():
                        got = self.page(t, i)
                        assert got is not None and got[0] is n, f"{t} page {i} of {n} is indexed to {got}"
            s = n.snapshot
            if s is not None:
                for t, row in (("device", s.device_id), ("host", s.host_id)):
                    if row is not None:
                        assert self.snapshot(t, row) is s, f"{t} row {row} of {n}'s snapshot is not indexed"
