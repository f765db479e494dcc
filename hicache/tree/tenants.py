"""Tenant roots: one tree per salt under the one ``RadixTree``.

Why. A shared prefix cache leaks (whether a prefix hits tells one user what another sent)
and lets one user's pages serve another. A request with a ``salt`` (a tenant) walks,
publishes and prefetches under a root of its own, whose hash (:func:`tenant_root_hash`) is
where every page hash of the tenant chains from: its pages, its snapshots and their L3 keys
are the tenant's alone, and a lookup of another tenant's prefix walks an empty tree -- the
same work as any miss. Requests without a salt use ``tree.root`` (``ROOT_HASH``) and share
exactly as before.

Tenant roots hold no pages and are never evicted. They are kept in ``tree._roots`` by
hash while anything holds them: a child, a running request locked below (or at) one
(``lock_device`` counts 1 plus those locks), an open prefetch pinned at one (``pins``).
The last of these to go drops the root, so a tenant that left costs nothing.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from hicache.tree.node import ROOT_HASH, RootNode, TreeNode

if TYPE_CHECKING:
    from hicache.tree.radix import RadixTree

_set = object.__setattr__


def tenant_root(tree: "RadixTree", root_hash: bytes, *, create: bool) -> TreeNode | None:
    """The root a tenant's chains start at: ``tree.root`` for ``ROOT_HASH``; else the
    tenant's root, made when ``create`` (a load, a prefetch) and None when a lookup finds
    none (a lookup never adds to the tree)."""
    if root_hash == ROOT_HASH:
        return tree.root
    root = tree._roots.get(root_hash)
    if root is None and create:
        root = RootNode(root_hash)
        _set(root, "_watch", tree._watch)
        tree._roots[root_hash] = root
    return root


def root_of(node: TreeNode) -> TreeNode:
    """The root above ``node`` (itself for a root)."""
    while node.parent is not None:
        node = node.parent
    return node


def prune(tree: "RadixTree", root: TreeNode) -> None:
    """Drop a tenant root nothing holds any more (no child, lock or pin)."""
    if (isinstance(root, RootNode) and not root.children and root.lock_device == 1 and not root.pins
            and tree._roots.get(root.root_hash) is root):
        del tree._roots[root.root_hash]
        tree._shape += 1


def check(tree: "RadixTree") -> None:
    """Each tenant root is registered under its hash, not counted as a node, and held."""
    for h, root in tree._roots.items():
        assert isinstance(root, RootNode) and root.root_hash == h and root.parent is None, f"tenant root {h.hex()[:8]}"
        held = sum(c.lock_device for c in root.children.values())
        assert root.lock_device >= 1 + held, f"tenant root {h.hex()[:8]}: fewer locks than its children"
        assert root.children or root.lock_device > 1 or root.pins, f"tenant root {h.hex()[:8]} held by nothing"
