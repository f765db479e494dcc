"""The index allocator under the anchors: exact ids, double alloc/free, random sequences."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import given, settings, strategies as st

from hicache.errors import MisuseError
from hicache.pools import Allocation, IndexAllocator, NoRoom


def test_fresh_allocator_hands_out_low_ids_first():
    a = IndexAllocator("page", 8)
    r = a.alloc(3)
    assert isinstance(r, Allocation) and r.ok
    assert r.ids.tolist() == [0, 1, 2] and r.ids.dtype == torch.int64
    assert (a.num_used, a.num_free) == (3, 5)
    a.check_integrity()


def test_no_room_is_a_value_and_allocates_nothing():
    a = IndexAllocator("page", 4)
    a.alloc(3)
    r = a.alloc(2)
    assert isinstance(r, NoRoom) and not r.ok
    assert (r.requested, r.available, r.blocked_by) == (2, 1, None)
    assert a.num_free == 1
    a.check_integrity()


def test_freed_ids_are_reused_lifo():
    a = IndexAllocator("page", 8)
    ids = a.alloc(4).ids
    a.free(ids[[1, 3]])
    assert a.alloc(2).ids.tolist() == [1, 3]
    a.check_integrity()


@pytest.mark.parametrize("bad, match", [
    ([9], "out of range"), ([-1], "out of range"), ([2, 2], "given twice"), ([5], "not allocated"),
])
def test_free_misuse(bad, match):
    a = IndexAllocator("page", 8)
    a.alloc(4)
    with pytest.raises(MisuseError, match=match):
        a.free(bad)
    assert a.num_used == 4  # nothing changed
    a.check_integrity()


def test_double_free_detected():
    a = IndexAllocator("page", 4)
    ids = a.alloc(2).ids
    a.free(ids)
    with pytest.raises(MisuseError, match="double free"):
        a.free(ids)


def test_bad_counts_and_dtypes():
    a = IndexAllocator("page", 4)
    for n in (-1, 1.5, True):
        with pytest.raises(MisuseError):
            a.alloc(n)
    a.alloc(1)
    with pytest.raises(MisuseError, match="integers"):
        a.free(torch.tensor([0.0]))
    assert a.alloc(0).ids.numel() == 0


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.booleans(), st.integers(0, 12)), max_size=60))
def test_random_alloc_free_keeps_integrity(ops):
    cap = 24
    a = IndexAllocator("page", cap)
    held: set[int] = set()
    rng = np.random.default_rng(0)
    for is_alloc, n in ops:
        if is_alloc:
            r = a.alloc(n)
            if n <= cap - len(held):
                assert r.ok and len(r) == n
                got = set(r.ids.tolist())
                assert not got & held, "an id was handed out twice"
                held |= got
            else:
                assert not r.ok and r.available == cap - len(held)
        elif held:
            k = min(n, len(held))
            drop = rng.choice(sorted(held), size=k, replace=False)
            a.free(torch.from_numpy(drop))
            held -= set(drop.tolist())
        a.check_integrity()
        assert a.num_used == len(held)
        assert set(a.used_ids().tolist()) == held
