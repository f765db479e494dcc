"""HiCache scenarios with exact expectations: resume points, shadows, eviction order,
retention counts, write policies, all-or-nothing loads, misuse."""

from __future__ import annotations

import pytest

from hicache.cache import Boundary
from hicache.errors import ConfigError, MisuseError
from tests.cache.conftest import Engine, make_cache, mha_layout, node_of, toks



def test_miss_then_resume_at_snapshot(engine):
    t = toks(1, 2, 3, extra=1)
    m = engine.cache.match(t)
    assert (m.resume_tokens, m.history_tokens, len(m.l3_hashes)) == (0, 0, 3)
    engine.run(t)
    m = engine.cache.match(t)
    assert (m.resume_tokens, m.device_tokens, m.host_tokens, m.snapshot_tier) == (12, 12, 0, "device")
    assert m.history_tokens == 12 and m.l3_hashes == ()
    # One page short of the snapshot: the history is there, the state is not.
    m = engine.cache.match(toks(1, 2, 3))
    assert (m.resume_tokens, m.history_tokens) == (0, 8)
    _, lease = engine.start(t)
    assert lease.resume_tokens == 12 and len(lease.page_table) == 3
    engine.cache.release(lease)
    engine.cache.check_integrity()


def test_snapshots_per_chunk_give_every_boundary(engine):
    engine.run(toks(1, 2, 3, extra=1), chunk_pages=1)
    assert engine.cache.match(toks(1, 2, 3)).resume_tokens == 8
    assert engine.cache.match(toks(1, 2, 7, 7)).resume_tokens == 8
    assert engine.cache.match(toks(1, 9)).resume_tokens == 4


def test_resume_is_at_most_len_minus_one():
    eng = Engine(make_cache(mha_layout()))
    eng.run(toks(1, 2, 3, extra=1))
    assert eng.cache.match(toks(1, 2, 3)).resume_tokens == 8     # 12 tokens -> 2 pages
    assert eng.cache.match(toks(1, 2, 3, extra=1)).resume_tokens == 12
    assert eng.cache.match(toks(1, 5)).resume_tokens == 4        # stateless: any page boundary
    eng.cache.close()


def test_mid_flight_publish_is_reused_by_a_concurrent_sibling(engine):
    a = toks(1, 2, 3, 4, extra=2)
    _, la = engine.start(a)
    engine.publish(la, a, 2)                       # A publishes its first chunk mid-flight
    b = toks(1, 2, 9, extra=1)
    m = engine.cache.match(b)
    assert (m.resume_tokens, m.device_tokens) == (8, 8)
    _, lb = engine.start(b)
    assert lb.page_table == la.page_table[:2]      # the very same pages, no copy
    engine.publish(lb, b, 3, Boundary.FINISH)
    engine.publish(la, a, 4, Boundary.FINISH)
    engine.cache.check_integrity()
    engine.cache.release(lb)
    engine.cache.release(la)
    assert engine.cache.counters.duplicate_pages == 0
    engine.cache.check_integrity()


def test_identical_pages_published_twice_are_deduplicated(engine):
    t = toks(5, 6, extra=1)
    _, la = engine.start(t)
    _, lb = engine.start(t)                        # both missed: both compute the pages
    engine.publish(la, t, 2)
    res = engine.publish(lb, t, 2)
    assert res.duplicates_freed == 2 and res.snapshot == "duplicate"
    assert lb.page_table == la.page_table and not lb.owned
    engine.cache.release(la)
    engine.cache.release(lb)
    engine.cache.check_integrity()
    assert engine.cache.pools.device.num_used("page") == 2


def test_device_eviction_demotes_to_shadow_and_loads_back():
    eng = Engine(make_cache(device_pages=4))
    x = toks(1, 2, extra=1)
    eng.run(x)
    eng.cache.drain()
    assert node_of(eng.cache, x[:8]).on_host
    eng.run(toks(3, 4, 5, 6, extra=1))             # needs all 4 device pages: x is demoted
    node = node_of(eng.cache, x[:8])
    assert node.is_shadow
    m = eng.cache.match(x)
    assert (m.resume_tokens, m.device_tokens, m.host_tokens) == (8, 0, 8)
    _, lease = eng.start(x)                        # verifies the loaded bytes
    assert node.on_device and lease.resume_tokens == 8
    eng.cache.release(lease)
    eng.cache.drain()
    c = eng.cache.counters
    # x's 2 pages, then the last 2 of [3..6] to load x back: a victim gives only what is asked
    assert (c.device_demoted_pages, c.loaded_pages, c.host_hit_tokens) == (4, 2, 8)
    eng.cache.check_integrity()


def _fill_four(eng):
    for v in (1, 2, 3, 4):
        eng.run(toks(v, extra=1))
    eng.cache.drain()


@pytest.mark.parametrize("policy", ["lru", "lfu"])
def test_eviction_order(policy):
    eng = Engine(make_cache(device_pages=4, eviction=policy))
    _fill_four(eng)
    for v in (1, 3):                               # two hits on 1 and 3, recently
        for _ in range(2):
            _, lease = eng.start(toks(v, extra=1))
            eng.cache.release(lease)
    _, lease = eng.start(toks(4, extra=1))         # one recent hit on 4
    eng.cache.release(lease)
    eng.run(toks(5, extra=1))                      # needs one page: evicts one victim
    shadows = [v for v in (1, 2, 3, 4) if node_of(eng.cache, toks(v)).is_shadow]
    assert shadows == [2]                          # LRU: 2 oldest; LFU: 2 has no hits
    eng.run(toks(6, extra=1))
    shadows = [v for v in (1, 2, 3, 4, 5) if node_of(eng.cache, toks(v)).is_shadow]
    assert shadows == ([1, 2] if policy == "lru" else [2, 5])   # LFU: 5 was never hit
    eng.cache.check_integrity()


def test_state_only_eviction_keeps_history():
    eng = Engine(make_cache(device_snaps=2, write_policy="write_through_selective"))
    for v in (1, 2, 3):
        eng.run(toks(v, extra=1))                  # third snapshot evicts the first
    assert eng.cache.counters.snapshots_evicted_device == 1
    m = eng.cache.match(toks(1, extra=1))
    assert (m.resume_tokens, m.history_tokens) == (0, 4)   # pages stay, state is gone
    assert node_of(eng.cache, toks(1)).on_device
    assert eng.cache.match(toks(3, extra=1)).resume_tokens == 4
    eng.cache.check_integrity()


def test_state_eviction_demotes_backed_up_snapshot_to_host():
    eng = Engine(make_cache(device_snaps=2, write_policy="write_through"))
    for v in (1, 2):
        eng.run(toks(v, extra=1))
    eng.cache.drain()
    eng.run(toks(3, extra=1))
    m = eng.cache.match(toks(1, extra=1))
    assert (m.resume_tokens, m.snapshot_tier) == (4, "host")
    _, lease = eng.start(toks(1, extra=1))         # loads the snapshot, verifies its bytes
    assert lease.snapshot_id is not None
    eng.cache.release(lease)
    eng.cache.drain()
    assert eng.cache.counters.snapshots_loaded == 1
    eng.cache.check_integrity()


@pytest.mark.parametrize("retention, kept, provisional, dropped, boundaries", [
    (None, 6, 0, 0, [1, 2, 3, 4, 5, 7]),
    (0, 2, 4, 4, [5, 7]),
    (8, 4, 2, 2, [2, 4, 5, 7]),
])
def test_retention(retention, kept, provisional, dropped, boundaries):
    eng = Engine(make_cache(retention=retention))
    prompt = toks(1, 2, 3, 4, 5)
    full = toks(1, 2, 3, 4, 5, 6, 7, extra=1)
    _, lease = eng.start(prompt)
    for pages in (1, 2, 3, 4):
        eng.publish(lease, prompt, pages, Boundary.PREFILL)
    eng.publish(lease, prompt, 5, Boundary.PROMPT_END)
    eng.publish(lease, full, 7, Boundary.FINISH)
    eng.cache.release(lease)
    c = eng.cache.counters
    assert (c.snapshots_offered, c.snapshots_kept, c.snapshots_provisional,
            c.snapshots_dropped_retention) == (6, kept, provisional, dropped)
    have = sorted(eng.cache._tree.depth_pages(n) for n, _ in eng.cache._tree.snapshots())
    assert have == boundaries
    eng.cache.check_integrity()


def test_retention_provisional_snapshot_serves_a_sibling_then_goes():
    eng = Engine(make_cache(retention=0))
    a = toks(1, 2, 3, extra=1)
    _, la = eng.start(a)
    eng.publish(la, a, 1)
    assert eng.cache.match(toks(1, 9)).resume_tokens == 4   # newest boundary is usable
    eng.publish(la, a, 2)
    assert eng.cache.match(toks(1, 9)).resume_tokens == 0   # replaced by the newer one
    assert eng.cache.match(toks(1, 2, 9)).resume_tokens == 8
    eng.cache.release(la)                                     # an abort: provisional goes too
    assert eng.cache.match(toks(1, 2, 9)).resume_tokens == 0
    assert eng.cache.counters.snapshots_dropped_retention == 2
    eng.cache.check_integrity()


def test_write_through_selective_backs_up_after_two_hits():
    eng = Engine(make_cache(write_policy="write_through_selective", threshold=2))
    t = toks(1, 2, extra=1)
    eng.run(t)
    node = node_of(eng.cache, t[:8])
    for expect in (False, True):
        _, lease = eng.start(t)
        eng.cache.release(lease)
        eng.cache.drain()
        assert node.on_host is expect
    assert eng.cache.counters.backed_up_pages == 2


def test_write_back_backs_up_only_on_eviction():
    eng = Engine(make_cache(device_pages=2, write_policy="write_back"))
    a = toks(1, 2, extra=1)
    eng.run(a)
    eng.cache.drain()
    assert not node_of(eng.cache, a[:8]).on_host
    eng.run(toks(3, 5, extra=1))                   # both device pages: all of A goes
    assert node_of(eng.cache, a[:8]).is_shadow
    m = eng.cache.match(a)
    assert (m.resume_tokens, m.host_tokens, m.snapshot_tier) == (8, 8, "device")
    _, lease = eng.start(a)
    eng.cache.release(lease)
    eng.cache.check_integrity()


def test_exclusive_host_tier_moves_pages_instead_of_copying():
    eng = Engine(make_cache(device_pages=2, host_pages=4, write_policy="write_back", host_tier="exclusive"))
    host = eng.cache.pools.host
    a = toks(1, 2, extra=1)
    eng.run(a)
    eng.run(toks(3, 5, extra=1))                    # evicts A: backed up, now a shadow
    na = node_of(eng.cache, a[:8])
    assert na.is_shadow and host.num_used("page") == 2
    assert eng.cache.counters.backed_up_pages == 2
    _, lease = eng.start(a)                         # the load moves A back ...
    assert na.on_host                               # ... its host rows go when the ack is processed
    eng.cache.poll()
    assert na.on_device and not na.on_host
    # A's two rows freed; the two rows in use are [3, 5], evicted to make room for A
    assert host.num_used("page") == 2 and eng.cache.counters.host_released_pages == 2
    assert node_of(eng.cache, toks(3, 5)).is_shadow
    if na.snapshot is not None:
        assert na.snapshot.host_id is None
    eng.cache.release(lease)
    eng.run(toks(4, 6, extra=1))                    # evicted again: backed up again, bytes intact
    # A (2) + [3, 5] (2) + A again (2): every eviction of a page without a host copy copies it
    assert node_of(eng.cache, a[:8]).is_shadow and eng.cache.counters.backed_up_pages == 6
    _, lease = eng.start(a)
    assert lease.resume_tokens == 8 and eng.verified == 4     # both loads of A checked byte for byte
    eng.cache.release(lease)
    eng.cache.check_integrity()


def test_exclusive_host_tier_frees_a_shadow_recomputed_on_the_device():
    eng = Engine(make_cache(device_pages=2, host_pages=4, write_policy="write_back", host_tier="exclusive"))
    a = toks(1, 2, extra=1)
    _, lease = eng.start(a)
    eng.publish(lease, a, 2, snapshot=False)        # no snapshot: A cannot be resumed
    eng.cache.release(lease)
    eng.run(toks(3, extra=1))                       # A evicted to the host
    assert node_of(eng.cache, a[:8]).is_shadow and eng.cache.match(a).resume_tokens == 0
    eng.run(a)                                      # recomputed and published over the shadow
    na = node_of(eng.cache, a[:8])
    assert na.on_device and not na.on_host and eng.cache.counters.host_released_pages == 2
    eng.cache.check_integrity()


def test_a_tail_without_a_snapshot_is_evicted_before_older_live_prefixes():
    eng = Engine(make_cache(device_pages=4, write_policy="write_through", host_pages=1))
    a, b = toks(1, 2, extra=1), toks(3, 4, extra=1)
    eng.run(a)                                      # oldest, resumable at its end
    _, lease = eng.start(b)
    eng.publish(lease, b, 2, snapshot=False)        # newer, but no request can resume in it
    eng.cache.release(lease)
    eng.cache.drain()
    _, lease = eng.start(toks(5, 6, extra=1))
    eng.compute(lease, toks(5, 6, extra=1), 2)      # needs 2 pages: B goes, not the older A
    assert eng.cache.match(a).resume_tokens == 8
    assert eng.cache._tree.walk(b, 2).num_pages == 0
    eng.cache.release(lease)
    eng.cache.check_integrity()


def test_without_state_eviction_is_plain_lru():
    eng = Engine(make_cache(mha_layout(), device_pages=4, write_policy="write_through", host_pages=1))
    a, b = toks(1, 2, extra=1), toks(3, 4, extra=1)
    eng.run(a)
    eng.run(b)
    _, lease = eng.start(toks(5, 6, extra=1))
    eng.compute(lease, toks(5, 6, extra=1), 2)      # the least recently used prefix goes: A
    assert eng.cache._tree.walk(a, 2).num_pages == 0 and eng.cache.match(b).resume_tokens == 8
    eng.cache.release(lease)
    eng.cache.check_integrity()


def test_exclusive_host_tier_needs_write_back():
    with pytest.raises(ConfigError, match="write_back"):
        make_cache(host_tier="exclusive", write_policy="write_through")
    with pytest.raises(ConfigError, match="host_tier"):
        make_cache(host_tier="both", write_policy="write_back")


def test_load_is_all_or_nothing():
    eng = Engine(make_cache(device_pages=2))
    a = toks(1, 2, extra=1)
    eng.run(a)
    eng.cache.drain()
    b = toks(3, 4, extra=1)
    _, lb = eng.start(b)
    eng.publish(lb, b, 2)                          # B holds both device pages, locked
    m = eng.cache.match(a)
    assert m.host_tokens == 8
    lease = eng.cache.load(m)
    assert lease.resume_tokens == 0 and lease.page_table == []
    assert eng.cache.counters.load_fallbacks == 1
    eng.cache.check_integrity()
    eng.cache.release(lease)
    eng.cache.release(lb)
    eng.cache.check_integrity()


def test_per_layer_wait(engine):
    t = toks(1, 2, extra=1)
    engine.run(t)
    lease = engine.cache.load(engine.cache.match(t), start=False)
    for layer in (0, 1, 2):
        assert lease.wait(layer=layer)
    assert lease.wait()
    engine.cache.release(lease)


def test_misuse_errors(engine):
    t = toks(1, extra=1)
    _, lease = engine.start(t)
    with pytest.raises(MisuseError, match="not allocated for this lease"):
        engine.cache.publish(lease, t, 0, snapshot_id=3)
    with pytest.raises(MisuseError, match="publish of 5 pages"):
        engine.cache.publish(lease, t, 5)
    with pytest.raises(MisuseError):
        engine.cache.alloc_pages(lease, -1)
    engine.cache.release(lease)
    with pytest.raises(MisuseError, match="released"):
        engine.cache.release(lease)
    with pytest.raises(MisuseError, match="1-D"):
        engine.cache.match([[1, 2]])
    mha = make_cache(mha_layout())
    _, l2 = Engine(mha).start(t)
    with pytest.raises(MisuseError, match="no state"):
        mha.alloc_snapshot(l2)
    mha.release(l2)
    mha.close()
    engine.cache.check_integrity()


def test_publish_with_an_unknown_boundary_is_one_line_misuse():
    eng = Engine(make_cache())
    a = toks(1, 2, extra=1)
    _, lease = eng.start(a)
    eng.compute(lease, a, 2)
    with pytest.raises(MisuseError, match=r"why='bogus' is not one of \['prefill', 'prompt_end', 'finish', 'branch', 'grain'\]"):
        eng.cache.publish(lease, a, 2, why="bogus")
    assert eng.cache.publish(lease, a, 2, why="branch").published_pages == 2   # nothing lost
    eng.cache.release(lease)
    eng.cache.check_integrity()
    eng.cache.close()


def test_publish_with_other_prefix_tokens_is_refused():
    eng = Engine(make_cache())
    eng.run(toks(1, 2, extra=1))
    _, lease = eng.start(toks(1, 2, extra=1))
    with pytest.raises(MisuseError, match="differ"):
        eng.cache.publish(lease, toks(7, 7, extra=1), 2)
    eng.cache.release(lease)


def test_poll_with_wait_applies_a_copy_still_in_flight():
    import threading

    eng = Engine(make_cache(device_pages=8, write_policy="write_through"))
    gate = threading.Event()
    eng.cache.set_fault_injector(lambda point: gate.wait(5))   # the copy thread holds every batch
    x = toks(1, 2, extra=1)
    _, lease = eng.run(x, release=False)           # write_through: backups queued at publish
    eng.cache.poll()
    assert eng.cache.transfer_stats()["queued_ops"] == 2   # pages + snapshot, held by their thread
    threading.Timer(0.05, gate.set).start()
    eng.cache.poll(wait=True)                      # waits for the thread, then applies it
    assert eng.cache.transfer_stats()["queued_ops"] == 0 and node_of(eng.cache, x[:8]).on_host
    eng.cache.release(lease)
    eng.cache.check_integrity()
    eng.cache.close()


def test_publishing_past_the_resume_point_unpins_the_resume_snapshot():
    eng = Engine(make_cache(device_pages=16, device_snaps=2))
    a = toks(1, 2)
    eng.run(a)
    snap_a = node_of(eng.cache, a).snapshot
    _, lease = eng.start(toks(1, 2, 3, 4))
    assert lease.resume_tokens == 8 and lease.snapshot_id == snap_a.device_id and snap_a.lock == 1
    eng.publish(lease, toks(1, 2, 3), 2, snapshot=False)   # not past the resume point: still pinned
    assert snap_a.lock == 1 and lease.snapshot_id is not None
    eng.publish(lease, toks(1, 2, 3), 3)           # past it: the engine has read that state
    assert snap_a.lock == 0 and lease.snapshot_id is None
    assert lease.holds().snapshots == (node_of(eng.cache, toks(1, 2, 3)).snapshot,)
    # with both device rows taken (a's and the lease's newest), a third snapshot evicts a's
    _, other = eng.start(toks(9, extra=1))
    assert eng.cache.alloc_snapshot(other).ok and snap_a.device_id is None
    eng.cache.release(other)
    eng.cache.release(lease)
    eng.cache.check_integrity()
    eng.cache.close()
