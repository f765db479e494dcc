"""Tree nodes, state snapshots and chained page hashes.

A node holds a run of whole pages (``len(tokens) == num_pages * page_tokens``) and where
those pages live::

    node.tokens      [t0 ........................ t(k*P - 1)]   k pages of P tokens
    node.hashes      [h0,      h1,      ...,      h(k-1)]         chained page hashes
    node.device_ids  [d0,      d1,      ...,      d(k-1)] or None  (all or none)
    node.host_ids    [c0,      c1,      ...,      c(k-1)] or None  (all or none)
    node.snapshot    state snapshot for the boundary at the node's END (device / host ids)
    node.depth       pages from the root to the node's end (a split keeps it on the lower part)

Residency is per node: a node is on the device, on the host, or both. A node whose device
pages were evicted but whose host copy remains is a *shadow* node; it still matches.

Tokens are kept as their int32 little-endian bytes (``token_bytes``): comparing a page run
with a request is one ``memcmp`` and a child's key is a slice, with no numpy call per
node; ``tokens`` is a read-only int32 view of those bytes.

Writes are observed. The fields eviction reads (residency, locks, copies in flight, access
times, the snapshot and its flags) report every write to the node's tree, which keeps its
eviction order and evictable totals current (see :mod:`hicache.tree.watch`): whoever changes a node -- the tree
or the cache -- needs no separate notification. Other attributes are plain slots.

Page hashes are chained: ``h_i = SHA-256(seed | h_{i-1} | tokens of page i as int32 LE)``,
so equal hashes mean equal prefixes, and every process computes the same value (no
``hash()``). The hash of a page is the same whether it was published mid-flight or at finish.
"""

from __future__ import annotations

import hashlib
from typing import TYPE_CHECKING, Iterator, Protocol

import numpy as np

from hicache.errors import MisuseError

if TYPE_CHECKING:
    from hicache.tree.watch import TreeWatch

HASH_BYTES = 32
ROOT_HASH = b"\x00" * HASH_BYTES
TOKEN_BYTES = 4  # int32 little-endian
UNCOUNTED = (0, 0)  # a node's or snapshot's (device, host) share of the evictable totals: none

_set = object.__setattr__


def token_bytes(tokens: np.ndarray) -> bytes:
    """The int32 little-endian bytes of ``tokens`` (what nodes store and hashes read)."""
    return np.ascontiguousarray(tokens, dtype="<i4").tobytes()


def page_hash(seed: bytes, parent: bytes, page_tokens: np.ndarray | bytes) -> bytes:
    """The chained hash of one page given its parent's hash."""
    h = hashlib.sha256(seed)
    h.update(parent)
    h.update(page_tokens if isinstance(page_tokens, bytes) else token_bytes(page_tokens))
    return h.digest()


def tenant_root_hash(seed: bytes, salt: "str | bytes | None") -> bytes:
    """The hash a tenant's chains start from: ``ROOT_HASH`` without a salt (today's keys,
    shared by every request), else ``SHA-256(seed | "hicache-tenant" NUL | salt)``.

    Why the root: every page hash chains from its parent's, so a different root changes
    every page hash of the tenant -- its tree paths, its L3 page keys and its snapshot keys
    -- and two tenants can share no page on any tier. The tag keeps the input apart from a
    page's (``seed | parent hash | tokens``): a salt cannot be chosen to equal a page.
    """
    if not salt:
        return ROOT_HASH
    if isinstance(salt, str):
        salt = salt.encode("utf-8")
    elif not isinstance(salt, (bytes, bytearray)):
        raise MisuseError(f"salt must be a str or bytes, got {type(salt).__name__}")
    h = hashlib.sha256(seed)
    h.update(b"hicache-tenant\0")
    h.update(salt)
    return h.digest()


def chain_hashes(seed: bytes, parent: bytes, tokens: np.ndarray | bytes, page_tokens: int) -> list[bytes]:
    """Hashes of every whole page of ``tokens`` (an int32 array or its bytes), chained from ``parent``."""
    data = tokens if isinstance(tokens, bytes) else token_bytes(tokens)
    step = page_tokens * TOKEN_BYTES
    out = []
    sha = hashlib.sha256
    for start in range(0, len(data) - step + 1, step):
        h = sha(seed)
        h.update(parent)
        h.update(data[start: start + step])
        parent = h.digest()
        out.append(parent)
    return out


class LoadTicket(Protocol):
    """What the tree holds of an in-flight H2D copy (a transfer ``LoadHandle``): leases
    wait on it and read its outcome; the tree only asks whether one is set."""

    @property
    def status(self) -> str: ...

    def done(self) -> bool: ...

    def wait(self, timeout: float | None = None) -> bool: ...

    def wait_layer(self, layer_id: int, timeout: float | None = None) -> bool: ...


class Snapshot:
    """A state snapshot for the boundary at the end of a node, per tier.

    ``lock`` counts running requests that need it (the one they resume from, the newest
    one they published); locked snapshots are never evicted. ``provisional_owner`` marks a
    snapshot kept only until its request offers a newer one (retention, see retention.py).
    ``backup_pending`` / ``put_pending`` / ``loading``: a D2H backup, an L3 put or an H2D
    load is reading or filling a copy of it; such a snapshot (and its node) is not evicted.

    What it has been used for, observed (an eviction strategy may rank by it): ``kind`` is
    the boundary it was first offered at (a :class:`~hicache.tree.retention.Boundary`
    value: ``prefill``, ``prompt_end``, ``finish``, ``branch``; "" when not given);
    ``resumed`` counts requests that resumed exactly here, ``passed`` those that resumed
    deeper through its node; ``expected``: a queued request was seen to resume here
    (:meth:`HiCache.expect`), so one is about to.
    """

    __slots__ = ("device_id", "host_id", "lock", "provisional_owner", "backup_pending", "put_pending",
                 "loading", "load_ticket", "last_access", "_node", "_counted", "kind", "resumed", "passed",
                 "expected")
    kind: str
    resumed: int
    passed: int
    expected: bool
    device_id: int | None
    host_id: int | None
    lock: int
    provisional_owner: int | None
    backup_pending: bool
    put_pending: bool
    loading: bool
    load_ticket: "LoadTicket | None"
    last_access: float
    _node: "TreeNode | None"
    _counted: tuple[int, int]

    def __init__(self, device_id: int | None = None, host_id: int | None = None, lock: int = 0,
                 provisional_owner: int | None = None, backup_pending: bool = False, put_pending: bool = False,
                 loading: bool = False, last_access: float = 0.0, kind: str = ""):
        _set(self, "_node", None)  # the node it is attached to (set by ``node.snapshot = ...``)
        _set(self, "_counted", UNCOUNTED)  # what it adds to its tree's evictable totals (watch.py)
        _set(self, "device_id", device_id)
        _set(self, "host_id", host_id)
        _set(self, "lock", lock)
        _set(self, "provisional_owner", provisional_owner)
        _set(self, "backup_pending", backup_pending)
        _set(self, "put_pending", put_pending)
        _set(self, "loading", loading)
        _set(self, "load_ticket", None)  # the H2D copy filling the device copy, once submitted
        _set(self, "last_access", last_access)
        _set(self, "kind", kind)
        _set(self, "resumed", 0)
        _set(self, "passed", 0)
        _set(self, "expected", False)

    def __setattr__(self, name: str, value: object) -> None:
        _set(self, name, value)
        node = self._node
        if node is not None and name != "provisional_owner" and name != "load_ticket":
            watch = node._watch
            if watch is not None:
                watch.snapshot_changed(node, self, name)

    @property
    def empty(self) -> bool:
        return self.device_id is None and self.host_id is None

    @property
    def busy(self) -> bool:
        """A copy of it is in flight (backup, L3 put or load)."""
        return bool(self.backup_pending or self.put_pending or self.loading)

    def __repr__(self) -> str:
        return f"Snapshot(device_id={self.device_id}, host_id={self.host_id}, lock={self.lock})"


# Node fields whose writes can change eviction eligibility or order.
_WATCHED = frozenset({"device_ids", "host_ids", "lock_device", "lock_host", "backup_pending", "load_ticket",
                      "l3_put", "pins",
                      "last_access", "hit_count", "snapshot"})


class TreeNode:
    """One radix-tree node: a run of pages with their residency and bookkeeping."""

    __slots__ = ("token_bytes", "hashes", "parent", "device_ids", "host_ids", "children", "lock_device",
                 "lock_host", "backup_pending", "load_ticket", "l3_put", "pins", "l3_stored", "from_l3", "last_access",
                 "hit_count", "snapshot", "node_id", "depth", "num_pages", "_watch", "_device_children", "snapshots_below",
                 "forked", "decoded", "branches",
                 "_counted")
    token_bytes: bytes
    hashes: list[bytes]
    parent: "TreeNode | None"
    device_ids: np.ndarray | None
    host_ids: np.ndarray | None
    children: dict[bytes, "TreeNode"]
    lock_device: int
    lock_host: int
    backup_pending: int
    load_ticket: "LoadTicket | None"
    l3_put: object | None
    pins: int
    l3_stored: bool
    from_l3: bool
    last_access: float
    hit_count: int
    snapshot: Snapshot | None
    node_id: int
    depth: int
    num_pages: int
    _watch: "TreeWatch | None"
    _device_children: int
    snapshots_below: int  # snapshots attached strictly below this node (kept by the tree's watch)
    forked: bool          # requests have diverged at this node's end: it has had two branches or more
    decoded: bool         # its pages were published by a decode (Boundary.FINISH) and no request has
                          # resumed through them since: a branch no request has been seen to take
    branches: int         # children that are not ``decoded``: where requests were seen to go on
    _counted: tuple[int, int]

    # lock_device: running requests whose prefix covers this node
    # lock_host: in-flight loads reading the host copy (written by the cache's loads only)
    # backup_pending: in-flight D2H copies reading the device copy
    # load_ticket: the in-flight H2D copy filling the device copy
    # l3_put: the in-flight L3 put reading the host copy (written by the cache's L3 tier only)
    # pins: open prefetches that will hang pages below this node's end: it stays in the tree
    #       (no host eviction, no subtree removal), though its device copy may be demoted
    # l3_stored: the host copy was written to L3 (or came from it)
    # from_l3: host copy fetched from L3 and not loaded since
    # depth: pages from the root to the node's end; num_pages: pages it holds (len(hashes))

    def __init__(self, token_bytes: bytes, hashes: list[bytes], parent: "TreeNode | None", *,
                 device_ids: np.ndarray | None = None, host_ids: np.ndarray | None = None, lock_device: int = 0,
                 lock_host: int = 0, backup_pending: int = 0, load_ticket: LoadTicket | None = None,
                 l3_put: object | None = None, pins: int = 0, l3_stored: bool = False, from_l3: bool = False,
                 last_access: float = 0.0, hit_count: int = 0, node_id: int = 0, depth: int = 0):
        for name, value in (("_watch", None), ("_counted", UNCOUNTED), ("token_bytes", token_bytes), ("hashes", hashes), ("parent", parent),
                            ("device_ids", device_ids), ("host_ids", host_ids), ("children", {}),
                            ("lock_device", lock_device), ("lock_host", lock_host),
                            ("backup_pending", backup_pending), ("load_ticket", load_ticket), ("l3_put", l3_put), ("pins", pins),
                            ("l3_stored", l3_stored), ("from_l3", from_l3), ("last_access", last_access),
                            ("hit_count", hit_count), ("snapshot", None), ("node_id", node_id), ("depth", depth),
                            ("num_pages", len(hashes)), ("_device_children", 0),
                            ("snapshots_below", 0), ("forked", False), ("decoded", False), ("branches", 0)):
            _set(self, name, value)

    def __setattr__(self, name: str, value: object) -> None:
        watch = self._watch
        if watch is None or name not in _WATCHED:
            _set(self, name, value)
        elif name == "device_ids":
            was = self.device_ids is not None
            _set(self, name, value)
            watch.node_changed(self, residency=was != (value is not None))
            if watch.owners is not None:
                watch.owners.node_ids(self, "device")
        elif name == "host_ids":
            _set(self, name, value)
            watch.node_changed(self)
            if watch.owners is not None:
                watch.owners.node_ids(self, "host")
        elif name == "snapshot":
            old = self.snapshot
            if old is not None and old is not value and old._node is self:
                _set(old, "_node", None)
                watch.snapshot_detached(old, self)
            _set(self, name, value)
            if value is not None:
                assert isinstance(value, Snapshot)
                _set(value, "_node", self)
                watch.snapshot_changed(self, value, "attach")
            watch.node_changed(self)
        else:
            _set(self, name, value)
            watch.node_changed(self)

    @property
    def tokens(self) -> np.ndarray:
        """The node's tokens (a read-only int32 view of :attr:`token_bytes`)."""
        return np.frombuffer(self.token_bytes, dtype="<i4")

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
    def host_held(self) -> bool:
        """Something needs the host copy (or the node) to stay: a load or an L3 put reading
        the host rows, or an open prefetch extending the node."""
        return bool(self.lock_host or self.l3_put is not None or self.pins)

    @property
    def busy(self) -> bool:
        """A copy that eviction must not pull from under is in flight: the device copy is
        loading, or the end-boundary snapshot is being backed up, put to L3 or loaded."""
        snap = self.snapshot
        return self.load_ticket is not None or (snap is not None and snap.busy)

    @property
    def last_hash(self) -> bytes:
        return self.hashes[-1] if self.hashes else ROOT_HASH

    def first_page_key(self, page_tokens: int) -> bytes:
        return self.token_bytes[: page_tokens * TOKEN_BYTES]

    def iter_ancestors(self) -> Iterator["TreeNode"]:
        """This node, then its parent, ... up to (excluding) the root."""
        node: TreeNode | None = self
        while node is not None and node.parent is not None:
            yield node
            node = node.parent

    def __repr__(self) -> str:  # short: the tree prints many of them in assertion messages
        where = ("D" if self.device_ids is not None else "") + ("H" if self.host_ids is not None else "")
        return f"<node#{self.node_id} pages={self.num_pages} {where or '-'} locks={self.lock_device}>"


class RootNode(TreeNode):
    """The root of one tenant's tree (a salted request's): no pages, never evicted, and a
    ``last_hash`` of its own, :func:`tenant_root_hash`, so its children's hashes chain from
    it. ``lock_device`` is 1 plus the locks of running requests below it and ``pins`` the
    open prefetches at it: the tree drops an empty tenant root when neither holds it."""

    __slots__ = ("root_hash",)
    root_hash: bytes

    def __init__(self, root_hash: bytes):
        super().__init__(b"", [], None, lock_device=1)
        _set(self, "root_hash", root_hash)

    @property
    def last_hash(self) -> bytes:
        return self.root_hash

