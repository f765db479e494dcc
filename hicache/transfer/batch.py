"""Ops, batches and the ordering rule that merges a step's ops safely.

A step merges pending ops into one batch per direction: one copy per (family, direction).
Merging reorders ops, so it must never change what any op reads or writes. The rows an
op touches, per anchor (``page`` / ``state``)::

    backup / copy d2h:  reads device rows src_ids   writes host rows   dst_ids
    load   / copy h2d:  reads host rows   src_ids   writes device rows dst_ids

Two ops *conflict* when one writes a row the other reads or writes. Rule, walking the
pending ops in submission order:

* an op conflicting with an earlier op of the *same* direction in the current phase
  (two writes to one row) closes the phase: the later write must land last;
* an op conflicting with the current batch of the *other* direction must run after that
  batch; the phase records "other direction first". If the phase already promised the
  opposite order, the phase closes instead.

Phases run in order. Across steps, a batch waits for every earlier, unacked batch of the
other direction it conflicts with (CUDA: ``wait_event`` on that batch's stream; CPU: the
worker waits on its event), and batches of one direction run FIFO on one stream/thread.
So a load submitted after a backup of the same host rows always reads the backed-up bytes,
and a backup of rows a load fills reads the loaded bytes. A batch whose dependency failed
fails too: nothing downstream of a failed copy is acked as good.
"""

from __future__ import annotations

import threading
import time
from enum import Enum
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from hicache.transfer.plan import CopyPlan, Segment

class Direction(str, Enum):
    """Which way a copy goes: device to host (a backup) or host to device (a load)."""

    D2H = "d2h"
    H2D = "h2d"


DIRECTIONS = (Direction.D2H.value, Direction.H2D.value)
OTHER = {"d2h": "h2d", "h2d": "d2h"}


@dataclass(eq=False)
class Op:
    """One submitted copy (internal; callers hold its :class:`CopyHandle`)."""

    seq: int
    kind: str
    direction: str
    source: str
    src_ids: np.ndarray
    dst_ids: np.ndarray
    tag: Any
    owns_dst: bool            # dst rows were allocated by backup/load: freed on failure
    nbytes: int
    layers: frozenset         # model layer ids this op's families cover
    known_layers: frozenset   # every layer id of the layout
    batch: "Batch | None" = None
    cancel_error: str | None = None  # failed before launch (shutdown)
    after: list["Batch"] = field(default_factory=list)  # launched batches (other direction) writing its src rows


@dataclass(frozen=True)
class FaultPoint:
    """Where a fault injector is called: before each launch group of a batch."""

    direction: str
    batch_seq: int
    layer_id: int | None
    op_seqs: tuple[int, ...]
    tags: tuple[Any, ...]


def plan_phases(ops: list[Op]) -> list[list[tuple[str, list[Op]]]]:
    """Cut ``ops`` (submission order) into phases of at most one batch per direction.

    Each phase is ``[(direction, ops), ...]`` in the order its batches must be launched.
    """
    phases: list[list[tuple[str, list[Op]]]] = []
    cur: dict[str, list[Op]] = {d: [] for d in DIRECTIONS}
    reads: dict[str, set] = {d: set() for d in DIRECTIONS}   # (source, id), tier implied
    writes: dict[str, set] = {d: set() for d in DIRECTIONS}
    first: str | None = None  # direction that must run first in this phase, if any

    def close() -> None:
        nonlocal first
        order = [first, OTHER[first]] if first else list(DIRECTIONS)
        phase = [(d, cur[d]) for d in order if cur[d]]
        if phase:
            phases.append(phase)
        for d in DIRECTIONS:
            cur[d], reads[d], writes[d] = [], set(), set()
        first = None

    for op in ops:
        x, y = op.direction, OTHER[op.direction]
        r = {(op.source, int(i)) for i in op.src_ids}
        w = {(op.source, int(i)) for i in op.dst_ids}
        if w & writes[x]:
            close()
        # x reads tier A (src) and writes tier B (dst); y reads B and writes A.
        if r & writes[y] or w & reads[y]:
            if first == x:
                close()
            elif cur[y]:
                first = y
        cur[x].append(op)
        reads[x] |= r
        writes[x] |= w
    close()
    return phases


class Batch:
    """One launched transfer: every op of one direction of one phase, all families.

    Completion state is shared with the executor: a CPU worker sets ``landed`` and
    ``done``; on CUDA ``events`` (one per group) are queried.
    """

    def __init__(self, seq: int, direction: str, ops: list[Op], plan: CopyPlan | None,
                 groups: list[tuple[int | None, tuple[Segment, ...]]], nbytes: int | None = None):
        # plan None: pools without bytes -- nothing to copy; ``nbytes`` is what a copy of
        # these ops would move, ``groups`` the launches it would make (segments empty)
        assert plan is not None or nbytes is not None, "a batch without a plan needs its nominal bytes"
        self.seq = seq
        self.direction = direction
        self.ops = ops
        self.plan = plan
        self.groups = groups
        self.group_of = {lid: i for i, (lid, _) in enumerate(groups) if lid is not None}
        self.nbytes = plan.nbytes if plan is not None else int(nbytes or 0)
        self.rows: dict[str, tuple[np.ndarray, np.ndarray]] = {}
        for source in {op.source for op in ops}:
            mine = [op for op in ops if op.source == source]
            self.rows[source] = (np.unique(np.concatenate([op.src_ids for op in mine])),
                                 np.unique(np.concatenate([op.dst_ids for op in mine])))
        self.deps: list[Batch] = []
        self.error: str | None = None
        self.cancelled = False
        self.seconds = 0.0
        self.launches = 0
        self.landed = 0
        self.cond = threading.Condition()
        self.done_event = threading.Event()
        self.events: list | None = None  # CUDA events, one per group
        self.start_event: Any = None     # CUDA event at launch (timing)
        self.keep: list = []             # tensors an async launch still reads

    def conflicts(self, other: "Batch") -> bool:
        """True if ``other`` (the other direction) touches a row this batch touches."""
        assert other.direction != self.direction, "same-direction batches are ordered FIFO"
        for source, (src, dst) in self.rows.items():
            if source not in other.rows:
                continue
            osrc, odst = other.rows[source]
            if np.intersect1d(src, odst).size or np.intersect1d(dst, osrc).size:
                return True
        return False

    # -- completion ---------------------------------------------------------------------
    def fail(self, error: str) -> None:
        if self.error is None:
            self.error = error
        self.finish()

    def finish(self) -> None:
        with self.cond:
            self.done_event.set()
            self.cond.notify_all()

    def set_landed(self, n: int) -> None:
        with self.cond:
            self.landed = n
            self.cond.notify_all()

    def _refresh(self) -> None:
        """CUDA: notice completion (or an asynchronous error) of the last event."""
        if self.events is None or self.done_event.is_set():
            return
        try:
            if all(e.query() for e in self.events[-1:]):
                if self.start_event is not None and self.events:
                    self.seconds = self.start_event.elapsed_time(self.events[-1]) / 1000.0
                self.finish()
        except RuntimeError as exc:  # a CUDA error surfaces here, asynchronously
            self.fail(f"{type(exc).__name__}: {exc}")

    def is_done(self) -> bool:
        self._refresh()
        return self.done_event.is_set()

    def wait(self, timeout: float | None = None) -> bool:
        """True once finished (ok or failed); False if ``timeout`` passed first."""
        if self.events is None:
            return self.done_event.wait(timeout)
        return _poll_until(self.is_done, timeout)

    def wait_layer(self, layer_id: int, timeout: float | None = None) -> bool:
        """True once the group holding ``layer_id`` has landed and nothing has failed."""
        idx = self.group_of.get(layer_id, len(self.groups) - 1)
        if self.events is None:
            with self.cond:
                ok = self.cond.wait_for(lambda: self.landed > idx or self.done_event.is_set(), timeout)
                return ok and self.landed > idx and self.error is None
        if idx < 0:
            return self.wait(timeout) and self.error is None

        events = self.events

        def landed() -> bool:
            self._refresh()
            try:
                return self.done_event.is_set() or events[idx].query()
            except RuntimeError as exc:
                self.fail(f"{type(exc).__name__}: {exc}")
                return True
        return _poll_until(landed, timeout) and self.error is None


def _poll_until(pred, timeout: float | None) -> bool:
    deadline = None if timeout is None else time.monotonic() + timeout
    pause = 20e-6
    while not pred():
        if deadline is not None and time.monotonic() >= deadline:
            return False
        time.sleep(pause)
        pause = min(pause * 2, 1e-3)
    return True
