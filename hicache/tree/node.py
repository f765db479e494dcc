"""Tree nodes and chained page hashes.

A node holds a run of whole pages (``len(tokens) == num_pages * page_tokens``) and where
those pages live::

    node.tokens      [t0 ........................ t(k*P - 1)]   k pages of P tokens
    node.hashes      [h0,      h1,      ...,      h(k-1)]         chained page hashes
    node.device_ids  [d0,      d1,      ...,      d(k-1)] or None  (all or none)
    node.host_ids    [c0,      c1,      ...,      c(k-1)] or None  (all or none)
    node.snapshot    state snapshot for the boundary at the node's END (device / host ids)

Residency is per node: a node is on the device, on the host, or both. A node whose device
pages were evicted but whose host copy remains is a *shadow* node; it still matches.

Page hashes are chained: ``h_i = SHA-256(seed | h_{i-1} | tokens of page i as int32 LE)``,
so equal hashes mean equal prefixes, and every process computes the same value (no
``hash()``). The hash of a page is the same whether it was published mid-flight or at finish.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from typing import Iterator

import numpy as np

HASH_BYTES = 32
ROOT_HASH = b"\x00" * HASH_BYTES


def page_hash(seed: bytes, parent: bytes, page_tokens: np.ndarray) -> bytes:
    """The chained hash of one page given its parent's hash."""
    h = hashlib.sha256(seed)
    h.update(parent)
    h.update(np.ascontiguousarray(page_tokens, dtype="<i4").tobytes())
    return h.digest()


def chain_hashes(seed: bytes, parent: bytes, tokens: np.ndarray, page_tokens: int) -> list[bytes]:
    """Hashes of every whole page of ``tokens``, chained from ``parent``."""
    out = []
    for start in range(0, len(tokens) - page_tokens + 1, page_tokens):
        parent = page_hash(seed, parent, tokens[start: start + page_tokens])
        out.append(parent)
    return out


@dataclass(eq=False)
class Snapshot:
    """A state snapshot for the boundary at the end of a node, per tier.

    ``lock`` counts running requests that need it (the one they resume from, the newest
    one they published); locked snapshots are never evicted. ``provisional`` marks a
    snapshot kept only until its request offers a newer one (retention, see retention.py).
    """

    device_id: int | None = None
    host_id: int | None = None
    lock: int = 0
    provisional_owner: int | None = None
    backup_pending: bool = False
    put_pending: bool = False   # an L3 put is reading the host copy
    last_access: float = 0.0

    @property
    def empty(self) -> bool:
        return self.device_id is None and self.host_id is None


@dataclass(eq=False)
class TreeNode:
    """One radix-tree node: a run of pages with their residency and bookkeeping."""

    tokens: np.ndarray
    hashes: list[bytes]
    parent: "TreeNode | None"
    device_ids: np.ndarray | None = None
    host_ids: np.ndarray | None = None
    children: dict[bytes, "TreeNode"] = field(default_factory=dict)
    lock_device: int = 0     # running requests whose prefix covers this node
    lock_host: int = 0       # in-flight loads reading the host copy
    backup_pending: int = 0  # in-flight D2H copies reading the device copy
    load_ticket: object | None = None  # the in-flight H2D copy filling the device copy
    l3_put: object | None = None       # the in-flight L3 put reading the host copy
    l3_stored: bool = False            # the host copy was written to L3 (or came from it)
    from_l3: bool = False              # host copy fetched from L3 and not loaded since
    last_access: float = 0.0
    hit_count: int = 0
    snapshot: Snapshot | None = None
    node_id: int = 0

    @property
    def num_pages(self) -> int:
        return len(self.hashes)

    @property
    def is_root(self) -> bool:
        return self.parent is None

    @property
    def on_device(self) -> bool:
        return self.device_ids is not None

    @property
    def on_host(self) -> bool:
        return self.host_ids is not None

    @property
    def is_shadow(self) -> bool:
        return self.device_ids is None and self.host_ids is not None

    @property
    def last_hash(self) -> bytes:
        return self.hashes[-1] if self.hashes else ROOT_HASH

    def first_page_key(self, page_tokens: int) -> bytes:
        return self.tokens[:page_tokens].tobytes()

    def iter_ancestors(self) -> Iterator["TreeNode"]:
        """This node, then its parent, ... up to (excluding) the root."""
        node: TreeNode | None = self
        while node is not None and not node.is_root:
            yield node
            node = node.parent

    def __repr__(self) -> str:  # short: the tree prints many of them in assertion messages
        where = ("D" if self.on_device else "") + ("H" if self.on_host else "")
        return f"<node#{self.node_id} pages={self.num_pages} {where or '-'} locks={self.lock_device}>"
