"""Facade defects the tiny replay found, now fixed and pinned here.

``HiCache.prefetch`` did not pin the host copies of the prefix its L3 pages extend. When
``_start_fetch`` allocates host rows for the fetch, host eviction may take exactly that
prefix (LRU leaves on the host); ``tree.insert_host`` then finds the prefix gone and drops
every fetched page. The prefetch wastes the fetch and *shrinks* the hit it was meant to
extend. A failed load of several shadow nodes was rolled back parent-first and tripped an
assertion on the child.
"""

from __future__ import annotations

import numpy as np

from tests.engine.tiny_replay.conftest import request, serve, small_cache, toks


def test_a_prefetch_never_shrinks_the_hit_it_extends():
    cache = small_cache()
    a_prompt, a_out = toks(1, 70), toks(2, 30)
    serve(cache, [request(0, a_prompt, a_out)])
    for i in range(2):  # push turn 1 out of the device and partly out of the host
        serve(cache, [request(10 + i, toks(100 + 2 * i, 70), toks(101 + 2 * i, 30))])
    tokens = np.concatenate([a_prompt, a_out, toks(3, 20)])
    before = cache.match(tokens)
    assert before.resume_tokens == 64 and before.host_tokens == 64 and len(before.l3_hashes) > 0
    cache.finish_prefetch(cache.prefetch(before))
    after = cache.match(tokens)
    cache.check_integrity()
    cache.close()
    # The L3 copies of pages 4..5 and the snapshot at 96 exist (turn 1 stored them).
    assert after.resume_tokens >= before.resume_tokens
    assert after.resume_tokens == 96


def test_a_failed_load_of_several_shadow_nodes_is_rolled_back():
    """Turn 1 publishes in three nodes ([0,32), [32,64), [64,96)); a filler demotes the
    last one and the tail of the middle one (a victim gives only the pages asked for:
    [48,64) is cut off [32,64)); turn 2's load of both fails. The failure must turn both
    back into shadows."""
    from tests.engine.tiny_replay.conftest import A2_PROMPT, A_OUT, A_PROMPT
    from tests.engine.tiny_replay.test_tiers import fail_host_loads

    cache = small_cache()
    serve(cache, [request(0, A_PROMPT, A_OUT, conv="a")])
    serve(cache, [request(10, toks(100, 70), toks(101, 30))])
    m = cache.match(A2_PROMPT)
    assert (m.resume_tokens, m.device_tokens, m.host_tokens) == (96, 48, 48)
    fail_host_loads(cache)
    lease = cache.load(m)
    assert not lease.wait()
    cache.release(lease)
    cache.drain()        # applies the failed load's ack: AssertionError in _ack_load today
    assert cache.match(A2_PROMPT).host_tokens == 48
    cache.check_integrity()
    cache.close()
