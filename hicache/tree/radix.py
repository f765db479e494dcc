"""The radix tree over pages: match, insert (publish), split, locks, removal.

The tree is pure bookkeeping: it records page and snapshot *ids* and never frees or copies
bytes. Every operation that gives ids up returns them so the caller (the ``HiCache``
facade) frees them in the pools.

Invariants (checked by :meth:`RadixTree.check_integrity`):

* every non-root node holds at least one copy of its pages (device, host or both);
* device residency is prefix-closed: a node on the device has a parent on the device (or
  the root), so the device part of any match is a prefix of it;
* a node with device pages is evicted only once no child has device pages (leaf first);
* ``len(node.tokens) == node.num_pages * page_tokens`` and children are keyed by the
  bytes of their first page.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Iterator

import numpy as np

from hicache.tree.node import ROOT_HASH, Snapshot, TreeNode, chain_hashes


@dataclass(frozen=True)
class PathMatch:
    """The walk of a token sequence down the tree.

    ``segments`` holds ``(node, pages)`` pairs from the root down, where ``pages`` is how
    many leading pages of that node matched (the last may be partial).
    """

    segments: tuple[tuple[TreeNode, int], ...]

    @property
    def num_pages(self) -> int:
        return sum(p for _, p in self.segments)

    @property
    def last_hash(self) -> bytes:
        if not self.segments:
            return ROOT_HASH
        node, pages = self.segments[-1]
        return node.hashes[pages - 1]


@dataclass
class InsertResult:
    """What publishing pages did.

    ``page_ids``: the device ids the request should now use for the published pages (its
    own, or an identical page another request published first). ``duplicates``: the
    request's own ids that lost to an existing page; the caller frees them.
    ``private``: positions the request keeps private (the tree's copy was still loading).
    ``new_nodes``: nodes created or given device pages by this insert (write-through
    candidates). ``last``: the node whose end is the published boundary.
    """

    page_ids: np.ndarray
    duplicates: np.ndarray
    private: np.ndarray
    new_nodes: list[TreeNode]
    last: TreeNode


@dataclass
class RadixTree:
    """A radix tree of ``page_tokens``-token pages (see module docstring)."""

    page_tokens: int
    hash_seed: bytes = b"hicache-v1"
    needs_snapshots: bool = False  # hybrid layouts: a resume point needs a state snapshot
    root: TreeNode = field(init=False)
    clock: int = field(default=0, init=False)
    _next_id: int = field(default=1, init=False)

    def __post_init__(self) -> None:
        self.root = TreeNode(tokens=np.zeros(0, np.int32), hashes=[], parent=None)
        self.root.lock_device = 1  # never evicted

    # -- walking ------------------------------------------------------------------------
    def tick(self) -> int:
        """Advance the logical clock; access times are ticks, so eviction order is exact."""
        self.clock += 1
        return self.clock

    def walk(self, tokens: np.ndarray, max_pages: int) -> PathMatch:
        """Follow whole pages of ``tokens`` (at most ``max_pages``) down the tree."""
        P = self.page_tokens
        segments = []
        node, pos, pages_left = self.root, 0, max_pages
        while pages_left > 0:
            child = node.children.get(tokens[pos: pos + P].tobytes()) if pos + P <= len(tokens) else None
            if child is None:
                break
            limit = min(child.num_pages, pages_left)
            a = child.tokens[: limit * P]
            b = tokens[pos: pos + limit * P]
            diff = np.flatnonzero(a != b)
            matched = limit if diff.size == 0 else int(diff[0]) // P
            assert matched >= 1, "the child key matched its first page"
            segments.append((child, matched))
            pos += matched * P
            pages_left -= matched
            if matched < child.num_pages:
                break
            node = child
        return PathMatch(tuple(segments))

    def touch(self, match: PathMatch, *, hit: bool = True) -> None:
        """Record an access along a matched path (LRU time, LFU count)."""
        now = self.tick()
        for node, _ in match.segments:
            node.last_access = now
            if hit:
                node.hit_count += 1

    # -- structure ----------------------------------------------------------------------
    def split(self, node: TreeNode, pages: int) -> TreeNode:
        """Split ``node`` after ``pages`` pages; return the new upper node.

        The original object keeps the lower part, so everything that refers to it (its
        snapshot, which belongs to its end boundary, and in-flight copies) stays valid::

            parent -> [ node: p0 .. pk-1 | pk .. pn-1 ]
            parent -> [ upper: p0 .. pk-1 ] -> [ node: pk .. pn-1 ]   (snapshot stays on node)
        """
        assert 0 < pages < node.num_pages, f"split of {node} at {pages} is not interior"
        P = self.page_tokens
        upper = TreeNode(
            tokens=node.tokens[: pages * P], hashes=node.hashes[:pages], parent=node.parent,
            device_ids=None if node.device_ids is None else node.device_ids[:pages],
            host_ids=None if node.host_ids is None else node.host_ids[:pages],
            lock_device=node.lock_device, lock_host=node.lock_host,
            backup_pending=node.backup_pending, load_ticket=node.load_ticket,
            l3_put=node.l3_put, l3_stored=node.l3_stored, from_l3=node.from_l3,
            last_access=node.last_access,
            hit_count=node.hit_count, node_id=self._new_id())
        key = node.first_page_key(P)
        node.tokens = node.tokens[pages * P:]
        node.hashes = node.hashes[pages:]
        if node.device_ids is not None:
            node.device_ids = node.device_ids[pages:]
        if node.host_ids is not None:
            node.host_ids = node.host_ids[pages:]
        assert node.parent is not None
        node.parent.children[key] = upper
        upper.children[node.first_page_key(P)] = node
        node.parent = upper
        return upper

    def add_child(self, parent: TreeNode, tokens: np.ndarray, *, device_ids: np.ndarray | None,
                  host_ids: np.ndarray | None) -> TreeNode:
        P = self.page_tokens
        assert len(tokens) % P == 0 and len(tokens) > 0, "a node holds whole pages"
        hashes = chain_hashes(self.hash_seed, parent.last_hash, tokens, P)
        node = TreeNode(tokens=tokens, hashes=hashes, parent=parent, device_ids=device_ids,
                        host_ids=host_ids, last_access=self.tick(), node_id=self._new_id())
        key = node.first_page_key(P)
        assert key not in parent.children, "add_child over an existing child"
        parent.children[key] = node
        return node

    def remove(self, node: TreeNode) -> None:
        """Detach a leaf. Its ids must already have been taken by the caller."""
        assert not node.children, f"remove of {node} with children"
        assert node.device_ids is None and node.host_ids is None, f"remove of {node} with pages"
        assert node.snapshot is None or node.snapshot.empty, f"remove of {node} with a snapshot"
        assert node.lock_device == 0 and node.lock_host == 0, f"remove of locked {node}"
        assert node.parent is not None
        del node.parent.children[node.first_page_key(self.page_tokens)]
        node.parent = None

    def _new_id(self) -> int:
        self._next_id += 1
        return self._next_id

    # -- publish ------------------------------------------------------------------------
    def insert(self, tokens: np.ndarray, device_ids: np.ndarray) -> InsertResult:
        """Publish ``len(device_ids)`` leading pages of ``tokens`` held on the device.

        Pages already in the tree on the device keep the tree's id (the request's id is a
        duplicate and is returned for freeing, unless it *is* the tree's id: a borrowed
        page). Shadow nodes get the request's device ids back. The rest becomes a new leaf.
        A node whose device copy is still loading (``load_ticket``) cannot be adopted: when
        the request has its own copy of such a node, that copy and everything after it stay
        private to the request (not published).
        """
        P = self.page_tokens
        n = len(device_ids)
        assert len(tokens) >= n * P, "fewer tokens than published pages"
        ids = np.asarray(device_ids, dtype=np.int64).copy()
        dup: list[np.ndarray] = []
        private: list[int] = []
        new_nodes: list[TreeNode] = []
        node, pos = self.root, 0
        while pos < n:
            child = node.children.get(tokens[pos * P: (pos + 1) * P].tobytes())
            if child is None:
                leaf = self.add_child(node, tokens[pos * P: n * P].copy(), device_ids=ids[pos:].copy(),
                                      host_ids=None)
                new_nodes.append(leaf)
                node, pos = leaf, n
                break
            limit = min(child.num_pages, n - pos)
            diff = np.flatnonzero(child.tokens[: limit * P] != tokens[pos * P: (pos + limit) * P])
            matched = limit if diff.size == 0 else int(diff[0]) // P
            if matched < child.num_pages:
                child = self.split(child, matched)
            mine = ids[pos: pos + matched]
            if child.device_ids is None:
                assert node.is_root or node.on_device, "device residency must stay prefix-closed"
                child.device_ids = mine.copy()
                new_nodes.append(child)
            elif child.load_ticket is not None and not np.array_equal(mine, child.device_ids):
                # The tree's copy is still loading and ours is separate: keep ours private
                # from here on (nothing may hang below a copy that could still fail).
                private.extend(range(pos, n))
                break
            else:
                theirs = child.device_ids
                differ = mine != theirs
                dup.append(mine[differ])
                ids[pos: pos + matched] = theirs
            node, pos = child, pos + matched
        return InsertResult(page_ids=ids, duplicates=np.concatenate(dup) if dup else np.zeros(0, np.int64),
                            private=np.asarray(private, np.int64), new_nodes=new_nodes, last=node)

    def insert_host(self, tokens: np.ndarray, host_ids: np.ndarray, *, start_page: int = 0
                    ) -> tuple[np.ndarray, TreeNode | None, list[TreeNode]]:
        """Insert pages ``[start_page, start_page + len(host_ids))`` that exist only on the host
        (an L3 prefetch). Pages before ``start_page`` must already be in the tree.

        Returns the host ids the tree did not take (it had those pages already, or the
        prefix before ``start_page`` is gone), the node ending at the last page (None if
        nothing could be placed) and the nodes that got host ids.
        """
        P = self.page_tokens
        ids = np.asarray(host_ids, np.int64)
        n = start_page + len(ids)
        path = self.walk(tokens, start_page)
        if path.num_pages < start_page:
            return ids.copy(), None, []
        node = self.root
        if path.segments:
            seg, used = path.segments[-1]
            node = seg if used == seg.num_pages else self.split(seg, used)
        unused: list[np.ndarray] = []
        added: list[TreeNode] = []
        pos = start_page
        while pos < n:
            child = node.children.get(tokens[pos * P: (pos + 1) * P].tobytes())
            mine = ids[pos - start_page:]
            if child is None:
                node = self.add_child(node, tokens[pos * P: n * P].copy(), device_ids=None, host_ids=mine.copy())
                added.append(node)
                break
            limit = min(child.num_pages, n - pos)
            diff = np.flatnonzero(child.tokens[: limit * P] != tokens[pos * P: (pos + limit) * P])
            matched = limit if diff.size == 0 else int(diff[0]) // P
            if matched < child.num_pages:
                child = self.split(child, matched)
            if child.host_ids is None and child.backup_pending == 0:
                child.host_ids = mine[:matched].copy()  # a device-only page gains its backup
                added.append(child)
            else:
                unused.append(mine[:matched])
            node, pos = child, pos + matched
        return (np.concatenate(unused) if unused else np.zeros(0, np.int64)), node, added

    # -- locks --------------------------------------------------------------------------
    @staticmethod
    def lock(node: TreeNode, delta: int = 1) -> None:
        """Pin (or unpin, ``delta=-1``) the device pages of a node and all its ancestors."""
        for n in node.iter_ancestors():
            n.lock_device += delta
            assert n.lock_device >= 0, f"unlock below zero on {n}"

    # -- iteration ----------------------------------------------------------------------
    def nodes(self) -> Iterator[TreeNode]:
        """Every non-root node, parents before children."""
        stack = list(self.root.children.values())
        while stack:
            node = stack.pop()
            yield node
            stack.extend(node.children.values())

    def snapshots(self) -> Iterator[tuple[TreeNode, Snapshot]]:
        for node in self.nodes():
            if node.snapshot is not None and not node.snapshot.empty:
                yield node, node.snapshot

    def depth_pages(self, node: TreeNode) -> int:
        """Pages from the root to the end of ``node``."""
        return sum(n.num_pages for n in node.iter_ancestors())

    def check_integrity(self) -> None:
        P = self.page_tokens
        for node in self.nodes():
            parent = node.parent
            assert parent is not None and parent.children.get(node.first_page_key(P)) is node, \
                f"{node} is not reachable under its first-page key"
            assert len(node.tokens) == node.num_pages * P and node.num_pages > 0, f"{node}: ragged pages"
            assert node.on_device or node.on_host, f"{node} holds no copy of its pages"
            for ids in (node.device_ids, node.host_ids):
                assert ids is None or len(ids) == node.num_pages, f"{node}: id count != pages"
            if node.on_device:
                assert parent.is_root or parent.on_device, f"{node} on device under a shadow parent"
            assert node.lock_device >= sum(c.lock_device for c in node.children.values()), \
                f"{node}: fewer locks than its children"
            assert node.lock_host >= 0 and node.backup_pending >= 0, f"{node}: negative counter"
            if node.snapshot is not None:
                assert node.snapshot.lock >= 0, f"{node}: negative snapshot lock"
