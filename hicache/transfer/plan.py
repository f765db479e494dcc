"""What one batched copy moves: validated families, layers and id pairs.

Every pool view is ``[num_layers, capacity, unit_bytes]`` uint8 (see
:class:`hicache.pools.TierPools`); a *unit* is one id's bytes of one layer of one family,
contiguous in memory. A batch copies, for each family (a :class:`RowCopy`), every layer of
every id pair ``src_ids[j] -> dst_ids[j]``. The unit of work the backends schedule is a
*segment*: one layer of one family, all of its pairs::

    RowCopy c4_kv  (layers 2,4,..,42)      segments: (c4_kv, L0) (c4_kv, L1) ... (c4_kv, L20)
    RowCopy c128_kv (layers 3,5,..,41)               (c128_kv, L0) ... (c128_kv, L19)

    per-layer groups (what LoadHandle.wait_layer waits on), by *model* layer id:
        layer 2: [(c4_kv, L0), (c4_indexer, L0)]   layer 3: [(c128_kv, L0)]   ...

Validation happens here, once, before anything is written: ids must be integers in range,
and destinations must be distinct (two writes to one row would race).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable, Sequence

import numpy as np
import torch

from hicache.errors import MisuseError
from hicache.pools import as_id_array


@dataclass(frozen=True)
class RowCopy:
    """One family's part of a batch: every layer of ``src[:, src_ids] -> dst[:, dst_ids]``.

    ``layer_ids`` are the model layer ids of the views' first dimension (the family's
    ``FamilySpec.layer_ids``); they only order the work and label per-layer progress.
    """

    name: str
    src: torch.Tensor
    dst: torch.Tensor
    src_ids: np.ndarray
    dst_ids: np.ndarray
    layer_ids: tuple[int, ...]

    @property
    def num_pairs(self) -> int:
        return int(self.src_ids.size)

    @property
    def unit_bytes(self) -> int:
        return int(self.src.shape[2])

    @property
    def nbytes(self) -> int:
        return self.num_pairs * int(self.src.shape[0]) * self.unit_bytes


@dataclass(frozen=True)
class Segment:
    """One layer (index ``layer`` into the views, model id ``layer_id``) of item ``item``."""

    item: int
    layer: int
    layer_id: int


def _check_view(t: object, what: str) -> torch.Tensor:
    if not isinstance(t, torch.Tensor):
        raise MisuseError(f"{what} must be a torch.Tensor, got {type(t).__name__}")
    if t.dtype != torch.uint8 or t.dim() != 3:
        raise MisuseError(f"{what} must be a [layers, capacity, unit_bytes] uint8 view, "
                          f"got dtype {t.dtype} shape {tuple(t.shape)}")
    if t.shape[2] > 1 and t.stride(2) != 1:
        raise MisuseError(f"{what}: each unit must be contiguous (stride(2) == 1), got strides "
                          f"{tuple(t.stride())}")
    return t


def check_ids(ids: object, capacity: int, what: str, *, unique: bool) -> np.ndarray:
    """Ids as a 1-D int64 array; MisuseError on a non-integer, out-of-range or duplicate id."""
    arr = as_id_array(ids, what=what)
    if arr.size == 0:
        return arr
    srt = np.sort(arr) if unique and arr.size > 1 else arr
    lo, hi = (srt[0], srt[-1]) if srt is not arr else (arr.min(), arr.max())
    if lo < 0 or hi >= capacity:
        bad = arr[(arr < 0) | (arr >= capacity)]
        raise MisuseError(f"{what}: id {int(bad[0])} out of range [0, {capacity})")
    if srt is not arr:
        dup = srt[1:] == srt[:-1]
        if dup.any():
            raise MisuseError(f"{what}: id {int(srt[1:][dup][0])} given twice "
                              "(duplicate destination rows would race)")
    return arr


def _storage_key(t: torch.Tensor) -> tuple[str, int]:
    return (str(t.device), t.untyped_storage().data_ptr())


def make_row_copy(src: torch.Tensor, dst: torch.Tensor, src_ids: object, dst_ids: object, *,
                  name: str = "rows", layer_ids: Sequence[int] | None = None) -> RowCopy:
    """Validate one family's copy and return it as a :class:`RowCopy`."""
    src = _check_view(src, f"{name}: src view")
    dst = _check_view(dst, f"{name}: dst view")
    if src.shape[0] != dst.shape[0] or src.shape[2] != dst.shape[2]:
        raise MisuseError(f"{name}: src {tuple(src.shape)} and dst {tuple(dst.shape)} differ in "
                          "layers or unit bytes")
    if _storage_key(src) == _storage_key(dst) and src.numel() and dst.numel():
        raise MisuseError(f"{name}: src and dst share storage; copies run between two tiers")
    s = check_ids(src_ids, int(src.shape[1]), f"{name}: src_ids", unique=False)
    d = check_ids(dst_ids, int(dst.shape[1]), f"{name}: dst_ids", unique=True)
    if s.size != d.size:
        raise MisuseError(f"{name}: {s.size} src_ids but {d.size} dst_ids")
    lids = tuple(range(src.shape[0])) if layer_ids is None else tuple(int(x) for x in layer_ids)
    if len(lids) != src.shape[0]:
        raise MisuseError(f"{name}: {len(lids)} layer ids for a view of {src.shape[0]} layers")
    return RowCopy(name, src, dst, s, d, lids)


class CopyPlan:
    """A validated batch of :class:`RowCopy` items and its per-layer grouping.

    ``groups(per_layer=True)`` yields one group per model layer id, in increasing order,
    each holding that layer of every family that has it; ``per_layer=False`` one group.
    Segments with no bytes (zero pairs or zero-byte units) are dropped up front.
    """

    def __init__(self, items: Iterable[RowCopy]):
        self.items: tuple[RowCopy, ...] = tuple(items)
        devices = {(str(it.src.device), str(it.dst.device)) for it in self.items}
        if len(devices) > 1:
            raise MisuseError(f"one batch must move between one pair of devices, got {sorted(devices)}")
        segs = [Segment(i, l, it.layer_ids[l]) for i, it in enumerate(self.items)
                if it.num_pairs and it.unit_bytes for l in range(it.src.shape[0])]
        self.segments: tuple[Segment, ...] = tuple(segs)
        self.layer_order: tuple[int, ...] = tuple(sorted({s.layer_id for s in segs}))

    @property
    def nbytes(self) -> int:
        return sum(it.nbytes for it in self.items)

    @property
    def src_device(self) -> torch.device | None:
        return self.items[0].src.device if self.items else None

    @property
    def dst_device(self) -> torch.device | None:
        return self.items[0].dst.device if self.items else None

    def groups(self, per_layer: bool) -> list[tuple[int | None, tuple[Segment, ...]]]:
        """``[(layer_id, segments)]`` in execution order (``layer_id`` None: one group)."""
        if not per_layer:
            return [(None, self.segments)] if self.segments else []
        by_layer: dict[int, list[Segment]] = {lid: [] for lid in self.layer_order}
        for s in self.segments:
            by_layer[s.layer_id].append(s)
        return [(lid, tuple(by_layer[lid])) for lid in self.layer_order]

    def segment_bytes(self, segments: Sequence[Segment]) -> int:
        return sum(self.items[s.item].num_pairs * self.items[s.item].unit_bytes for s in segments)


def element_width(byte_values: Iterable[int], limit: int = 8) -> int:
    """The widest power-of-two element (<= ``limit`` bytes) dividing every value.

    Units, strides and base addresses are all multiples of it, so a copy can move int64
    (or int32 / int16) elements instead of single bytes.
    """
    g = 0
    for v in byte_values:
        g = np.gcd(g, int(v))
    w = limit
    while w > 1 and g % w:
        w //= 2
    return int(w)
