"""The pools of one tier (device L1 or host L2): two anchors and one sidecar per family.

Sidecars own bytes and no allocator. Each exposes the same logical view,
``[num_layers, capacity, unit_bytes]`` uint8, whatever the physical layout:

``layer_first`` (device, and host option): one tensor per family, layer-major::

    c4_kv:  [layer 0: id 0 | id 1 | ...][layer 1: id 0 | id 1 | ...] ...

``page_first`` (host option): one tensor per anchor, one contiguous *object* per id that
holds every family on that anchor, all layers -- the unit shipped to L3 without a copy::

    page id 0: [c4_kv L0..L20 | c4_indexer L0..L20 | c128_kv L0..L19]
    page id 1: [ ... ]

A family's logical view of a page_first buffer is a strided view into it.
"""

from __future__ import annotations

from enum import Enum
from dataclasses import dataclass
from typing import Literal

import numpy as np
import torch

from hicache.errors import MisuseError
from hicache.layout import CacheLayout, FamilySpec
from hicache.pools.anchor import AllocResult, IndexAllocator, NoRoom, as_id_array

HostLayout = Literal["layer_first", "page_first"]
HOST_LAYOUTS = ("layer_first", "page_first")
class Tier(str, Enum):
    """Which pool tier: the device (L1) or the host (L2). Compares equal to its value."""

    DEVICE = "device"
    HOST = "host"


class Source(str, Enum):
    """Which anchor an id comes from: a history page or a state snapshot."""

    PAGE = "page"
    STATE = "state"


SOURCES = (Source.PAGE.value, Source.STATE.value)


@dataclass(frozen=True)
class ObjectSlot:
    """Where one family sits inside a page_first object: ``[offset, offset + nbytes)``."""

    family: str
    offset: int
    num_layers: int
    unit_bytes: int

    @property
    def nbytes(self) -> int:
        return self.num_layers * self.unit_bytes


def object_slots(layout: CacheLayout, source: str) -> tuple[ObjectSlot, ...]:
    """The byte layout of one object of ``source`` (families in layout order)."""
    slots, off = [], 0
    for fam in layout.families_on(source):
        unit = fam.bytes_per_id_per_layer(layout.page_tokens)
        slots.append(ObjectSlot(fam.name, off, fam.num_layers, unit))
        off += fam.num_layers * unit
    return tuple(slots)


class SidecarPool:
    """One family's bytes in one tier, indexed by the ids of the anchor it names."""

    def __init__(self, family: FamilySpec, tier: str, data: torch.Tensor, rows: int):
        assert data.dim() == 3 and data.shape[0] == family.num_layers, (
            f"{family.name}: data must be [layers, capacity, unit], got {tuple(data.shape)}")
        self.family = family
        self.tier = tier
        self.data = data
        self.rows = rows  # ids >= rows cannot be bound (a sidecar with a smaller budget)
        self._bound = np.zeros(data.shape[1], dtype=bool)

    @property
    def name(self) -> str:
        return self.family.name

    @property
    def source(self) -> str:
        return self.family.source

    @property
    def unit_bytes(self) -> int:
        return int(self.data.shape[2])

    def bind(self, ids: np.ndarray) -> bool:
        """Take the rows of freshly allocated anchor ids; False if any is out of budget."""
        if ids.size and int(ids.max()) >= self.rows:
            return False
        assert not self._bound[ids].any(), f"{self.tier}/{self.name}: row bound twice"
        self._bound[ids] = True
        return True

    def unbind(self, ids: np.ndarray) -> None:
        assert self._bound[ids].all(), f"{self.tier}/{self.name}: unbinding a free row"
        self._bound[ids] = False

    def bound_ids(self) -> np.ndarray:
        return np.flatnonzero(self._bound)


class TierPools:
    """Anchors and sidecars of one tier.

    ``alloc(source, n)`` is all-or-nothing: the anchor hands out ids, every sidecar on that
    anchor binds them, and if any sidecar refuses, everything is rolled back and a
    :class:`NoRoom` naming it is returned.
    """

    def __init__(self, layout: CacheLayout, tier: str, *, num_pages: int, num_snapshots: int,
                 device: torch.device | str = "cpu", host_layout: HostLayout = "layer_first",
                 pin_memory: bool = False, sidecar_rows: dict[str, int] | None = None):
        if host_layout not in HOST_LAYOUTS:
            raise MisuseError(f"host_layout must be one of {HOST_LAYOUTS}, got {host_layout!r}")
        self.layout = layout
        self.tier = tier
        self.device = torch.device(device)
        self.host_layout = host_layout
        capacity = {"page": num_pages, "state": num_snapshots}
        self.anchors = {s: IndexAllocator(f"{tier}/{s}_anchor", capacity[s]) for s in SOURCES}
        self.objects: dict[str, torch.Tensor] = {}
        self.slots = {s: object_slots(layout, s) for s in SOURCES}
        rows = sidecar_rows or {}
        self.sidecars: dict[str, SidecarPool] = {}

        def empty(*shape: int) -> torch.Tensor:
            return torch.empty(shape, dtype=torch.uint8, device=self.device,
                               pin_memory=pin_memory and self.device.type == "cpu")

        for source in SOURCES:
            cap = capacity[source]
            if host_layout == "page_first":
                obj_bytes = sum(s.nbytes for s in self.slots[source])
                buf = empty(cap, obj_bytes)
                self.objects[source] = buf
            for slot in self.slots[source]:
                fam = layout.family(slot.family)
                if host_layout == "page_first":
                    view = buf[:, slot.offset: slot.offset + slot.nbytes]
                    view = view.reshape(cap, slot.num_layers, slot.unit_bytes).permute(1, 0, 2)
                else:
                    view = empty(slot.num_layers, cap, slot.unit_bytes)
                self.sidecars[fam.name] = SidecarPool(fam, tier, view, rows.get(fam.name, cap))

    # -- allocation ---------------------------------------------------------------------
    def capacity(self, source: str) -> int:
        return self.anchors[source].capacity

    def num_free(self, source: str) -> int:
        return self.anchors[source].num_free

    def num_used(self, source: str) -> int:
        return self.anchors[source].num_used

    def alloc(self, source: str, n: int) -> AllocResult:
        """Allocate ``n`` ids of ``source`` in the anchor and every sidecar, or none."""
        anchor = self._anchor(source)
        result = anchor.alloc(n)
        if not result.ok:
            return result
        ids = result.ids.numpy()
        done: list[SidecarPool] = []
        for sc in self.sidecars.values():
            if sc.source != source:
                continue
            if not sc.bind(ids):
                for prev in done:
                    prev.unbind(ids)
                anchor.free(ids)
                return NoRoom(requested=n, available=anchor.num_free, blocked_by=sc.name)
            done.append(sc)
        return result

    def free(self, source: str, ids: object) -> None:
        """Free ids in the anchor and every sidecar. Double free raises MisuseError."""
        arr = as_id_array(ids)
        anchor = self._anchor(source)
        anchor.check_ids(arr, must_be_used=True)
        for sc in self.sidecars.values():
            if sc.source == source:
                sc.unbind(arr)
        anchor.free(arr)

    def _anchor(self, source: str) -> IndexAllocator:
        try:
            return self.anchors[source]
        except KeyError:
            raise MisuseError(f"unknown index source {source!r}; expected one of {SOURCES}") from None

    # -- bytes --------------------------------------------------------------------------
    def view(self, family: str) -> torch.Tensor:
        """The ``[num_layers, capacity, unit_bytes]`` uint8 view of a family."""
        try:
            return self.sidecars[family].data
        except KeyError:
            raise MisuseError(f"{self.tier}: unknown family {family!r}") from None

    def object_view(self, source: str) -> torch.Tensor:
        """``[capacity, object_bytes]``: one contiguous object per id (page_first only)."""
        if source not in self.objects:
            raise MisuseError(f"{self.tier}: objects exist only with host_layout='page_first'")
        return self.objects[source]

    @property
    def nbytes(self) -> int:
        if self.objects:
            return sum(t.numel() for t in self.objects.values())
        return sum(sc.data.numel() for sc in self.sidecars.values())

    # -- checks -------------------------------------------------------------------------
    def check_integrity(self) -> None:
        """Assert every anchor balances and every sidecar's rows match its anchor."""
        for source, anchor in self.anchors.items():
            anchor.check_integrity()
            used = anchor.used_ids()
            for sc in self.sidecars.values():
                if sc.source == source:
                    assert np.array_equal(sc.bound_ids(), used), (
                        f"{self.tier}/{sc.name}: bound rows differ from {source} anchor's ids")
