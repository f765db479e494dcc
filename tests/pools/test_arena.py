"""The shared arena: pages from the low end, states from the high end, holes, compaction."""

from __future__ import annotations

import pytest
import torch

from hicache.errors import MisuseError
from hicache.layout import CacheLayout, FamilySpec
from hicache.pools import NoRoom, TierPools
from hicache.pools.arena import ArenaAllocator
from tests.pools.test_tier import layout


def ids(result) -> list[int]:
    assert result.ok, result
    return result.ids.tolist()


def arena(cap: int | None = None) -> ArenaAllocator:
    # 100 bytes: 10 pages of 10 B, or 4 states of 25 B (ids 0..3, id 3 at the high end)
    return ArenaAllocator("t", 100, 10, 25, state_cap_bytes=cap)


def test_pages_lowest_first_states_highest_first():
    a = arena()
    assert a.capacity("page") == 10 and a.capacity("state") == 4
    assert ids(a.alloc("page", 3)) == [0, 1, 2]
    assert ids(a.alloc("state", 2)) == [3, 2]
    assert a.extent("page") == 30 and a.extent("state") == 50 and a.middle_bytes() == 20
    assert a.frontier("page") == 2 and a.frontier("state") == 2
    a.check_integrity()


def test_kinds_share_the_middle():
    a = arena()
    assert (a.num_free("page"), a.num_free("state")) == (10, 4)
    ids(a.alloc("state", 1))            # bytes [75, 100)
    assert a.num_free("page") == 7      # pages 0..6 end at byte 70 <= 75
    ids(a.alloc("page", 6))             # bytes [0, 60)
    assert a.num_free("state") == 0     # [50, 75) would overlap page 5
    assert isinstance(a.alloc("state", 1), NoRoom)
    assert a.num_free("page") == 1
    ids(a.alloc("page", 1))
    assert isinstance(a.alloc("page", 1), NoRoom)
    a.check_integrity()


def test_holes_are_reused_before_the_middle():
    a = arena()
    assert ids(a.alloc("state", 2)) == [3, 2]      # bytes [50, 100)
    ids(a.alloc("page", 5))                        # bytes [0, 50): the arena is full
    a.sides["page"].free([1, 3])
    assert a.extent("page") == 50 and a.region("page").holes == 2
    assert ids(a.alloc("page", 2)) == [1, 3]
    assert isinstance(a.alloc("page", 1), NoRoom)
    a.sides["state"].free([3])
    assert a.extent("state") == 50                 # id 3 is a hole behind the frontier (2)
    assert ids(a.alloc("state", 1)) == [3]         # the hole at the high end, not the middle
    a.check_integrity()


def test_frontier_retreats_past_holes_when_it_is_freed():
    a = arena()
    ids(a.alloc("page", 6))
    a.sides["page"].free([2, 3, 4])
    assert a.frontier("page") == 5 and a.extent("page") == 60
    a.sides["page"].free([5])
    assert a.frontier("page") == 1 and a.extent("page") == 20   # holes 2..4 joined the middle
    assert a.hole("page") is None
    ids(a.alloc("state", 3))
    a.sides["state"].free([1])
    assert a.frontier("state") == 2 and a.extent("state") == 50
    a.sides["state"].free([3, 2])
    assert a.frontier("state") is None and a.extent("state") == 0
    a.check_integrity()


def test_state_cap_bounds_the_state_region():
    a = arena(cap=50)
    assert a.capacity("state") == 2 and a.capacity("page") == 10
    assert ids(a.alloc("state", 2)) == [1, 0]
    assert isinstance(a.alloc("state", 1), NoRoom)
    assert a.num_free("page") == 5
    b = arena(cap=60)     # 60 B holds two 25-B snapshots
    assert b.capacity("state") == 2


def test_compaction_moves_frontier_objects_into_the_lowest_holes():
    a = arena()
    ids(a.alloc("page", 8))
    a.sides["page"].free([1, 2, 5])
    assert a.compaction_moves("page") == [(7, 1), (6, 2)]
    assert a.compaction_moves("page", 1) == [(7, 1)]
    assert a.extent_after("page") == 50 and a.extent_after("page", 1) == 70
    b = arena()
    ids(b.alloc("state", 4))
    b.sides["state"].free([3, 1])       # state holes at ids 3 (the high end) and 1
    assert b.compaction_moves("state") == [(0, 3)]
    assert b.extent_after("state") == 50


def test_num_free_after_compacting_the_other_kind():
    a = arena()
    ids(a.alloc("page", 8))
    a.sides["page"].free([0, 1, 2, 3, 4, 5])   # pages 6, 7 left: extent 80
    assert a.num_free("state") == 0
    assert a.num_free_after("state") == 3         # pages move to 0, 1: extent 20
    assert a.num_free_after("state", 1) == 1      # only page 7 moves (to 0); page 6 keeps 70 B
    a.check_integrity()


def shared(nbytes: int = 1000, cap: int | None = None) -> TierPools:
    # pages 96 B, states 200 B
    return TierPools(layout(), "device", arena_bytes=nbytes, state_cap_bytes=cap)


def test_shared_tier_views_overlay_one_buffer():
    p = shared()
    assert p.budget == "shared" and p.nbytes == 1000
    assert p.capacity("page") == 10 and p.capacity("state") == 5
    page, state = p.object_view("page"), p.object_view("state")
    assert page.untyped_storage().data_ptr() == state.untyped_storage().data_ptr()
    p._buffer.zero_()
    state[4].fill_(9)                         # the last 200 bytes of the arena
    assert (p._buffer[800:] == 9).all() and (p._buffer[:800] == 0).all()
    p.view("c4_kv")[1, 2].fill_(5)            # layer 1 of page 2: slot offset 32 (layer 0 is 0..32)
    assert (page[2, 32:64] == 5).all() and int((p._buffer == 5).sum()) == 32
    p.check_integrity()


def test_fragmentation_then_compaction_admits_a_state():
    p = shared()
    assert ids(p.alloc("page", 9)) == list(range(9))      # bytes [0, 864)
    p.free("page", [0, 1, 2, 3, 4, 5])                   # 576 B of page holes
    assert p.middle_bytes() == 136
    assert isinstance(p.alloc("state", 1), NoRoom)        # holes add up to >2 states, no use
    assert p.num_free_after("state") == 3
    moves = p.compaction_moves("page")
    assert moves == [(8, 0), (7, 1), (6, 2)]
    for old, new in moves:
        p.move("page", [old], [new])
    assert p.extent("page") == 3 * 96 and p.frontier("page") == 2
    assert ids(p.alloc("state", 1)) == [4]
    p.check_integrity()


def test_move_copies_every_byte_of_the_object():
    p = shared()
    ids(p.alloc("page", 4))
    obj = p.object_view("page")
    data = torch.randint(0, 256, (96,), dtype=torch.uint8)
    obj[3].copy_(data)
    p.free("page", [1])
    p.move("page", [3], [1])
    assert torch.equal(obj[1], data)
    assert p.anchors["page"].used_ids().tolist() == [0, 1, 2]
    assert p.frontier("page") == 2
    for sc in p.sidecars.values():
        if sc.source == "page":
            assert sc.bound_ids().tolist() == [0, 1, 2]
    ids(p.alloc("state", 2))
    state = p.object_view("state")
    state[3].fill_(7)
    p.free("state", [4])
    p.move("state", [3], [4])
    assert (state[4] == 7).all()
    p.check_integrity()


def test_move_refuses_bad_ids_and_changes_nothing():
    p = shared()
    ids(p.alloc("page", 3))
    ids(p.alloc("state", 1))          # state 4: bytes [800, 1000)
    with pytest.raises(MisuseError, match="not allocated"):
        p.move("page", [5], [6])
    with pytest.raises(MisuseError, match="already allocated"):
        p.move("page", [2], [1])
    with pytest.raises(MisuseError, match="overlaps the other region"):
        p.move("page", [2], [8])      # page 8 = bytes [768, 864) overlaps the state
    with pytest.raises(MisuseError, match="old ids but"):
        p.move("page", [2], [])
    assert p.anchors["page"].used_ids().tolist() == [0, 1, 2]
    p.check_integrity()


def test_split_pools_have_no_arena_geometry():
    p = TierPools(layout(), "device", num_pages=4, num_snapshots=1)
    assert p.budget == "split"
    with pytest.raises(MisuseError, match="only in a shared arena"):
        p.middle_bytes()
    with pytest.raises(MisuseError, match="derives its page and snapshot counts"):
        TierPools(layout(), "device", num_pages=4, arena_bytes=1000)
    with pytest.raises(MisuseError, match="layer_first needs split pools"):
        TierPools(layout(), "device", arena_bytes=1000, host_layout="layer_first")


def test_layout_without_state_is_all_pages():
    lay = CacheLayout((FamilySpec("kv", "history", (0, 1), 1, 8),), 16)
    p = TierPools(lay, "device", arena_bytes=1000)
    assert p.capacity("state") == 0
    assert p.capacity("page") == 1000 // lay.object_bytes("page")
    assert p.num_free("page") == p.capacity("page")
    p.check_integrity()
