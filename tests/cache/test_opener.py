"""The lease opener's expect(): a queued request's prefix kept warm (hicache/cache/opener.py)."""

from __future__ import annotations

import pytest

from tests.cache.conftest import Engine, make_cache, mha_layout, toks

A, B, C = toks(1, 2, extra=1), toks(3, 4, extra=1), toks(5, 6, 7, extra=1)


def _two_chains(eviction, layout=None):
    eng = Engine(make_cache(layout, device_pages=6, device_snaps=4, eviction=eviction, storage="none://"))
    eng.run(A)
    eng.run(B)   # A is now the least recently used chain
    return eng


@pytest.mark.parametrize("layout", [None, mha_layout()], ids=["hybrid", "mha"])
@pytest.mark.parametrize("eviction", ["lru", "value"])
@pytest.mark.parametrize("expected", [False, True])
def test_an_expected_prefix_outlives_a_more_recent_one(eviction, expected, layout):
    eng = _two_chains(eviction, layout)
    cache = eng.cache
    if expected:
        assert cache.expect(A) == 8
    eng.run(C)   # needs 3 device pages, 2 are free: one victim page goes
    kept, lost = (A, B) if expected else (B, A)
    assert cache.match(kept).device_tokens == 8
    assert cache.match(lost).device_tokens < 8
    cache.check_integrity()


def test_expect_locks_splits_and_counts_nothing():
    eng = _two_chains("lru")
    cache = eng.cache
    before = cache.counters
    clock, nodes = cache._tree.clock, cache.num_nodes
    assert cache.expect(toks(1, 2, 9, extra=1)) == 8   # past the cached path: its resume point
    assert cache.expect(toks(1, extra=1)) == 0          # mid-node, no snapshot there: nothing
    assert cache.expect(toks(8, 8, extra=1)) == 0       # nothing cached
    after = cache.counters
    assert (cache._tree.clock, cache.num_nodes) == (clock + 1, nodes)   # one access: one tick
    assert after.expects == before.expects + 1
    assert (after.matches, after.hit_tokens, after.loads) == (before.matches, before.hit_tokens, before.loads)
    assert all(n.lock_device == 0 for n in cache._tree.nodes())
    cache.check_integrity()
