"""The radix tree over pages: walk, resume points, split, locks, removal, eviction order.

The tree is pure bookkeeping: it records page and snapshot *ids* and never frees or copies
bytes. Every operation that gives ids up returns them so the caller (the ``HiCache``
facade) frees them in the pools. Publishing (``insert``, ``insert_host``) is in
:mod:`hicache.tree.insert`, resume points in :mod:`hicache.tree.paths`.

Cost model: a walk costs one dict lookup and one ``memcmp`` per node on the path; locks,
touches and resume scans are per node on the path; a node's ``depth`` is stored, so no
operation walks to the root to learn it. Eviction order is kept current as nodes change
(:mod:`hicache.tree.watch`), and so is what eviction could free at most (:meth:`evictable`);
no operation scans the tree except :meth:`nodes`, :meth:`snapshots` and
:meth:`check_integrity`.

Invariants (checked by :meth:`RadixTree.check_integrity`):

* every non-root node holds at least one copy of its pages (device, host or both);
* device residency is prefix-closed: a node on the device has a parent on the device (or
  the root), so the device part of any match is a prefix of it;
* a node with device pages is evicted only once no child has device pages (leaf first);
* ``len(node.tokens) == node.num_pages * page_tokens``, children are keyed by the bytes of
  their first page, ``node.depth == parent.depth + node.num_pages``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Callable, Iterator, NamedTuple

import numpy as np

from hicache.tree import insert as _insert
from hicache.tree import paths as _paths
from hicache.tree import tenants as _tenants
from hicache.tree.node import TOKEN_BYTES, Snapshot, TreeNode, chain_hashes, token_bytes
from hicache.tree.order import EvictionOrder
from hicache.tree.owners import OwnerIndex
from hicache.tree.watch import TreeWatch
from hicache.tree.paths import PathMatch

if TYPE_CHECKING:
    from hicache.tree.eviction import EvictionStrategy

_set = object.__setattr__


class Removed(NamedTuple):
    """Ids a subtree removal gave up, for the caller to free; ``nodes`` in removal order
    (children before parents), each node's ids in page order; ``snapshots`` the snapshot
    objects detached, in the same order."""

    device_pages: np.ndarray
    host_pages: np.ndarray
    device_snapshots: list[int]
    host_snapshots: list[int]
    nodes: list[TreeNode]
    snapshots: list[Snapshot]


def _ids(parts: list[np.ndarray]) -> np.ndarray:
    return np.concatenate(parts) if parts else np.zeros(0, np.int64)


@dataclass
class RadixTree:
    """A radix tree of ``page_tokens``-token pages (see module docstring)."""

    page_tokens: int
    hash_seed: bytes = b"hicache-v1"
    needs_snapshots: bool = False  # hybrid layouts: a resume point needs a state snapshot
    root: TreeNode = field(init=False)
    clock: int = field(default=0, init=False)
    _next_id: int = field(default=1, init=False)
    num_nodes: int = field(default=0, init=False)   # nodes in the tree (the root not counted)
    _shape: int = field(default=0, init=False)   # bumped by every split, add and removal
    _last_walk: tuple | None = field(default=None, init=False, repr=False)
    _roots: dict[bytes, TreeNode] = field(default_factory=dict, init=False, repr=False)  # tenants.py
    _watch: TreeWatch = field(init=False, repr=False)

    def __post_init__(self) -> None:
        self._watch = TreeWatch(self.needs_snapshots)
        self.root = TreeNode(b"", [], None, lock_device=1)  # never evicted
        _set(self.root, "_watch", self._watch)

    # -- walking ------------------------------------------------------------------------
    def tick(self) -> int:
        """Advance the logical clock; access times are ticks, so eviction order is exact."""
        self.clock += 1
        return self.clock

    def walk(self, tokens: np.ndarray | bytes, max_pages: int, root: TreeNode | None = None) -> PathMatch:
        """Follow whole pages of ``tokens`` (at most ``max_pages``) down the tree from
        ``root`` (a tenant's, :mod:`hicache.tree.tenants`; default the shared root).

        The last walk is remembered with the tree's shape (bumped by every split, add and
        removal): walking the same tokens again on an unchanged shape -- a ``load`` right
        after its ``match`` -- returns the same path without comparing tokens again.
        """
        q = tokens if isinstance(tokens, bytes) else token_bytes(tokens)
        last = self._last_walk
        if root is None:
            root = self.root
        if (last is not None and last[1] == max_pages and last[2] == self._shape and last[0] == q
                and last[4] is root):
            return last[3]   # the same tokens on the same tree shape (a load after its match)
        W = self.page_tokens * TOKEN_BYTES
        end = min(max_pages, len(q) // W)
        segments = []
        node, pos = root, 0
        while pos < end:
            off = pos * W
            child = node.children.get(q[off: off + W])
            if child is None:
                break
            k = child.num_pages
            if pos + k <= end and child.token_bytes == q[off: off + k * W]:
                matched = k   # the common case, inline: the whole node matches
            else:
                matched = self.common_pages(child, q, pos, end)
            segments.append((child, matched))
            pos += matched
            if matched < k:
                break
            node = child
        path = PathMatch(tuple(segments), None if root is self.root else root)
        self._last_walk = (q, max_pages, self._shape, path, root)
        return path

    def common_pages(self, child: TreeNode, q: bytes, pos: int, end: int) -> int:
        """How many leading pages of ``child`` equal pages ``pos, pos+1, ... < end`` of ``q``
        (at least 1: children are keyed by their first page)."""
        W = self.page_tokens * TOKEN_BYTES
        limit = min(child.num_pages, end - pos)
        mine = child.token_bytes
        n = limit * W
        if (mine if n == len(mine) else mine[:n]) == q[pos * W: pos * W + n]:
            return limit
        a = np.frombuffer(mine, "<i4", count=n // TOKEN_BYTES)
        b = np.frombuffer(q, "<i4", count=n // TOKEN_BYTES, offset=pos * W)
        matched = int(np.flatnonzero(a != b)[0]) // self.page_tokens
        assert matched >= 1, "the child key matched its first page"
        return matched

    def touch(self, match: PathMatch, *, hit: bool = True) -> None:
        """Record an access along a matched path (LRU time, LFU count). A hit through
        decoded pages makes them a branch requests take (``TreeNode.decoded``)."""
        now = self.tick()
        touched = self._watch.node_touched
        for node, _ in match.segments:
            _set(node, "last_access", now)
            if hit:
                _set(node, "hit_count", node.hit_count + 1)
                if node.decoded:
                    self.taken(node)
            touched(node)

    def taken(self, node: TreeNode) -> None:
        """A request went on through ``node``'s decoded pages: a branch requests take now."""
        assert node.decoded and node.parent is not None
        _set(node, "decoded", False)
        self._branch(node.parent, +1)
        self._watch.children_changed(node.parent)
        self._watch.node_touched(node)   # a strategy may rank a decode's idle pages apart

    def node_at(self, path: PathMatch, pages: int) -> TreeNode:
        """The node ending exactly ``pages`` pages deep on ``path``, splitting one if needed."""
        if pages == 0:
            return self.root if path.root is None else path.root
        for node, _ in path.segments:
            if node.depth == pages:
                return node
            if node.depth > pages:
                return self.split(node, pages - (node.depth - node.num_pages))
        raise AssertionError(f"boundary {pages} is past the matched path")

    # -- structure ----------------------------------------------------------------------
    def split(self, node: TreeNode, pages: int) -> TreeNode:
        """Split ``node`` after ``pages`` pages; return the new upper node.

        The original object keeps the lower part, so everything that refers to it (its
        snapshot, which belongs to its end boundary, and in-flight copies) stays valid::

            parent -> [ node: p0 .. pk-1 | pk .. pn-1 ]
            parent -> [ upper: p0 .. pk-1 ] -> [ node: pk .. pn-1 ]   (snapshot stays on node)
        """
        assert 0 < pages < node.num_pages, f"split of {node} at {pages} is not interior"
        self._shape += 1
        cut = pages * self.page_tokens * TOKEN_BYTES
        parent = node.parent
        assert parent is not None
        key = node.first_page_key(self.page_tokens)
        dev, host = node.device_ids, node.host_ids
        upper = TreeNode(
            node.token_bytes[:cut], node.hashes[:pages], parent,
            device_ids=None if dev is None else dev[:pages], host_ids=None if host is None else host[:pages],
            lock_device=node.lock_device, lock_host=node.lock_host, backup_pending=node.backup_pending,
            load_ticket=node.load_ticket, l3_put=node.l3_put, l3_stored=node.l3_stored, from_l3=node.from_l3,
            last_access=node.last_access, hit_count=node.hit_count, node_id=self._new_id(),
            depth=node.depth - node.num_pages + pages)
        _set(node, "token_bytes", node.token_bytes[cut:])
        _set(node, "hashes", node.hashes[pages:])
        _set(node, "num_pages", node.num_pages - pages)
        if dev is not None:
            _set(node, "device_ids", dev[pages:])
        if host is not None:
            _set(node, "host_ids", host[pages:])
        parent.children[key] = upper
        upper.children[node.first_page_key(self.page_tokens)] = node
        _set(upper, "_device_children", int(dev is not None))
        _set(upper, "snapshots_below", node.snapshots_below + (node.snapshot is not None))
        _set(upper, "decoded", node.decoded)          # it takes node's place below parent
        _set(upper, "branches", 0 if node.decoded else 1)
        _set(node, "parent", upper)
        _set(upper, "_watch", self._watch)
        self._watch.node_added(upper)   # its ids were node's: recorded as upper's now
        # Neither part changes eligibility (the upper node has a child, and a device child
        # when it is on the device; the lower one keeps its fields, id and end), but the
        # pages they count in the evictable totals move.
        self._watch.node_changed(node)
        self._watch.node_changed(upper)
        self.num_nodes += 1
        return upper

    def add_child(self, parent: TreeNode, tokens: np.ndarray | bytes, *, device_ids: np.ndarray | None,
                  host_ids: np.ndarray | None, decoded: bool = False) -> TreeNode:
        """Hang a new node of whole pages below ``parent`` (hashes chained from it).
        ``decoded``: the pages come from a decode, a branch no request has taken yet."""
        P = self.page_tokens
        data = tokens if isinstance(tokens, bytes) else token_bytes(tokens)
        assert len(data) % (P * TOKEN_BYTES) == 0 and data, "a node holds whole pages"
        self._shape += 1
        hashes = chain_hashes(self.hash_seed, parent.last_hash, data, P)
        node = TreeNode(data, hashes, parent, device_ids=device_ids, host_ids=host_ids,
                        last_access=self.tick(), node_id=self._new_id(), depth=parent.depth + len(hashes))
        key = node.first_page_key(P)
        assert key not in parent.children, "add_child over an existing child"
        parent.children[key] = node
        _set(node, "decoded", decoded)
        if not decoded:
            self._branch(parent, +1)
        _set(node, "_watch", self._watch)
        self._watch.node_added(node)
        if device_ids is not None:
            _set(parent, "_device_children", parent._device_children + 1)
        self._watch.node_changed(parent)
        self._watch.children_changed(parent)
        self._watch.node_changed(node)
        self.num_nodes += 1
        return node

    def _branch(self, parent: TreeNode, delta: int) -> None:
        """``parent`` gained (or lost) a branch requests were seen to take; two make it a
        branch point for good (``forked``: see :class:`hicache.tree.eviction.Ranked`)."""
        _set(parent, "branches", parent.branches + delta)
        if parent.branches >= 2:
            _set(parent, "forked", True)

    def remove(self, node: TreeNode) -> None:
        """Detach a leaf. Its ids must already have been taken by the caller."""
        assert not node.children, f"remove of {node} with children"
        assert node.device_ids is None and node.host_ids is None, f"remove of {node} with pages"
        assert node.snapshot is None or node.snapshot.empty, f"remove of {node} with a snapshot"
        assert node.lock_device == 0 and not node.host_held, f"remove of locked {node}"
        parent = node.parent
        assert parent is not None
        del parent.children[node.first_page_key(self.page_tokens)]
        if not node.decoded:
            self._branch(parent, -1)
        self._shape += 1
        self.num_nodes -= 1
        self._watch.node_removed(node)
        _set(node, "_watch", None)
        _set(node, "parent", None)
        self._watch.node_changed(parent)
        self._watch.children_changed(parent)
        if parent.parent is None and parent is not self.root:
            _tenants.prune(self, parent)

    def remove_subtree(self, node: TreeNode, on_detach: Callable[[TreeNode], None] | None = None) -> Removed:
        """Take every copy under and including ``node`` and detach those nodes.

        Returns the ids for the caller to free. Nothing in the subtree may be locked or have
        a snapshot that is locked or being backed up (the caller checks
        :meth:`subtree_pinned` first when a copy could be in flight). ``on_detach(n)`` is
        called for each node after its copies were taken, just before it leaves its parent
        (for bookkeeping the caller keys by node).
        """
        order, stack = [], [node]
        while stack:
            n = stack.pop()
            order.append(n)
            stack.extend(n.children.values())
        order.reverse()  # children first
        dev, host, dsnap, hsnap, snaps = [], [], [], [], []
        for n in order:
            assert n.lock_device == 0 and not n.host_held, f"removing locked {n}"
            if n.device_ids is not None:
                dev.append(n.device_ids)
                n.device_ids = None
            if n.host_ids is not None:
                host.append(n.host_ids)
                n.host_ids = None
            snap = n.snapshot
            if snap is not None:
                assert snap.lock == 0 and not snap.backup_pending, f"dropping a pinned snapshot on {n}"
                if snap.device_id is not None:
                    dsnap.append(snap.device_id)
                if snap.host_id is not None:
                    hsnap.append(snap.host_id)
                snaps.append(snap)
                n.snapshot = None
            if on_detach is not None:
                on_detach(n)
            self.remove(n)
        return Removed(_ids(dev), _ids(host), dsnap, hsnap, order, snaps)

    def subtree_pinned(self, node: TreeNode, busy: Callable[[TreeNode], bool] | None = None) -> bool:
        """True if removing ``node``'s subtree would take a copy someone is reading: a lock,
        a copy in flight (``TreeNode.busy``), or ``busy(n)`` for any node in it."""
        stack = [node]
        while stack:
            n = stack.pop()
            if n.host_held or n.lock_device or n.busy or (busy is not None and busy(n)):
                return True
            stack.extend(n.children.values())
        return False

    def _new_id(self) -> int:
        self._next_id += 1
        return self._next_id

    # -- publish (hicache.tree.insert) and resume points (hicache.tree.paths) ----------------
    insert = _insert.insert
    insert_host = _insert.insert_host
    resume_point = _paths.resume_point
    tenant_root = _tenants.tenant_root
    root_of = staticmethod(_tenants.root_of)
    prune_root = _tenants.prune

    # -- locks --------------------------------------------------------------------------
    def lock(self, node: TreeNode, delta: int = 1) -> None:
        """Pin (or unpin, ``delta=-1``) the device pages of a node and all its ancestors."""
        changed, locked = self._watch.node_changed, self._watch.node_locked
        n = node
        while n.parent is not None:
            old = n.lock_device
            new = old + delta
            assert new >= 0, f"unlock below zero on {n}"
            _set(n, "lock_device", new)
            if not old:        # eviction reads only "locked or not"
                locked(n)
            elif not new:
                changed(n)
            n = n.parent
        if n is not self.root:   # a tenant's root counts the locks below it (tenants.py)
            _set(n, "lock_device", n.lock_device + delta)
            if delta < 0:
                _tenants.prune(self, n)

    def pin(self, node: TreeNode, delta: int = 1) -> None:
        """Keep ``node`` in the tree (``delta=-1``: let it go): an open prefetch will hang
        pages below its end. A pinned node is never removed (host eviction, subtree
        removal); its device copy may still be demoted. The shared root needs no pin; a
        tenant's root is kept while pinned (:mod:`hicache.tree.tenants`)."""
        if node is not self.root:
            node.pins += delta
            assert node.pins >= 0, f"unpin below zero on {node}"
            if node.parent is None and delta < 0:
                _tenants.prune(self, node)

    def move_lock(self, old: TreeNode, new: TreeNode) -> None:
        """Move one lock from ``old``'s path to ``new``'s: ``lock(new)`` then ``lock(old, -1)``,
        touching only the nodes on one path and not the other (a publish that extends the
        prefix a request holds costs the pages it adds, not its context)."""
        gain: list[TreeNode] = []
        drop: list[TreeNode] = []
        a, b = old, new
        while a is not b:
            if a.depth >= b.depth and a.parent is not None:
                drop.append(a)
                a = a.parent
            else:
                assert b.parent is not None, "move_lock between nodes of different trees"
                gain.append(b)
                b = b.parent
        changed, locked = self._watch.node_changed, self._watch.node_locked
        for n in gain:
            _set(n, "lock_device", n.lock_device + 1)
            if n.lock_device == 1:
                locked(n)
        for n in drop:
            assert n.lock_device > 0, f"unlock below zero on {n}"
            _set(n, "lock_device", n.lock_device - 1)
            if n.lock_device == 0:
                changed(n)

    # -- eviction order -------------------------------------------------------------------
    def eviction_order(self, strategy: "EvictionStrategy") -> EvictionOrder:
        """The victim order under ``strategy``, built on first use and kept current."""
        return self._watch.eviction_order(strategy, self.nodes())

    def owner_index(self) -> OwnerIndex:
        """Which node or snapshot holds a pool id (:mod:`hicache.tree.owners`), built on
        first use and kept by every later id assignment."""
        return self._watch.owner_index(self.nodes())

    def evictable(self, tier: str, source: str) -> int:
        """Pages (``source="page"``) or snapshots (``"state"``) of ``tier`` that no lock
        holds: an upper bound on what eviction could free there, kept without a scan.

        Device pages: nodes on the device with no device lock. Host pages: shadow nodes with
        no lock. Device snapshots: unlocked with a device copy; host snapshots: unlocked
        with only a host copy.
        """
        return (self._watch.pages if source == "page" else self._watch.snapshots)[tier]

    def reorder(self) -> None:
        """Forget every victim order kept: the cache follows another strategy now (an
        adaptive policy switched), so the next :meth:`eviction_order` builds the new one,
        O(n), and the old one is no longer kept current."""
        self._watch.drop_orders()

    def reprioritize(self, node: TreeNode) -> None:
        """Recompute ``node``'s (and its snapshot's) place in every eviction order; for
        strategies whose priority changed for a reason the tree does not observe."""
        self._watch.node_changed(node)
        if node.snapshot is not None:
            self._watch.snapshot_changed(node, node.snapshot, "priority")

    # -- iteration ----------------------------------------------------------------------
    def nodes(self) -> Iterator[TreeNode]:
        """Every non-root node (of every tenant), parents before children."""
        stack = list(self.root.children.values())
        for root in self._roots.values():
            stack.extend(root.children.values())
        while stack:
            node = stack.pop()
            yield node
            stack.extend(node.children.values())

    def snapshots(self) -> Iterator[tuple[TreeNode, Snapshot]]:
        for node in self.nodes():
            if node.snapshot is not None and not node.snapshot.empty:
                yield node, node.snapshot

    @staticmethod
    def depth_pages(node: TreeNode) -> int:
        """Pages from the root to the end of ``node``."""
        return node.depth

    def check_integrity(self) -> None:
        P = self.page_tokens
        nodes = list(self.nodes())
        assert len(nodes) == self.num_nodes, f"{len(nodes)} nodes in the tree, {self.num_nodes} counted"
        for node in nodes:
            parent = node.parent
            assert parent is not None and parent.children.get(node.first_page_key(P)) is node, \
                f"{node} is not reachable under its first-page key"
            assert node._watch is self._watch, f"{node} does not report to this tree"
            assert len(node.token_bytes) == node.num_pages * P * TOKEN_BYTES and node.num_pages > 0, \
                f"{node}: ragged pages"
            assert node.num_pages == len(node.hashes), f"{node}: page count is off"
            assert node.depth == parent.depth + node.num_pages, f"{node}: depth {node.depth} is off"
            assert node.on_device or node.on_host, f"{node} holds no copy of its pages"
            for ids in (node.device_ids, node.host_ids):
                assert ids is None or len(ids) == node.num_pages, f"{node}: id count != pages"
            if node.on_device:
                assert parent.is_root or parent.on_device, f"{node} on device under a shadow parent"
            assert node._device_children == sum(c.device_ids is not None for c in node.children.values()), \
                f"{node}: device child count is off"
            assert node.lock_device >= sum(c.lock_device for c in node.children.values()), \
                f"{node}: fewer locks than its children"
            assert node.lock_host >= 0 and node.backup_pending >= 0 and node.pins >= 0, f"{node}: negative counter"
            taken = sum(not c.decoded for c in node.children.values())
            assert node.branches == taken, f"{node}: {node.branches} branches counted, {taken} taken"
            assert node.forked or taken < 2, f"{node}: branches but is not marked forked"
            if node.snapshot is not None:
                assert node.snapshot.lock >= 0, f"{node}: negative snapshot lock"
                assert node.snapshot._node is node, f"{node}: its snapshot points elsewhere"
        _tenants.check(self)
        self._watch.check(nodes)
        if self._watch.owners is not None:
            self._watch.owners.check(nodes)
