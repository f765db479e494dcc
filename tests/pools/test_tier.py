"""Tier pools: sidecars derived from both anchors, both host layouts, all-or-nothing."""

from __future__ import annotations

import pytest
import torch

from hicache.errors import MisuseError
from hicache.layout import CacheLayout, FamilySpec
from hicache.pools import NoRoom, TierPools, object_slots


def layout() -> CacheLayout:
    return CacheLayout((
        FamilySpec("swa_kv", "state", (0, 1, 2), 1, 8, rows_kept=3),
        FamilySpec("c4_kv", "history", (1, 2), 4, 8),
        FamilySpec("c4_indexer", "history", (1, 2), 4, 4),
        FamilySpec("c4_state", "state", (1, 2), 1, 16, rows_kept=4),
    ), 16)


@pytest.mark.parametrize("host_layout", ["layer_first", "page_first"])
def test_views_have_logical_shape(host_layout):
    pools = TierPools(layout(), "host", num_pages=5, num_snapshots=2, host_layout=host_layout)
    assert tuple(pools.view("c4_kv").shape) == (2, 5, 4 * 8)       # 16 tokens / 4 = 4 rows
    assert tuple(pools.view("c4_indexer").shape) == (2, 5, 4 * 4)
    assert tuple(pools.view("swa_kv").shape) == (3, 2, 3 * 8)
    assert tuple(pools.view("c4_state").shape) == (2, 2, 4 * 16)
    assert pools.nbytes == 5 * (64 + 32) + 2 * (72 + 128)


def test_page_first_objects_hold_every_family_of_a_page():
    lay = layout()
    pools = TierPools(lay, "host", num_pages=4, num_snapshots=2, host_layout="page_first")
    obj = pools.object_view("page")
    assert tuple(obj.shape) == (4, lay.object_bytes("page"))
    slots = {s.family: s for s in object_slots(lay, "page")}
    assert (slots["c4_kv"].offset, slots["c4_indexer"].offset) == (0, 64)
    # Writing through a family view lands inside the page's object at the slot offset.
    obj.zero_()  # pools are allocated uninitialised: leftover 7s would make this flaky
    pools.view("c4_indexer")[1, 3].fill_(7)  # layer index 1, page 3
    start = slots["c4_indexer"].offset + 1 * slots["c4_indexer"].unit_bytes
    assert (obj[3, start: start + 16] == 7).all()
    assert obj[3].sum().item() == 7 * 16 or obj[3, :start].ne(7).all()
    with pytest.raises(MisuseError, match="page_first"):
        TierPools(lay, "host", num_pages=1, num_snapshots=1).object_view("page")


def test_sidecars_derive_rows_from_both_anchors():
    pools = TierPools(layout(), "device", num_pages=4, num_snapshots=3)
    pages = pools.alloc("page", 2)
    snaps = pools.alloc("state", 2)
    assert pages.ids.tolist() == [0, 1] and snaps.ids.tolist() == [0, 1]
    assert pools.sidecars["c4_kv"].bound_ids().tolist() == [0, 1]
    assert pools.sidecars["c4_indexer"].bound_ids().tolist() == [0, 1]
    assert pools.sidecars["swa_kv"].bound_ids().tolist() == [0, 1]
    assert pools.sidecars["c4_state"].bound_ids().tolist() == [0, 1]
    pools.free("state", snaps.ids[:1])
    assert pools.sidecars["swa_kv"].bound_ids().tolist() == [1]
    assert pools.sidecars["c4_kv"].bound_ids().tolist() == [0, 1]
    pools.check_integrity()


def test_state_family_on_page_anchor():
    lay = CacheLayout((FamilySpec("kv", "history", (0,), 1, 8),
                       FamilySpec("swa_kv", "state", (0,), 1, 8, rows_kept=2, index_source="page")), 4)
    pools = TierPools(lay, "host", num_pages=3, num_snapshots=0, host_layout="page_first")
    ids = pools.alloc("page", 2).ids
    assert pools.sidecars["swa_kv"].bound_ids().tolist() == ids.tolist()
    assert pools.object_view("page").shape[1] == 4 * 8 + 2 * 8
    pools.check_integrity()


def test_alloc_all_or_nothing_when_a_sidecar_refuses():
    # c4_indexer has a smaller budget than the anchor: the 4th page cannot bind there.
    pools = TierPools(layout(), "host", num_pages=6, num_snapshots=1, sidecar_rows={"c4_indexer": 3})
    assert pools.alloc("page", 3).ok
    r = pools.alloc("page", 2)
    assert isinstance(r, NoRoom) and r.blocked_by == "c4_indexer"
    assert pools.num_used("page") == 3
    assert pools.sidecars["c4_kv"].bound_ids().tolist() == [0, 1, 2]  # rolled back
    pools.check_integrity()


def test_no_room_and_double_free():
    pools = TierPools(layout(), "device", num_pages=2, num_snapshots=1)
    assert not pools.alloc("state", 2).ok
    ids = pools.alloc("page", 2).ids
    pools.free("page", ids)
    with pytest.raises(MisuseError, match="double free"):
        pools.free("page", ids)
    with pytest.raises(MisuseError, match="unknown index source"):
        pools.alloc("pages", 1)
    with pytest.raises(MisuseError, match="unknown family"):
        pools.view("nope")
    pools.check_integrity()


def test_integrity_catches_a_desynced_sidecar():
    pools = TierPools(layout(), "device", num_pages=4, num_snapshots=1)
    pools.alloc("page", 2)
    pools.sidecars["c4_kv"]._bound[3] = True  # simulate a bug
    with pytest.raises(AssertionError, match="c4_kv"):
        pools.check_integrity()


def test_zero_row_state_family_is_allowed():
    lay = CacheLayout((FamilySpec("c8_kv", "history", (0,), 8, 8),
                       FamilySpec("c8_state", "state", (0,), 1, 32, rows_kept=0)), 16)
    pools = TierPools(lay, "host", num_pages=2, num_snapshots=2, host_layout="page_first")
    assert tuple(pools.view("c8_state").shape) == (1, 2, 0)
    assert pools.alloc("state", 1).ok
    pools.check_integrity()


def test_pinned_only_requested_on_cuda():
    pools = TierPools(layout(), "host", num_pages=1, num_snapshots=1, pin_memory=False)
    assert not pools.view("c4_kv").is_pinned()
    assert pools.view("c4_kv").dtype == torch.uint8
