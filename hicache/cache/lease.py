"""A running request's hold on the cache.

A lease holds *borrowed* prefix pages (tree pages, locked for its lifetime) and *owned*
suffix pages (allocated for it, not yet published)::

    page_table:  [ borrowed (locked tree pages) | published by this request | owned ]
                 0                          resume                      published  len

Publishing moves owned pages into the tree (ownership transfer, no copy); they stay locked
until :meth:`HiCache.release`. The lease also pins the snapshot it resumed from (until it
publishes past it: its engine has read that state) and the newest snapshot it published.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from hicache.errors import MisuseError
from hicache.units import check_int
from hicache.tree import ROOT_HASH, LoadTicket, Snapshot, TreeNode


@dataclass(frozen=True)
class LeaseHolds:
    """A lease's pins: the node whose path it locks, the snapshots it pins (the one it
    resumed from until it publishes past it, the newest it published) and the device state
    rows it allocated and has not published."""

    locked_node: TreeNode | None
    snapshots: tuple[Snapshot, ...]
    unpublished_snapshots: frozenset[int]


@dataclass(eq=False)
class Lease:
    """Returned by :meth:`HiCache.load`; pass it to ``alloc_pages``, ``publish``, ``release``.

    ``page_table[i]`` is the device page id holding tokens ``[i*P, (i+1)*P)``.
    ``snapshot_id`` is the device state id holding the snapshot for ``resume_tokens``
    (``None`` when the layout has no state or the resume point is 0). Read it before the
    first publish past the resume point: that publish unpins the snapshot (the engine has
    read the state by then) and sets ``snapshot_id`` to ``None``.
    """

    lease_id: int
    tokens: np.ndarray
    resume_tokens: int
    page_table: list[int]
    snapshot_id: int | None
    page_tokens: int
    loaded_tokens: int = 0  # of resume_tokens, how many were loaded from the host
    l3_tokens: int = 0      # of loaded_tokens, how many had just been fetched from L3
    owned: set[int] = field(default_factory=set)
    published_pages: int = 0
    prompt_pages: int = 0   # whole pages of the prompt it was opened for: what a finish publishes past them is a decode's
    released: bool = False
    root_hash: bytes = ROOT_HASH   # its tenant's root (hicache.tree.tenants); ROOT_HASH: shared
    _locked_node: TreeNode | None = None
    _resume_snapshot: Snapshot | None = None
    _newest_snapshot: Snapshot | None = None
    _provisional: tuple[TreeNode, Snapshot] | None = None
    _unpublished_snapshots: set[int] = field(default_factory=set)
    _deps: list[LoadTicket] = field(default_factory=list)
    _step: Any = None  # callable that launches queued copies (so wait() cannot deadlock)
    _owner: int = field(default_factory=threading.get_ident)  # the engine thread that made it

    @property
    def resume_pages(self) -> int:
        return self.resume_tokens // self.page_tokens

    def holds(self) -> "LeaseHolds":
        """What this lease pins in the cache (read by ``check_integrity``)."""
        return LeaseHolds(self._locked_node, tuple(s for s in (self._resume_snapshot, self._newest_snapshot)
                                                   if s is not None), frozenset(self._unpublished_snapshots))

    def ready(self) -> bool:
        """True once every load this lease depends on has finished (ok or not)."""
        return all(h.done() for h in self._deps)

    @property
    def ok(self) -> bool:
        """False if a load this lease depends on failed: recompute instead (release it)."""
        return all(h.status != "failed" for h in self._deps)

    def wait(self, layer: int | None = None, timeout: float | None = None) -> bool:
        """Block until the prefix (or just model layer ``layer`` of it) is on the device.

        Returns False if a load failed; the engine should then release the lease and
        recompute. Waiting per layer lets layer N compute while later layers still load.

        Thread contract: any thread may wait (a forward thread waiting per layer) -- waiting
        only blocks on the copies' completion events. Launching copies is the engine
        thread's job (``cache.step()``; ``load()`` launches unless ``start=False``): if a
        load this lease needs was never launched, the engine thread that made the lease
        launches it here, and any other thread gets a :class:`MisuseError` instead of
        touching the controller.
        """
        if any(h.status == "pending" for h in self._deps):
            if threading.get_ident() != self._owner:
                raise MisuseError("lease.wait() from another thread before its loads were launched: "
                                  "call cache.step() on the engine thread first")
            if self._step is not None:
                self._step()
        for h in self._deps:
            done = h.wait(timeout=timeout) if layer is None else h.wait_layer(layer, timeout=timeout)
            if not done:
                return False
        return self.ok

    def check_publish(self, toks: np.ndarray, num_pages: int, sid: int | None) -> None:
        """Raise :class:`MisuseError` unless publishing ``num_pages`` pages of ``toks`` (and
        state row ``sid``) is something this lease can do now."""
        P = self.page_tokens
        if not self.ok:
            raise MisuseError("publish on a lease whose load failed; release it and recompute")
        if not self.ready():
            raise MisuseError("publish before the lease's loads finished; call lease.wait() first")
        check_int("publish: num_pages", num_pages, minimum=None, misuse=True)
        if not (self.published_pages <= num_pages <= len(self.page_table)) or len(toks) < num_pages * P:
            raise MisuseError(f"publish of {num_pages} pages: lease has {len(self.page_table)} pages, "
                              f"{self.published_pages} already published, {len(toks)} tokens")
        fixed = max(self.resume_tokens, self.published_pages * P)
        if not np.array_equal(toks[:fixed], self.tokens[:fixed]):
            raise MisuseError("publish with tokens that differ from the lease's matched prefix")
        if sid is not None and sid not in self._unpublished_snapshots:
            raise MisuseError(f"snapshot {sid} was not allocated for this lease")


def snapshot_row(snapshot: object) -> int | None:
    """The device state row a publish names: an allocation from ``alloc_snapshot`` or its id."""
    if snapshot is None:
        return None
    ids = getattr(snapshot, "ids", None)
    if ids is not None:
        if not getattr(snapshot, "ok", False) or len(ids) != 1:
            raise MisuseError("publish: snapshot must be one row from alloc_snapshot()")
        return int(ids[0])
    return check_int("publish: snapshot", snapshot, minimum=0, misuse=True,
                     reason="must be an allocation from alloc_snapshot() or its row id")
