"""Publishing into the tree: device pages (``insert``) and host pages (``insert_host``).

Both follow the same descent (:func:`descend_step`): from a node, find the child holding
the next page, compare as many pages as both hold, and split the child where they part,
so every step lands on a node that holds exactly the matched pages::

    node --(child keyed by page pos)--> child: pages [pos, pos + k) equal   -> step to it
                                        child: differs after j < k pages     -> split at j
                                        no child                             -> caller adds a leaf

A publish can start below the root (``start``): a request that has already published (or
borrowed) pages ``[0, d)`` passes the node ending at ``d``, and the descent costs only the
pages past it -- what the request adds, not its whole context.

These functions are the bodies of ``RadixTree.insert`` / ``RadixTree.insert_host``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from hicache.tree.node import TOKEN_BYTES, TreeNode, token_bytes

if TYPE_CHECKING:
    from hicache.tree.radix import RadixTree

_EMPTY = np.zeros(0, np.int64)


@dataclass
class InsertResult:
    """What publishing pages did.

    ``page_ids``: the device ids the request should now use for the published pages (its
    own, or an identical page another request published first), aligned with the
    ``device_ids`` passed in. ``duplicates``: the request's own ids that lost to an
    existing page; the caller frees them. ``private``: page positions (from the root) the
    request keeps private (the tree's copy was still loading). ``new_nodes``: nodes
    created or given device pages by this insert (write-through candidates). ``last``: the
    node whose end is the published boundary.
    """

    page_ids: np.ndarray
    duplicates: np.ndarray
    private: np.ndarray
    new_nodes: list[TreeNode]
    last: TreeNode


def descend_step(tree: "RadixTree", q: bytes, node: TreeNode, pos: int, end: int) -> TreeNode | None:
    """The child of ``node`` holding page ``pos`` of ``q``, split so it holds exactly the
    pages it shares with ``q[pos:end]``; None if no child holds page ``pos``."""
    W = tree.page_tokens * TOKEN_BYTES
    child = node.children.get(q[pos * W: (pos + 1) * W])
    if child is None:
        return None
    matched = tree.common_pages(child, q, pos, end)
    if matched < child.num_pages:
        child = tree.split(child, matched)
    return child


def insert(tree: "RadixTree", tokens: np.ndarray | bytes, device_ids: np.ndarray, *,
           start: TreeNode | None = None, decoded: bool = False) -> InsertResult:
    """Publish pages held on the device: ``device_ids[i]`` holds page ``d + i`` of ``tokens``,
    where ``d`` is ``start.depth`` (0 from the root).

    Pages ``[0, d)`` are the path to ``start`` and are not looked at. Pages already in the
    tree on the device keep the tree's id (the request's id is a duplicate and is returned
    for freeing, unless it *is* the tree's id: a borrowed page). Shadow nodes get the
    request's device ids back. The rest becomes a new leaf. A node whose device copy is
    still loading (``load_ticket``) cannot be adopted: when the request has its own copy of
    such a node, that copy and everything after it stay private to the request (not
    published).

    ``decoded``: the pages come from a decode (``Boundary.FINISH``): a new node is marked
    ``decoded`` until a request is seen to go through it. A publish that is not a decode's
    and passes through such a node marks it taken (a request's prompt went that way).
    """
    node = tree.root if start is None else start
    base = node.depth
    ids = np.array(device_ids, dtype=np.int64)  # a copy: page_ids is returned in it
    n = base + len(ids)
    W = tree.page_tokens * TOKEN_BYTES
    q = tokens if isinstance(tokens, bytes) else token_bytes(tokens[: n * tree.page_tokens])
    assert len(q) >= n * W, "fewer tokens than published pages"
    dup: list[np.ndarray] = []
    private = _EMPTY
    new_nodes: list[TreeNode] = []
    pos = base
    while pos < n:
        child = descend_step(tree, q, node, pos, n)
        if child is None:
            node = tree.add_child(node, q[pos * W: n * W], device_ids=ids[pos - base:].copy(), host_ids=None,
                                  decoded=decoded)
            new_nodes.append(node)
            break
        if child.decoded and not decoded:
            tree.taken(child)
        k = child.num_pages
        mine = ids[pos - base: pos - base + k]
        theirs = child.device_ids
        if theirs is None:
            assert node.parent is None or node.device_ids is not None, "device residency must stay prefix-closed"
            child.device_ids = mine.copy()
            new_nodes.append(child)
        elif child.load_ticket is not None and not np.array_equal(mine, theirs):
            # The tree's copy is still loading and ours is separate: keep ours private
            # from here on (nothing may hang below a copy that could still fail).
            private = np.arange(pos, n, dtype=np.int64)
            break
        else:
            differ = mine != theirs
            if differ.any():
                dup.append(mine[differ])
                mine[:] = theirs
        node, pos = child, pos + k
    return InsertResult(page_ids=ids, duplicates=np.concatenate(dup) if dup else _EMPTY.copy(),
                        private=private, new_nodes=new_nodes, last=node)


def insert_host(tree: "RadixTree", tokens: np.ndarray | bytes, host_ids: np.ndarray, *, start_page: int = 0,
                root: TreeNode | None = None) -> tuple[np.ndarray, TreeNode | None, list[TreeNode]]:
    """Insert pages ``[start_page, start_page + len(host_ids))`` that exist only on the host
    (an L3 prefetch) below ``root`` (a tenant's; default the shared root). Pages before
    ``start_page`` must already be in the tree.

    Returns the host ids the tree did not take (it had those pages already, or the
    prefix before ``start_page`` is gone), the node ending at the last page (None if
    nothing could be placed) and the nodes that got host ids.
    """
    ids = np.asarray(host_ids, np.int64)
    n = start_page + len(ids)
    W = tree.page_tokens * TOKEN_BYTES
    q = tokens if isinstance(tokens, bytes) else token_bytes(tokens[: n * tree.page_tokens])
    path = tree.walk(q, start_page, root)
    if path.num_pages < start_page:
        return ids.copy(), None, []
    node = tree.node_at(path, start_page)
    unused: list[np.ndarray] = []
    added: list[TreeNode] = []
    pos = start_page
    while pos < n:
        child = descend_step(tree, q, node, pos, n)
        mine = ids[pos - start_page:]
        if child is None:
            node = tree.add_child(node, q[pos * W: n * W], device_ids=None, host_ids=mine.copy())
            added.append(node)
            break
        k = child.num_pages
        if child.host_ids is None and child.backup_pending == 0:
            child.host_ids = mine[:k].copy()  # a device-only page gains its backup
            added.append(child)
        else:
            unused.append(mine[:k])
        node, pos = child, pos + k
    return (np.concatenate(unused) if unused else _EMPTY.copy()), node, added
