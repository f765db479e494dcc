"""Copies between the tiers that the cache has submitted and not yet applied.

:class:`Copies` owns the :class:`~hicache.transfer.TransferController`, the handle of every
submitted copy (keyed by its tag: a backup or a load record) and the acks it has collected
but nobody has applied yet. It knows nothing of the tree: the facade applies each ack by
handing it to the part that owns what the copy changed.

When acks take effect -- the rule that keeps leases honest::

    submit() under a full queue    wait for copies in flight, *collect* their acks
    run_now(tag)                   wait for one copy, hand back its ack alone
    take_acks()                    every collected ack, in submission order
                                   (the facade calls it from poll() and drain() only)

So ``load()``, ``alloc_pages()`` and ``publish()`` never see another request's copy land or
fail under their feet: a load that failed meanwhile keeps its ticket until the engine
polls, and every lease that depends on it sees the failure through the handle.
"""

from __future__ import annotations

from typing import Any, Callable

import numpy as np

from hicache.pools import TieredPools
from hicache.transfer import (Ack, CopyHandle, Direction, FaultInjector, QueueFull, TransferConfig,
                              TransferController)


class Copies:
    """The transfer controller and the copies in flight (see module docstring)."""

    def __init__(self, pools: TieredPools, cfg: TransferConfig, *, fault_injector: FaultInjector | None = None):
        self._ctl = TransferController(pools, cfg, fault_injector=fault_injector)
        self._handles: dict[Any, CopyHandle] = {}  # tag -> handle, from submit until applied
        self._acks: list[Ack] = []                  # collected from the controller, not applied

    # -- submitting -----------------------------------------------------------------------
    def submit(self, direction: Direction, source: str, src: np.ndarray, dst: np.ndarray, tag: Any) -> CopyHandle:
        """Queue one copy into rows the caller allocated; under backpressure wait for room."""
        handle = self._ctl.copy(direction, source, src, dst, tag=tag)
        while isinstance(handle, QueueFull):
            self._wait_for_room()
            handle = self._ctl.copy(direction, source, src, dst, tag=tag)
        assert tag not in self._handles, f"tag {tag!r} submitted twice"
        self._handles[tag] = handle
        return handle

    def _wait_for_room(self) -> None:
        """Launch what is queued and wait for every copy in flight; collect, not apply, acks."""
        self._ctl.step()
        for handle in list(self._handles.values()):
            handle.wait()
        before = len(self._acks)
        self._acks.extend(self._ctl.poll())
        assert len(self._acks) > before, "transfer queue full with no copy in flight"

    def run_now(self, tag: Any) -> Ack:
        """Launch, wait for and hand back the ack of one submitted copy (a synchronous
        write_back eviction); the acks of other copies stay collected, unapplied."""
        handle = self._handles[tag]
        self._ctl.step()
        handle.wait()
        self._acks.extend(self._ctl.poll())
        own = [a for a in self._acks if a.tag is tag]
        assert len(own) == 1, f"no single ack for {tag!r}"
        self._acks = [a for a in self._acks if a.tag is not tag]
        del self._handles[tag]
        return own[0]

    # -- progress -----------------------------------------------------------------------
    def step(self) -> None:
        """Launch every queued copy (one batched transfer per family and direction)."""
        self._ctl.step()

    @property
    def launcher(self) -> Callable[[], object]:
        """What a lease calls to launch its queued loads (on the engine thread)."""
        return self._ctl.step

    def take_acks(self) -> list[Ack]:
        """Every finished copy's ack, in submission order; each is handed out once."""
        self._acks.extend(self._ctl.poll())
        acks, self._acks = self._acks, []
        for ack in acks:
            self._handles.pop(ack.tag, None)
        return acks

    def wait_all(self, timeout: float | None = None) -> None:
        """Launch what is queued and wait for every copy in flight -- every launched batch
        of the controller, a lease's loads included (drain, shutdown, ``poll(wait=True)``)."""
        self._ctl.step()
        self._ctl.wait_launched(timeout)

    # -- what integrity checks and stats read ---------------------------------------------
    def tags(self) -> list[Any]:
        """Tags of every copy submitted and not yet applied (in flight or collected)."""
        return list(self._handles)

    def handles(self) -> list[CopyHandle]:
        return list(self._handles.values())

    def stats(self) -> dict:
        """The controller's per-direction bytes, seconds, ops, batches and failures."""
        return self._ctl.stats()

    # -- tests and lifetime ---------------------------------------------------------------
    def set_fault_injector(self, fault_injector: FaultInjector | None) -> None:
        """Install (or clear) a hook called per copied layer that may raise TransferError."""
        self._ctl.set_fault_injector(fault_injector)

    def shutdown(self) -> None:
        self._ctl.shutdown(wait=True)
