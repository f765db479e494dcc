"""Turning what callers hand us (numpy, torch, bytearray, memoryview) into flat byte views.

Backends read straight into, and write straight from, the caller's memory: a row of a host
pool (``TierPools.object_view("page")[i]`` with the page_first layout), a numpy array, a
bytearray. A *value* is one buffer or a sequence of buffers (scatter/gather list); the
L3 object codec uses ``[header, payload]`` so the header never has to be glued to the
payload with a copy.

torch is not imported here: a tensor is recognised by its ``numpy`` method (CPU tensors,
pinned or not, share memory with the array it returns).
"""

from __future__ import annotations

from typing import Any, Sequence, Union

import numpy as np

from hicache.errors import MisuseError

Buffer = Any  # anything exposing the buffer protocol, or a CPU torch tensor
Value = Union[Buffer, Sequence[Buffer]]


def byte_view(obj: Buffer, *, writable: bool) -> memoryview:
    """A 1-D unsigned-byte memoryview over ``obj``'s memory (no copy).

    Raises :class:`MisuseError` for non-contiguous memory, device tensors, or a read-only
    buffer where a writable one is needed.
    """
    if isinstance(obj, memoryview):
        mv = obj
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


def total_bytes(views: Sequence[memoryview]) -> int:
    return sum(v.nbytes for v in views)
