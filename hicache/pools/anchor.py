"""Anchors: pure index allocators that own no bytes.

A tier has two anchors. The *page anchor* hands out history page ids; the *state anchor*
hands out snapshot ids. Every family's pool (a *sidecar*) is indexed by the id of the
anchor it names, so one allocation yields the row in every family at once::

    page anchor:   alloc(2) -> [7, 3]
    c4_kv pool:        rows 7 and 3 (all layers)
    c4_indexer pool:   rows 7 and 3
    c128_kv pool:      rows 7 and 3

The free list is a numpy stack so allocating or freeing thousands of ids is a few vector
operations; a ``used`` bitmap catches double allocation and double free.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Union

import numpy as np
import torch

from hicache.units import check_int
from hicache.errors import MisuseError


@dataclass(frozen=True)
class Allocation:
    """A successful allocation: ``ids`` is an int64 CPU tensor of distinct ids."""

    ids: torch.Tensor

    @property
    def ok(self) -> bool:
        return True

    def __len__(self) -> int:
        return int(self.ids.numel())


@dataclass(frozen=True)
class NoRoom:
    """An allocation that could not be served; nothing was allocated.

    ``available`` is how many ids were free; ``blocked_by`` names the sidecar that refused
    when the anchor itself had room (``None`` when the anchor ran out).
    """

    requested: int
    available: int
    blocked_by: str | None = None

    @property
    def ok(self) -> bool:
        return False

    @property
    def ids(self) -> torch.Tensor:
        """There are none: asking is a bug in the caller (check ``ok`` first)."""
        raise MisuseError(f"NoRoom has no ids: {self.requested} were asked, {self.available} free")


AllocResult = Union[Allocation, NoRoom]


def as_id_array(ids: object, *, what: str = "ids") -> np.ndarray:
    """Normalise a tensor / list / array of ids to a 1-D int64 numpy array (a copy)."""
    if isinstance(ids, np.ndarray) and ids.dtype == np.int64 and ids.ndim == 1:
        return ids.copy()   # the common case, without the general checks' overhead
    if isinstance(ids, torch.Tensor):
        if ids.dtype.is_floating_point or ids.dtype == torch.bool:
            raise MisuseError(f"{what} must be integers, got dtype {ids.dtype}")
        arr = ids.detach().to("cpu", torch.int64).numpy().copy()
    else:
        arr = np.asarray(ids)
        if arr.size and arr.dtype.kind not in "iu":   # integers (not bool, not float)
            raise MisuseError(f"{what} must be integers, got {arr.dtype}")
        arr = arr.astype(np.int64, copy=True)
    if arr.ndim != 1:
        arr = arr.reshape(-1)
    return arr


def check_ids(name: str, capacity: int, arr: np.ndarray, used: Callable[[np.ndarray], np.ndarray], *,
              must_be_used: bool) -> None:
    """Raise :class:`MisuseError` for ids of ``arr`` out of ``[0, capacity)``, given twice, or
    (``used(arr)``: their used flags) free when they ``must_be_used`` / used when not."""
    if arr.size == 0:
        return
    # one sort finds both the range and the duplicates (a single id needs neither)
    srt = arr if arr.size == 1 else np.sort(arr)
    if srt[0] < 0 or srt[-1] >= capacity:
        bad = arr[(arr < 0) | (arr >= capacity)]
        raise MisuseError(f"{name}: id {int(bad[0])} out of range [0, {capacity})")
    if arr.size > 1:
        dup = srt[1:] == srt[:-1]
        if dup.any():
            raise MisuseError(f"{name}: id {int(srt[1:][dup][0])} given twice")
    state = used(arr)
    wrong = arr[~state] if must_be_used else arr[state]
    if wrong.size:
        what = "is not allocated (double free?)" if must_be_used else "is already allocated"
        raise MisuseError(f"{name}: id {int(wrong[0])} {what}")


class IndexAllocator:
    """A fixed-capacity allocator of integer ids ``[0, capacity)``; owns no bytes."""

    def __init__(self, name: str, capacity: int):
        assert capacity >= 0, f"{name}: capacity must be >= 0, got {capacity}"
        self.name = name
        self.capacity = capacity
        # Low ids on top of the stack first: a fresh pool hands out 0, 1, 2, ...
        self._free = np.arange(capacity - 1, -1, -1, dtype=np.int64)
        self._top = capacity
        self._used = np.zeros(capacity, dtype=bool)

    @property
    def num_free(self) -> int:
        return self._top

    @property
    def num_used(self) -> int:
        return self.capacity - self._top

    def alloc(self, n: int) -> AllocResult:
        """Allocate ``n`` distinct ids, or return :class:`NoRoom` and allocate nothing."""
        n = check_int(f"{self.name}: alloc count", n, misuse=True)
        if n > self._top:
            return NoRoom(requested=n, available=self._top)
        ids = self._free[self._top - n: self._top][::-1].copy()
        assert not self._used[ids].any(), f"{self.name}: free list holds a used id"
        self._top -= n
        self._used[ids] = True
        return Allocation(torch.from_numpy(ids))

    def check_ids(self, arr: np.ndarray, *, must_be_used: bool) -> None:
        """Raise :class:`MisuseError` for out-of-range, duplicate or wrong-state ids."""
        check_ids(self.name, self.capacity, arr, lambda a: self._used[a], must_be_used=must_be_used)

    def free(self, ids: object, *, checked: bool = False) -> None:
        """Return ids to the pool. Freeing an id that is not allocated raises (``checked``:
        the caller has just run :meth:`check_ids` on this int64 array)."""
        arr = ids if checked and isinstance(ids, np.ndarray) else as_id_array(ids)
        if not checked:
            self.check_ids(arr, must_be_used=True)
        self._used[arr] = False
        self._free[self._top: self._top + arr.size] = arr[::-1]
        self._top += arr.size

    def is_used(self, ids: object) -> np.ndarray:
        arr = as_id_array(ids)
        return self._used[arr]

    def used_ids(self) -> np.ndarray:
        return np.flatnonzero(self._used)

    def check_integrity(self) -> None:
        """Assert free + used == capacity and the free stack matches the bitmap."""
        free = self._free[: self._top]
        assert self._top + int(self._used.sum()) == self.capacity, (
            f"{self.name}: free {self._top} + used {int(self._used.sum())} != {self.capacity}")
        assert np.unique(free).size == free.size, f"{self.name}: duplicate id in free list"
        assert not self._used[free].any(), f"{self.name}: an id is both free and used"
