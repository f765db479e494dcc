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

``shared`` budget (:mod:`hicache.pools.arena`): one buffer per tier holds both object
arrays, pages from the low end and snapshots from the high end, page_first on every tier::

    arena: [page 0 | page 1 | ...  middle (free)  ... | state S-2 | state S-1]

Its family views are derived exactly as for page_first, so copies need nothing new.

Pools without bytes (``device="meta"``, what ``PoolConfig.bytes_mode="none"`` builds for a
policy-only replay): every tensor above is a ``meta`` tensor -- the same shapes, strides and
object geometry, no storage -- so a 100 GiB budget costs only its ids' bookkeeping. The
anchors, the arena and the sidecars' bound rows are kept exactly as with bytes, and
:meth:`TierPools.move` moves ids only. Reading or writing such a view is a bug (torch
raises when its data is asked for).
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
from hicache.pools.arena import ArenaAllocator, ArenaSide

HostLayout = Literal["layer_first", "page_first"]
HOST_LAYOUTS = ("layer_first", "page_first")
BudgetMode = Literal["shared", "split"]
BUDGET_MODES = ("shared", "split")

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

    Two budget modes (``budget``):

    ``split``   ``num_pages`` and ``num_snapshots`` fixed ids, one :class:`IndexAllocator`
                each; ``layer_first`` (the device) or ``page_first`` (a host option).
    ``shared``  ``arena_bytes`` in one buffer both kinds share (:mod:`hicache.pools.arena`),
                page_first objects on every tier; ``anchors[source]`` is an
                :class:`ArenaSide` of one :class:`ArenaAllocator`; ``state_cap_bytes``
                optionally bounds the snapshots. :meth:`move` relocates objects so a
                region can be compacted.
    """

    def __init__(self, layout: CacheLayout, tier: str, *, num_pages: int | None = None,
                 num_snapshots: int | None = None, device: torch.device | str = "cpu",
                 host_layout: HostLayout | None = None, pin_memory: bool = False,
                 sidecar_rows: dict[str, int] | None = None, arena_bytes: int | None = None,
                 state_cap_bytes: int | None = None):
        shared = arena_bytes is not None
        if shared and (num_pages is not None or num_snapshots is not None or sidecar_rows):
            raise MisuseError("a shared arena derives its page and snapshot counts from arena_bytes")
        if not shared and (num_pages is None or num_snapshots is None):
            raise MisuseError("split pools need num_pages and num_snapshots (or give arena_bytes)")
        host_layout = host_layout or ("page_first" if shared else "layer_first")
        if host_layout not in HOST_LAYOUTS:
            raise MisuseError(f"host_layout must be one of {HOST_LAYOUTS}, got {host_layout!r}")
        if shared and host_layout != "page_first":
            raise MisuseError("a shared arena holds page_first objects; layer_first needs split pools")
        self.layout = layout
        self.tier = tier
        self.device = torch.device(device)
        self.holds_bytes = self.device.type != "meta"   # meta: ids and geometry, no bytes
        self.host_layout: HostLayout = host_layout
        self.budget: BudgetMode = "shared" if shared else "split"
        self.objects: dict[str, torch.Tensor] = {}
        self.slots = {s: object_slots(layout, s) for s in SOURCES}
        obj_bytes = {s: sum(x.nbytes for x in self.slots[s]) for s in SOURCES}
        rows = sidecar_rows or {}
        self.sidecars: dict[str, SidecarPool] = {}

        def empty(*shape: int) -> torch.Tensor:
            return torch.empty(shape, dtype=torch.uint8, device=self.device,
                               pin_memory=pin_memory and self.device.type == "cpu")

        self.arena: ArenaAllocator | None = None
        self._buffer: torch.Tensor | None = None
        self.anchors: dict[str, IndexAllocator | ArenaSide]
        if arena_bytes is not None:
            self.arena = ArenaAllocator(f"{tier}/arena", arena_bytes, obj_bytes["page"], obj_bytes["state"],
                                        state_cap_bytes=state_cap_bytes)
            self.anchors = dict(self.arena.sides)
            self._buffer = empty(arena_bytes)
        else:
            assert num_pages is not None and num_snapshots is not None
            capacity = {"page": num_pages, "state": num_snapshots}
            self.anchors = {s: IndexAllocator(f"{tier}/{s}_anchor", capacity[s]) for s in SOURCES}
        for source in SOURCES:
            cap = self.anchors[source].capacity
            if self.arena is not None and self._buffer is not None:
                start = 0 if source == "page" else self.arena.state_base()
                flat = self._buffer[start: start + cap * obj_bytes[source]]
                self.objects[source] = flat.view(cap, obj_bytes[source])
            elif host_layout == "page_first":
                self.objects[source] = empty(cap, obj_bytes[source])
            for slot in self.slots[source]:
                fam = layout.family(slot.family)
                if source in self.objects:
                    view = self.objects[source][:, slot.offset: slot.offset + slot.nbytes]
                    view = view.reshape(cap, slot.num_layers, slot.unit_bytes).permute(1, 0, 2)
                else:
                    view = empty(slot.num_layers, cap, slot.unit_bytes)
                self.sidecars[fam.name] = SidecarPool(fam, tier, view, rows.get(fam.name, cap))
        # the sidecars on each anchor, in layout order (what alloc, free and move visit)
        self._on: dict[str, tuple[SidecarPool, ...]] = {
            s: tuple(sc for sc in self.sidecars.values() if sc.source == s) for s in SOURCES}

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
        for sc in self._on[source]:
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
        for sc in self._on[source]:
            sc.unbind(arr)
        anchor.free(arr, checked=True)

    def _anchor(self, source: str) -> IndexAllocator | ArenaSide:
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
        """``[capacity, object_bytes]``: one contiguous object per id (page_first, and shared
        arenas, where the page and the state object arrays overlap one buffer)."""
        if source not in self.objects:
            raise MisuseError(f"{self.tier}: objects exist only with host_layout='page_first'")
        return self.objects[source]

    @property
    def nbytes(self) -> int:
        """Bytes the tier's tensors hold (a pool without bytes: what they would hold)."""
        if self._buffer is not None:
            return int(self._buffer.numel())
        if self.objects:
            return sum(t.numel() for t in self.objects.values())
        return sum(sc.data.numel() for sc in self.sidecars.values())

    # -- shared arena: geometry and relocation ------------------------------------------------
    def _shared(self, what: str) -> ArenaAllocator:
        if self.arena is None:
            raise MisuseError(f"{self.tier}: {what} exists only in a shared arena (budget 'shared')")
        return self.arena

    def middle_bytes(self) -> int:
        """Free bytes between the page and the state frontier (either kind can grow there)."""
        return self._shared("middle_bytes").middle_bytes()

    def extent(self, source: str) -> int:
        """Bytes ``source``'s region covers, from its end of the arena past its frontier."""
        return self._shared("extent").extent(source)

    def frontier(self, source: str) -> int | None:
        """The used id of ``source`` nearest the middle (highest page / lowest state)."""
        return self._shared("frontier").frontier(source)

    def hole(self, source: str) -> int | None:
        """A free id inside ``source``'s region, nearest its far end (lowest page / highest
        state): where :meth:`move` puts the frontier object. None without holes."""
        return self._shared("hole").hole(source)

    def compaction_moves(self, source: str, k: int | None = None) -> list[tuple[int, int]]:
        """The ``(old_id, new_id)`` moves compacting up to ``k`` frontier objects would make
        (see :meth:`ArenaAllocator.compaction_moves`); nothing is moved."""
        return self._shared("compaction_moves").compaction_moves(source, k)

    def extent_after(self, source: str, k: int | None = None) -> int:
        """``source``'s extent once :meth:`compaction_moves` ``(source, k)`` were made."""
        return self._shared("extent_after").extent_after(source, k)

    def num_free_after(self, source: str, compact_other: int | None = None) -> int:
        """How many ``source`` ids would be free once ``compact_other`` frontier objects of
        the *other* kind were compacted (every movable one when None)."""
        return self._shared("num_free_after").num_free_after(source, compact_other)

    def move(self, source: str, old_ids: object, new_ids: object) -> None:
        """Relocate objects: copy every byte of each ``old_ids[i]`` object (all families,
        all layers: one contiguous object) to ``new_ids[i]``, then free the old ids and hold
        the new ones, in the arena and in every sidecar on ``source``.

        ``old_ids`` must be allocated, ``new_ids`` free, the two sets disjoint, and no new
        id may reach into the other kind's region (:class:`MisuseError`, nothing changed).
        The copy runs on the tier's device (on CUDA it is queued on the current stream,
        which the transfer controller's side streams wait on before each batch); a tier
        without bytes moves the ids alone, with the same checks. The caller
        must not move an id a copy in flight reads or writes, and updates its own
        references to the ids.
        """
        arena = self._shared("move")
        old, new = as_id_array(old_ids), as_id_array(new_ids)
        arena.check_move(source, old, new)
        if old.size == 0:
            return
        obj = self.objects[source]
        if obj.shape[1] and self.holds_bytes:
            src = torch.from_numpy(old).to(obj.device)
            obj.index_copy_(0, torch.from_numpy(new).to(obj.device), obj.index_select(0, src))
        arena.relocate(source, old, new)
        for sc in self._on[source]:
            sc.unbind(old)
            bound = sc.bind(new)
            assert bound, f"{self.tier}/{sc.name}: a shared arena binds every row"

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
