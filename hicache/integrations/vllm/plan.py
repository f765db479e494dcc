"""What the scheduler's half of ``HiCacheConnector`` hands its worker each step, in vLLM's
connector metadata: plain ids, no vLLM or hicache object (no vLLM import)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class CopyOp:
    """One request's pages <-> blocks for one step, per KV cache group (``pages[g]`` pairs
    with ``blocks[g]``). For a full-attention group the units are hicache page ids; for a
    sliding-window group, slots of a snapshot row (:func:`~.windows.window_plan`). ``key``:
    the save id the worker acks (a save), or 0 (a load: the worker waits on ``req``'s
    lease)."""

    req: str
    key: int
    pages: tuple[tuple[int, ...], ...]
    blocks: tuple[tuple[int, ...], ...]


@dataclass(frozen=True)
class StepPlan:
    """What the worker does this step. ``failed``: blocks promised to vLLM that hicache
    could not lease after all; the worker reports them as load errors (vLLM recomputes)."""

    loads: tuple[CopyOp, ...] = ()
    saves: tuple[CopyOp, ...] = ()
    failed: tuple[int, ...] = ()
