"""Turning what callers hand us (numpy, torch, bytearray, memoryview) into flat byte views.

Backends read straight into, and write straight from, the caller's memory: a row of a host
pool (``TierPools.object_view("page")[i]`` with the page_first layout), a numpy array, a
bytearray. A *value* is one buffer or a sequence of buffers (scatter/gather list); the
L3 object codec uses ``[header, payload]`` so the header never has to be glued to the
payload with a copy.

A piece of a put value may also be a :class:`Deferred`: bytes made only when the backend is
about to send them. The store's object header carries a checksum of the payload; a backend
that streams (Redis) resolves each header just before its object goes on the wire, so the
checksum of object i+1 is computed while object i is still being read by the server instead
of hashing the whole batch before the first byte is sent.

torch is not imported here: a tensor is recognised by its ``numpy`` method (CPU tensors,
pinned or not, share memory with the array it returns).
"""

from __future__ import annotations

from typing import Any, Callable, Optional, Sequence, Union

import numpy as np

from hicache.errors import MisuseError

Buffer = Any  # anything exposing the buffer protocol, or a CPU torch tensor
Value = Union[Buffer, Sequence[Buffer]]


class Deferred:
    """A put-value piece of known length whose bytes ``make()`` produces on first use."""

    __slots__ = ("nbytes", "_make", "_bytes")

    def __init__(self, nbytes: int, make: Callable[[], bytes]):
        self.nbytes = nbytes
        self._make = make
        self._bytes: Optional[bytes] = None

    def resolve(self) -> bytes:
        if self._bytes is None:
            b = self._make()
            assert len(b) == self.nbytes, f"deferred piece made {len(b)} bytes, announced {self.nbytes}"
            self._bytes = b
        return self._bytes


def byte_view(obj: Buffer, *, writable: bool) -> memoryview:
    """A 1-D unsigned-byte memoryview over ``obj``'s memory (no copy).

    Raises :class:`MisuseError` for non-contiguous memory, device tensors, or a read-only
    buffer where a writable one is needed.
    """
    if isinstance(obj, memoryview):
        mv = obj
    elif isinstance(obj, Deferred):
        if writable:
            raise MisuseError("a deferred piece cannot be a read destination")
        mv = memoryview(obj.resolve())
    elif isinstance(obj, (bytes, bytearray)):
        mv = memoryview(obj)
    else:
        if hasattr(obj, "numpy") and hasattr(obj, "is_contiguous"):  # a torch tensor
            if getattr(obj, "device", None) is not None and obj.device.type != "cpu":
                raise MisuseError(f"L3 buffers must be in host memory, got a {obj.device} tensor")
            if not obj.is_contiguous():
                raise MisuseError("L3 buffers must be contiguous; got a strided tensor")
            obj = obj.detach().numpy()
        if isinstance(obj, np.ndarray):
            if not obj.flags.c_contiguous:
                raise MisuseError("L3 buffers must be C-contiguous; got a strided array")
            obj = obj.reshape(-1).view(np.uint8)
        try:
            mv = memoryview(obj)
        except TypeError:
            raise MisuseError(f"not a byte buffer: {type(obj).__name__}") from None
    if not mv.contiguous:
        raise MisuseError("L3 buffers must be contiguous")
    if mv.format != "B" or mv.ndim != 1:
        mv = mv.cast("B")
    if writable and mv.readonly:
        raise MisuseError("L3 read destination is read-only")
    return mv


def value_views(value: Value, *, writable: bool) -> list[memoryview]:
    """One value (a buffer or a list of buffers) as a list of flat byte views."""
    if isinstance(value, (list, tuple)):
        return [byte_view(v, writable=writable) for v in value]
    return [byte_view(value, writable=writable)]


def send_pieces(value: Value) -> list:
    """A put value as flat read-only views, :class:`Deferred` pieces left unresolved.

    For streaming backends, which call :func:`resolve_pieces` just before sending.
    """
    items = value if isinstance(value, (list, tuple)) else [value]
    return [v if isinstance(v, Deferred) else byte_view(v, writable=False) for v in items]


def resolve_pieces(pieces: Sequence) -> list:
    """Resolve the :class:`Deferred` pieces of a :func:`send_pieces` list."""
    return [memoryview(p.resolve()) if isinstance(p, Deferred) else p for p in pieces]


def total_bytes(views: Sequence[memoryview]) -> int:
    return sum(v.nbytes for v in views)


def consume(pending: list[memoryview], n: int) -> None:
    """Drop the first ``n`` bytes of ``pending`` after a partial vectored send/write/read."""
    while n:
        if n >= pending[0].nbytes:
            n -= pending.pop(0).nbytes
        else:
            pending[0] = pending[0][n:]
            n = 0
