"""Matched paths and resume points.

A walk returns a :class:`PathMatch`: the nodes from the root down and how many pages of
each matched. A request can resume at a page boundary of that path only if everything it
needs there is resident: every history page before it (always true on a path) and, for
layouts with state families, a snapshot of the state at exactly that boundary, which
exists only at node ends. :func:`resume_point` is the one scan that finds the deepest such
point (``RadixTree.resume_point``), for a full match or for the device-only fallback.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, NamedTuple

from hicache.tree.node import ROOT_HASH, Snapshot, TreeNode

if TYPE_CHECKING:
    from hicache.tree.radix import RadixTree


@dataclass(frozen=True)
class PathMatch:
    """The walk of a token sequence down the tree.

    ``segments`` holds ``(node, pages)`` pairs from the root down, where ``pages`` is how
    many leading pages of that node matched (the last may be partial).
    """

    segments: tuple[tuple[TreeNode, int], ...]
    root: TreeNode | None = None   # the tenant root it starts at (None: the shared root)

    @property
    def num_pages(self) -> int:
        return sum(p for _, p in self.segments)

    @property
    def last_hash(self) -> bytes:
        if not self.segments:
            return ROOT_HASH if self.root is None else self.root.last_hash
        node, pages = self.segments[-1]
        return node.hashes[pages - 1]


class ResumePoint(NamedTuple):
    """Where a request can resume on a matched path.

    ``pages``: the resume point; ``node``: the node ending exactly there (None when it is
    mid-node or the root); ``device_pages``: how many of ``pages`` are on the device (a
    prefix); ``snapshot``: the state snapshot at the resume point (layouts with state).
    """

    pages: int
    node: TreeNode | None
    device_pages: int
    snapshot: Snapshot | None


def resume_point(tree: "RadixTree", path: PathMatch, *, device_only: bool = False) -> ResumePoint:
    """The deepest point of ``path`` a request can resume from.

    Without state every page boundary is one; with state (``needs_snapshots``) only a
    node end with a resident snapshot. ``device_only``: the deepest point that needs no
    load (device pages, and a snapshot with a device copy) -- the fallback when the
    device cannot take the loads.
    """
    best = ResumePoint(0, None, 0, None)
    pages = device = 0
    on_device = True
    state = tree.needs_snapshots
    for node, used in path.segments:
        on_device = on_device and node.device_ids is not None
        if device_only and not on_device:
            break
        pages += used
        if on_device:
            device += used
        full = used == node.num_pages
        if not state:
            best = ResumePoint(pages, node if full else None, device, None)
        elif full and (s := node.snapshot) is not None and (
                s.device_id is not None or (not device_only and s.host_id is not None)):
            best = ResumePoint(pages, node, device, s)
    return best._replace(device_pages=min(best.device_pages, best.pages))
