"""The records Residency hands out and gets back: copies in flight and eviction passes.

A copy's record rides on its ack (the facade routes each ack to the matching
``Residency.apply_*``); a pass of device eviction returns what it freed and, under
write_back, the victims the allocator must back up first.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import NamedTuple

import numpy as np

from hicache.tree import LoadTicket, Snapshot, TreeNode


@dataclass(eq=False)
class PageBackup:
    """An in-flight D2H copy of the pages of ``nodes`` (device ids -> host ids)."""

    nodes: list[TreeNode]
    src: np.ndarray
    dst: np.ndarray


@dataclass(eq=False)
class SnapshotBackup:
    """An in-flight D2H copy of one snapshot's device row into a new host row."""

    node: TreeNode
    snap: Snapshot
    src: int
    dst: int


@dataclass(eq=False)
class Load:
    """An in-flight H2D copy for one lease: its shadow nodes, or its snapshot.

    The nodes are host-locked (``lock_host``) until the ack so their source rows stay.
    """

    nodes: list[TreeNode] = field(default_factory=list)
    page_dst: np.ndarray | None = None
    snap: Snapshot | None = None
    snap_src: int | None = None
    snap_dst: int | None = None
    ticket: LoadTicket | None = None   # its copy's handle, once submitted
    landed: bool = False               # a stage of a staged swap: copied and applied in load()


class LoadPlan(NamedTuple):
    """What a resume point needs loaded: shadow nodes (root-first) and/or its snapshot."""

    shadows: list[TreeNode]
    pages: int
    snapshot: Snapshot | None   # a host-only snapshot to load, or None


class EvictionPass(NamedTuple):
    """One pass of device eviction: ids freed, and (write_back) victims to back up first."""

    freed: int
    to_backup: list[TreeNode]
