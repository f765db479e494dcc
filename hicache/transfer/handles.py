"""What callers of the controller hold: handles of queued ops, acks, typed refusals."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch

from hicache.errors import MisuseError

if TYPE_CHECKING:
    from hicache.transfer.batch import Op


@dataclass(frozen=True)
class Ack:
    """A completed op, returned once by :meth:`TransferController.poll`.

    ``ok`` is True only when every byte of the op landed. On failure ``error`` says why;
    destination rows that ``backup``/``load`` allocated have been freed, rows given to
    ``copy`` hold undefined bytes. ``seq`` is the op's submission number.
    """

    tag: Any
    kind: str          # "backup" | "load" | "copy"
    direction: str     # "d2h" | "h2d"
    source: str        # "page" | "state"
    src_ids: torch.Tensor
    dst_ids: torch.Tensor
    ok: bool
    error: str | None
    seq: int


@dataclass(frozen=True)
class QueueFull:
    """A submission refused because the queue is at a bound; nothing was allocated.

    Drain with ``step()`` and ``poll()`` and submit again.
    """

    queued_ops: int
    queued_bytes: int
    requested_bytes: int
    max_ops: int
    max_bytes: int | None

    @property
    def ok(self) -> bool:
        return False


@dataclass(frozen=True)
class StepReport:
    """What one ``step()`` launched: ops, batches (one per direction and phase), bytes.

    ``phases`` > 1 means some ops touched rows that an earlier op of the other direction
    in the same step also touched, so the step ran in ordered phases (see docs/transfer.md).
    """

    ops: int
    batches: int
    phases: int
    nbytes: int


class CopyHandle:
    """A queued copy. ``dst_ids`` are valid at once; the bytes are valid once acked ok."""

    def __init__(self, op: "Op"):
        self._op = op

    kind = property(lambda self: self._op.kind)
    direction = property(lambda self: self._op.direction)
    source = property(lambda self: self._op.source)
    tag = property(lambda self: self._op.tag)
    seq = property(lambda self: self._op.seq)

    @property
    def src_ids(self) -> torch.Tensor:
        return torch.from_numpy(self._op.src_ids.copy())

    @property
    def dst_ids(self) -> torch.Tensor:
        return torch.from_numpy(self._op.dst_ids.copy())

    @property
    def status(self) -> str:
        """``pending`` (not stepped), ``in_flight``, ``done`` or ``failed``."""
        op = self._op
        if op.cancel_error is not None:
            return "failed"
        if op.batch is None:
            return "pending"
        if not op.batch.is_done():
            return "in_flight"
        return "failed" if op.batch.error else "done"

    @property
    def error(self) -> str | None:
        op = self._op
        if op.cancel_error is not None:
            return op.cancel_error
        return op.batch.error if op.batch is not None and op.batch.is_done() else None

    def done(self) -> bool:
        """True once the op has finished, successfully or not."""
        return self.status in ("done", "failed")

    def wait(self, timeout: float | None = None) -> bool:
        """Block until the op finishes; True if every byte landed.

        False on failure, or when ``timeout`` seconds pass first (then ``done()`` is
        False). Raises :class:`MisuseError` for an op that no ``step()`` has launched yet.
        """
        op = self._op
        if op.cancel_error is not None:
            return False
        if op.batch is None:
            raise MisuseError(f"op {op.seq} ({op.kind}) is not launched yet: call step() first")
        return op.batch.wait(timeout) and op.batch.error is None

    def __repr__(self) -> str:
        return (f"{type(self).__name__}(seq={self.seq}, kind={self.kind!r}, source={self.source!r}, "
                f"n={self._op.src_ids.size}, status={self.status!r})")


class LoadHandle(CopyHandle):
    """A queued load (H2D) whose layers can be waited on one at a time."""

    def wait_layer(self, layer_id: int, timeout: float | None = None) -> bool:
        """Block until model layer ``layer_id`` of every family of this op has landed.

        True means that layer's bytes are in place (a later layer may still fail the op;
        check the ack before publishing). A layer none of the op's families has returns
        at once. With ``load_granularity='batch'`` every layer lands together.
        """
        op = self._op
        if op.cancel_error is not None:
            return False
        if op.batch is None:
            raise MisuseError(f"op {op.seq} ({op.kind}) is not launched yet: call step() first")
        if layer_id not in op.known_layers:
            raise MisuseError(f"layer {layer_id!r} is not a layer of this cache layout")
        if layer_id not in op.layers:
            return op.batch.error is None
        return op.batch.wait_layer(layer_id, timeout)
