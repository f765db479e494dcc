"""The lease opener's expect(): a queued request's prefix kept warm (hicache/cache/opener.py)."""

from __future__ import annotations

import pytest

from hicache.pools import Tier
from tests.cache.conftest import Engine, make_cache, mha_layout, toks

A, B, C = toks(1, 2, extra=1), toks(3, 4, extra=1), toks(5, 6, 7, extra=1)


def _two_chains(eviction, layout=None):
    eng = Engine(make_cache(layout, device_pages=6, device_snaps=4, eviction=eviction, storage="none://"))
    eng.run(A)
    eng.run(B)   # A is now the least recently used chain
    return eng


@pytest.mark.parametrize("layout", [None, mha_layout()], ids=["hybrid", "mha"])
@pytest.mark.parametrize("eviction", ["lru", "value", "reuse-prompt", "probation"])
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


def test_expect_locks_and_counts_nothing_and_splits_no_snapshot_boundary():
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


def test_a_resume_point_inside_a_node_keeps_only_the_pages_above_it_warm():
    """Without state a request may resume inside a node: expect splits it there, as its load
    would, so the node's lower pages (which the request recomputes) age as before."""
    eng = Engine(make_cache(mha_layout(), device_pages=8, eviction="lru", storage="none://"))
    cache = eng.cache
    a, b, queued = toks(1, 2, 3, 4, extra=1), toks(5, 6, 7, extra=1), toks(1, 9, extra=1)
    eng.run(a)
    eng.run(b)
    nodes = cache.num_nodes
    assert cache.expect(queued) == 4
    assert cache.num_nodes == nodes + 1                # a's node split after its first page
    eng.run(toks(10, 11, 12, extra=1))                  # 1 page free, 3 needed: 2 victims
    assert cache.match(b).device_tokens == 12           # the more recent whole chain stays
    assert cache.match(queued).device_tokens == 4       # the expected page too
    assert cache.match(a).device_tokens == 8            # a's lower pages went first
    cache.check_integrity()


@pytest.mark.parametrize("eviction", ["reuse-prompt", "probation"])
@pytest.mark.parametrize("expected", [False, True])
def test_a_decode_end_a_queued_request_will_resume_from_is_not_an_idle_tail(eviction, expected):
    """The rules that put a decode's end no request used first (``reuse-prompt``'s idle
    tails, ``probation``) must not drop the one a queued request is about to resume from:
    an overloaded engine queues a conversation's next turn behind the turn that decoded it,
    and ``expect`` marks that snapshot ``expected``. A's decode end is idle; B's was resumed
    from. Two device state rows: C's snapshot takes one."""
    eng = Engine(make_cache(device_pages=12, device_snaps=2, eviction=eviction, storage="none://"))
    cache = eng.cache
    eng.run(A)
    eng.run(B)
    eng.run(B)   # the same prompt again: it resumes at B's end, which is no longer idle
    if expected:
        assert cache.expect(A) == 8
    eng.run(C)
    kept, lost = (A, B) if expected else (B, A)
    assert cache.match(kept).snapshot_tier is Tier.DEVICE
    assert cache.match(lost).snapshot_tier is Tier.HOST    # its device copy went (a host copy stays)
    cache.check_integrity()
    cache.close()
