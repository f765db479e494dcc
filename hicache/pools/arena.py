"""The shared arena's allocator: history pages and state snapshots in one byte budget.

A tier in *shared* mode owns one buffer of ``B`` bytes. Pages are objects of ``po`` bytes
laid from the low end, snapshots objects of ``so`` bytes laid from the high end; both
object arrays cover the same storage and the allocator keeps them apart::

    byte 0                                                                      byte B
    | p0 | p1 |(p2)| p3 |            middle (free)            | s5 |(s6)| s7 | s8 |
    '---- page region ----'                                   '--- state region ---'
          extent_p = 4 * po                                        extent_s = 4 * so

    page id p  : bytes [p * po, (p + 1) * po)                 ids 0 .. P_max - 1
    state id s : bytes [B - (S_max - s) * so, B - (S_max - s - 1) * so)
                                                              ids 0 .. S_max - 1

Each kind is handed out from its own end: pages lowest free id first, states highest
free id first. A region reaches from its end to its *frontier* (the used id nearest the
middle: the highest used page, the lowest used state); free ids inside it are *holes*.
Because every allocation takes the free id nearest its own end, holes are reused before
the region grows, and it grows into the middle only at its frontier.

The one invariant (checked by :meth:`ArenaAllocator.check_integrity`)::

    extent_p + extent_s <= B        (extent = bytes from the region's end to past its frontier)

It implies that no used page ever shares a byte with a used state. Freeing the frontier
id moves the frontier back to the next used id, so the holes just below it join the middle
at once. ``num_free(kind)`` counts the holes of that kind plus the objects of that kind that
fit in the middle; the two kinds *share* the middle, so allocating one kind can lower the
other's ``num_free``.

Total free bytes are not usable bytes: holes of one kind cannot hold the other kind, so a
state can be refused while page holes add up to many snapshots (fragmentation). Compaction
fixes that: moving the frontier object of a region into one of its holes shrinks the
region (see :meth:`ArenaAllocator.compaction_moves`; the bytes are moved by
``TierPools.move``).

An optional cap bounds the state region: only the last ``state_cap_bytes`` of the arena
can hold snapshots (``S_max = min(B, cap) // so``), so states never occupy more than the
cap, holes included, while pages may use all of ``B``.

Per kind, ids are kept as *ranks* (distance from the kind's own end: page rank = id,
state rank = S_max - 1 - id), so one :class:`_Region` serves both kinds.
"""

from __future__ import annotations

import numpy as np
import torch

from hicache.errors import MisuseError
from hicache.pools.anchor import AllocResult, Allocation, NoRoom, as_id_array, check_ids
from hicache.units import check_int

_SCAN = 4096  # ids scanned per numpy step when looking for holes


class _Region:
    """One kind's ids, by rank from its own end of the arena."""

    def __init__(self, capacity: int, obj_bytes: int):
        self.capacity = capacity
        self.obj_bytes = obj_bytes
        self.used = np.zeros(capacity, dtype=bool)
        self.top = 0       # 1 + the highest used rank (the frontier's rank + 1); 0 when empty
        self.lo = 0        # every rank below lo is used (a hint that only grows by allocating)
        self.n_used = 0

    @property
    def extent(self) -> int:
        return self.top * self.obj_bytes

    @property
    def holes(self) -> int:
        return self.top - self.n_used

    def hole_ranks(self, n: int) -> np.ndarray:
        """The ``n`` lowest free ranks below the frontier (fewer if there are not as many)."""
        out: list[np.ndarray] = []
        got, start, step = 0, self.lo, _SCAN
        while got < n and start < self.top:
            end = min(self.top, start + step)
            free = np.flatnonzero(~self.used[start:end]) + start
            if got == 0 and free.size:
                self.lo = int(free[0])
            out.append(free[: n - got])
            got += out[-1].size
            start, step = end, step * 2
        if got == 0 and start >= self.top:
            self.lo = self.top   # no holes: every rank below the frontier is used
        return np.concatenate(out) if out else np.zeros(0, np.int64)

    def lowest_free(self, n: int, limit: int) -> np.ndarray | None:
        """The ``n`` lowest free ranks, all below ``limit``; None when they do not fit."""
        holes = self.hole_ranks(n)
        rest = n - holes.size
        if rest and self.top + rest > limit:
            return None
        return np.concatenate([holes, np.arange(self.top, self.top + rest, dtype=np.int64)])

    def frontier_ranks(self, n: int) -> np.ndarray:
        """The ``n`` highest used ranks, highest first (fewer if there are not as many)."""
        out: list[np.ndarray] = []
        got, end, step = 0, self.top, _SCAN
        while got < n and end > 0:
            start = max(0, end - step)
            used = np.flatnonzero(self.used[start:end])[::-1] + start
            out.append(used[: n - got])
            got += out[-1].size
            end, step = start, step * 2
        return np.concatenate(out) if out else np.zeros(0, np.int64)

    def take(self, ranks: np.ndarray) -> None:
        assert not self.used[ranks].any(), "taking a used rank"
        self.used[ranks] = True
        self.n_used += int(ranks.size)
        if ranks.size:
            self.top = max(self.top, int(ranks.max()) + 1)

    def release(self, ranks: np.ndarray) -> None:
        assert self.used[ranks].all(), "releasing a free rank"
        self.used[ranks] = False
        self.n_used -= int(ranks.size)
        if ranks.size:
            self.lo = min(self.lo, int(ranks.min()))
        # The frontier moves back to the next used rank; scanning costs what was freed.
        step = _SCAN
        while self.top and not self.used[self.top - 1]:
            start = max(0, self.top - step)
            used = np.flatnonzero(self.used[start: self.top])
            self.top = start + int(used[-1]) + 1 if used.size else start
            if used.size:
                break
            step *= 2
        self.lo = min(self.lo, self.top)

    def check(self, name: str) -> None:
        used = np.flatnonzero(self.used)
        assert used.size == self.n_used, f"{name}: {self.n_used} counted used, {used.size} marked"
        top = int(used[-1]) + 1 if used.size else 0
        assert top == self.top, f"{name}: frontier at rank {self.top - 1}, highest used rank is {top - 1}"
        assert not self.used[: self.lo].size or self.used[: self.lo].all(), (
            f"{name}: the hole hint {self.lo} passes a free rank")


class ArenaSide:
    """One kind of the arena seen as an anchor (what ``TierPools.anchors[source]`` holds).

    Same interface as :class:`~hicache.pools.anchor.IndexAllocator`: ``alloc`` is
    all-or-nothing, ``free`` checks every id, ``capacity`` is the size of the id space
    (P_max or S_max); ``num_free`` shares the arena's middle with the other kind.
    """

    def __init__(self, arena: "ArenaAllocator", source: str):
        self._arena = arena
        self.source = source
        self.name = f"{arena.name}/{source}_arena"
        self._region = arena.region(source)
        self.capacity = self._region.capacity

    # ids <-> ranks (pages: the same; states: counted from the high end)
    def ranks(self, ids: np.ndarray) -> np.ndarray:
        return ids if self.source == "page" else self.capacity - 1 - ids

    ids_of = ranks   # the map is its own inverse

    @property
    def num_free(self) -> int:
        return self._arena.num_free(self.source)

    @property
    def num_used(self) -> int:
        return self._region.n_used

    def alloc(self, n: int) -> AllocResult:
        """``n`` ids nearest this kind's end (holes first, then the middle), or NoRoom."""
        return self._arena.alloc(self.source, n)

    def check_ids(self, arr: np.ndarray, *, must_be_used: bool) -> None:
        """Raise :class:`MisuseError` for out-of-range, duplicate or wrong-state ids."""
        check_ids(self.name, self.capacity, arr, lambda a: self._region.used[self.ranks(a)],
                  must_be_used=must_be_used)

    def free(self, ids: object, *, checked: bool = False) -> None:
        """Return ids to the arena. Freeing an id that is not allocated raises (``checked``:
        the caller has just run :meth:`check_ids` on this int64 array)."""
        arr = ids if checked and isinstance(ids, np.ndarray) else as_id_array(ids)
        if not checked:
            self.check_ids(arr, must_be_used=True)
        self._region.release(self.ranks(arr))

    def is_used(self, ids: object) -> np.ndarray:
        return self._region.used[self.ranks(as_id_array(ids))]

    def used_ids(self) -> np.ndarray:
        """Used ids in increasing order."""
        return np.sort(self.ids_of(np.flatnonzero(self._region.used)))

    def check_integrity(self) -> None:
        self._arena.check_integrity()


class ArenaAllocator:
    """Page and state ids of one shared arena (see the module docstring); owns no bytes."""

    def __init__(self, name: str, arena_bytes: int, page_bytes: int, state_bytes: int, *,
                 state_cap_bytes: int | None = None):
        assert arena_bytes >= 0 and page_bytes > 0 and state_bytes >= 0, (
            f"{name}: arena {arena_bytes} B, page {page_bytes} B, state {state_bytes} B")
        self.name = name
        self.arena_bytes = arena_bytes
        self.state_cap_bytes = state_cap_bytes
        state_room = arena_bytes if state_cap_bytes is None else min(arena_bytes, state_cap_bytes)
        self._regions = {
            "page": _Region(arena_bytes // page_bytes, page_bytes),
            # a layout without state families has no snapshots here (S_max = 0)
            "state": _Region(state_room // state_bytes if state_bytes else 0, state_bytes),
        }
        self.sides = {s: ArenaSide(self, s) for s in ("page", "state")}

    # -- geometry ---------------------------------------------------------------------------
    def region(self, source: str) -> _Region:
        try:
            return self._regions[source]
        except KeyError:
            raise MisuseError(f"unknown index source {source!r}; expected 'page' or 'state'") from None

    def _other(self, source: str) -> _Region:
        return self._regions["state" if source == "page" else "page"]

    def capacity(self, source: str) -> int:
        return self.region(source).capacity

    def state_base(self) -> int:
        """The byte offset of state id 0 (the state object array ends at byte B)."""
        r = self._regions["state"]
        return self.arena_bytes - r.capacity * r.obj_bytes

    def extent(self, source: str) -> int:
        """Bytes the region covers from its end of the arena to past its frontier."""
        return self.region(source).extent

    def middle_bytes(self) -> int:
        """Bytes between the two frontiers: what either kind can still grow into."""
        return self.arena_bytes - self._regions["page"].extent - self._regions["state"].extent

    def _limit(self, source: str, other_extent: int | None = None) -> int:
        """Ranks of ``source`` below this do not overlap the other region."""
        r = self.region(source)
        if not r.obj_bytes:
            return r.capacity
        other = self._other(source).extent if other_extent is None else other_extent
        return min(r.capacity, (self.arena_bytes - other) // r.obj_bytes)

    def num_free(self, source: str) -> int:
        """Holes of ``source`` plus the ``source`` objects that fit in the middle (shared)."""
        return self._limit(source) - self.region(source).n_used

    # -- allocation -------------------------------------------------------------------------
    def alloc(self, source: str, n: int) -> AllocResult:
        n = check_int(f"{self.name}: alloc count", n, misuse=True)
        r = self.region(source)
        ranks = r.lowest_free(n, self._limit(source))
        if ranks is None:
            return NoRoom(requested=n, available=self.num_free(source))
        r.take(ranks)
        return Allocation(torch.from_numpy(self.sides[source].ids_of(ranks).copy()))

    # -- relocation -------------------------------------------------------------------------
    def frontier(self, source: str) -> int | None:
        """The used id nearest the middle (highest page / lowest state), None when empty."""
        r = self.region(source)
        return int(self.sides[source].ids_of(np.array([r.top - 1]))[0]) if r.top else None

    def hole(self, source: str) -> int | None:
        """The free id inside the region nearest its far end (lowest page / highest state),
        None without holes: where compaction puts the frontier object."""
        ranks = self.region(source).hole_ranks(1)
        return int(self.sides[source].ids_of(ranks[0])) if ranks.size else None

    def _compaction(self, source: str, k: int | None) -> tuple[np.ndarray, np.ndarray, int]:
        """Ranks of the moves compaction would make (``moved``, ``into``) and the highest
        used rank left in place (-1 when none)."""
        r = self.region(source)
        want = r.holes if k is None else min(check_int("compact count", k, misuse=True), r.holes)
        if want <= 0:
            return np.zeros(0, np.int64), np.zeros(0, np.int64), r.top - 1
        holes = r.hole_ranks(want)                   # lowest first
        frontier = r.frontier_ranks(want + 1)        # highest first
        n = min(holes.size, frontier.size)
        ok = holes[:n] < frontier[:n]                # a prefix: holes rise as frontiers fall
        m = int(ok.sum())
        rest = int(frontier[m]) if frontier.size > m else -1
        return frontier[:m], holes[:m], rest

    def compaction_moves(self, source: str, k: int | None = None) -> list[tuple[int, int]]:
        """The ``(old_id, new_id)`` moves that compacting up to ``k`` frontier objects of
        ``source`` would make, in order (every useful one when ``k`` is None); nothing moves.

        Move i takes the i-th highest-ranked used object into the i-th lowest hole, as long
        as that hole lies below it; each move shrinks the region. Applying them in order with
        ``TierPools.move`` leaves the region at :meth:`extent_after` ``(source, k)``.
        """
        moved, into, _ = self._compaction(source, k)
        side = self.sides[source]
        return list(zip(side.ids_of(moved).tolist(), side.ids_of(into).tolist()))

    def extent_after(self, source: str, k: int | None = None) -> int:
        """The region's extent after :meth:`compaction_moves` ``(source, k)``."""
        r = self.region(source)
        moved, into, rest = self._compaction(source, k)
        if not moved.size:
            return r.extent
        return (max(int(into[-1]), rest) + 1) * r.obj_bytes

    def num_free_after(self, source: str, compact_other: int | None = None) -> int:
        """``num_free(source)`` once the *other* region's ``compact_other`` frontier objects
        have been compacted (all that can move when None). Compacting a region's own
        objects does not change its own ``num_free``: its holes become middle."""
        other = "state" if source == "page" else "page"
        return self._limit(source, self.extent_after(other, compact_other)) - self.region(source).n_used

    def check_move(self, source: str, old: np.ndarray, new: np.ndarray) -> None:
        """Raise :class:`MisuseError` unless ``old`` are used, ``new`` free and outside the
        other region, the two sets disjoint and equally long."""
        side = self.sides[source]
        if old.size != new.size:
            raise MisuseError(f"{self.name}: {old.size} old ids but {new.size} new ids")
        side.check_ids(old, must_be_used=True)
        side.check_ids(new, must_be_used=False)
        limit = self._limit(source)
        over = new[side.ranks(new) >= limit]
        if over.size:
            raise MisuseError(f"{self.name}: {source} id {int(over[0])} overlaps the other region")

    def relocate(self, source: str, old: np.ndarray, new: np.ndarray) -> None:
        """Move the allocation of ``old`` ids to ``new`` ids (checked by :meth:`check_move`)."""
        self.check_move(source, old, new)
        side, r = self.sides[source], self.region(source)
        r.take(side.ranks(new))
        r.release(side.ranks(old))

    # -- checks -----------------------------------------------------------------------------
    def check_integrity(self) -> None:
        """Assert both regions' bookkeeping and that they never overlap."""
        for source, r in self._regions.items():
            r.check(f"{self.name}/{source}")
        p, s = self._regions["page"].extent, self._regions["state"].extent
        assert p + s <= self.arena_bytes, (
            f"{self.name}: page region ({p} B) and state region ({s} B) overlap in {self.arena_bytes} B")
