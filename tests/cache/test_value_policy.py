"""The value eviction strategy's admission to the host: under write_back a device victim is
backed up only when it can still serve a hit (issue 14)."""

import numpy as np
import pytest

from hicache.cache import Boundary

from tests.cache.conftest import Engine, make_cache, mha_layout, node_of, toks


@pytest.mark.parametrize("eviction, backed_up", [("lru", 2), ("value", 0)])
def test_a_dead_tail_is_dropped_not_demoted_under_value(eviction, backed_up):
    eng = Engine(make_cache(device_pages=2, host_pages=4, write_policy="write_back", eviction=eviction))
    a = toks(1, 2, extra=1)
    _, lease = eng.start(a)
    eng.publish(lease, a, 2, snapshot=False)        # no snapshot: no request can resume in A
    eng.cache.release(lease)
    eng.run(toks(3, 4, extra=1))                    # needs both device pages: A is the victim
    assert eng.cache.counters.backed_up_pages == backed_up
    assert eng.cache.pools.host.num_used("page") == backed_up
    assert eng.cache.counters.device_evicted_pages == 2 - backed_up
    assert eng.cache.match(a).resume_tokens == 0
    eng.cache.check_integrity()


@pytest.mark.parametrize("eviction, host_snaps", [("lru", 1), ("value", 0)])
def test_an_intermediate_snapshot_is_dropped_not_demoted_under_value(eviction, host_snaps):
    eng = Engine(make_cache(device_pages=8, device_snaps=2, host_snaps=4, write_policy="write_back",
                            eviction=eviction))
    turn1, turn2 = toks(1, 2, extra=1), toks(1, 2, 3, 4, extra=1)
    eng.run(turn1)                                  # snapshot at page 2
    eng.run(turn2)                                  # resumes there, snapshot at page 4
    assert eng.cache.match(turn2).resume_tokens == 16
    assert eng.cache.pools.device.num_used("state") == 2
    eng.run(toks(7, extra=1))                       # a third snapshot: the oldest (page 2) goes
    assert eng.cache.pools.host.num_used("state") == host_snaps
    assert eng.cache.match(turn1).resume_tokens == 8 * host_snaps
    assert eng.cache.match(turn2).resume_tokens == 16   # the newest turn is intact either way
    eng.cache.check_integrity()


@pytest.mark.parametrize("eviction, host_snaps", [("lru", 2), ("value", 1)])
def test_a_demoted_page_run_takes_its_snapshot_down_only_when_it_is_not_intermediate(eviction, host_snaps):
    """write_back demotes a page run with the snapshot at its end -- under ``value`` not an
    intermediate one (a deeper snapshot on its only path): on a long chain those cost a
    quarter of the chain's host bytes and every request resumes deeper anyway."""
    eng = Engine(make_cache(device_pages=4, device_snaps=4, host_pages=8, host_snaps=4, write_policy="write_back",
                            host_tier="exclusive", eviction=eviction))
    chain = toks(1, 2, 3, 4, extra=1)
    eng.run(chain, chunk_pages=2)                   # nodes [1,2] and [3,4], a snapshot at each end
    eng.run(toks(7, 8, 9, 10, extra=1))             # needs the whole device: the chain is demoted
    upper, lower = node_of(eng.cache, toks(1, 2)), node_of(eng.cache, chain)
    assert not upper.on_device and not lower.on_device and eng.cache.pools.host.num_used("page") == 4
    assert lower.snapshot.host_id is not None
    assert eng.cache.pools.host.num_used("state") == host_snaps
    assert (upper.snapshot is not None and upper.snapshot.host_id is not None) == (eviction == "lru")
    m, lease = eng.start(chain)                     # still resumes at the chain's end, bytes checked
    assert m.resume_tokens == 16 and lease.loaded_tokens == 16
    eng.cache.release(lease)
    eng.cache.check_integrity()


def test_value_keeps_the_newest_turn_of_an_older_conversation_over_an_intermediate_one():
    eng = Engine(make_cache(device_pages=12, device_snaps=3, host_snaps=1, write_policy="write_through",
                            eviction="value"))
    other = toks(9, extra=1)
    eng.run(other)                                  # conversation B: its newest (only) turn, oldest
    eng.run(toks(1, 2, extra=1))                    # conversation A, turn 1
    eng.run(toks(1, 2, 3, 4, extra=1))              # A, turn 2: A's turn-1 snapshot is intermediate
    eng.run(toks(5, extra=1))                       # a new snapshot needs a device row
    node_a1 = node_of(eng.cache, toks(1, 2))
    assert node_a1.snapshot is None or node_a1.snapshot.device_id is None
    assert node_of(eng.cache, toks(9)).snapshot.device_id is not None   # LRU would have taken B
    eng.cache.check_integrity()


def test_without_state_every_write_back_victim_is_demoted_under_value():
    # no snapshots at all (MHA): a childless node is not a dead tail, it is the prefix itself
    eng = Engine(make_cache(mha_layout(), device_pages=2, host_pages=4, write_policy="write_back",
                            eviction="value"))
    a = toks(1, 2, extra=1)
    eng.run(a)
    eng.run(toks(3, extra=1))                       # A is the victim: backed up, then demoted
    # only the page asked for goes (the head of A stays on the device, still a prefix)
    assert eng.cache.counters.backed_up_pages == 1 and eng.cache.counters.device_evicted_pages == 0
    m = eng.cache.match(a)
    assert (m.resume_tokens, m.device_tokens, m.host_tokens) == (8, 4, 4)
    eng.cache.check_integrity()


@pytest.mark.parametrize("eviction", ["lru", "value"])
def test_a_write_back_eviction_reaches_past_a_leaf_whose_snapshot_it_just_backed_up(eviction):
    # The device holds one chain: B (4 pages, no snapshot) -> C (1 page, snapshot). A new
    # request needs 5 pages: C goes down first (page and snapshot), then B, whose backup
    # needs the whole host, so C's fresh host copy must make way. C's snapshot backup used
    # to be left in flight: C stayed busy, its host copy could not be evicted and B could
    # be neither backed up nor dropped -- the allocation failed with 5 pages evictable,
    # which under greedy admission became a preemption livelock (issue 14). (No L3 here: an
    # L3 put of C's fresh host copy would pin it too, until a drain; the scheduler drains
    # and retries after preempting, tests/engine/test_livelock.py.)
    eng = Engine(make_cache(device_pages=6, device_snaps=2, host_pages=4, host_snaps=2, storage="none://",
                            write_policy="write_back", host_tier="exclusive", eviction=eviction))
    cache = eng.cache
    a = toks(1, 2, 3, 4, 5, extra=1)
    _, lease = eng.start(a)
    eng.publish(lease, a, 4, snapshot=False)
    eng.publish(lease, a, 5, Boundary.FINISH)
    cache.release(lease)
    cache.drain()
    assert cache.pools.device.num_free("page") == 1
    _, other = eng.start(toks(7, extra=1))
    assert cache.alloc_pages(other, 5).ok
    assert node_of(cache, toks(1, 2, 3, 4)).host_ids is not None    # B was demoted, not lost
    cache.check_integrity()
    cache.release(other)
    cache.close()


def test_a_branch_snapshot_lets_every_later_sibling_resume_at_the_fork():
    eng = Engine(make_cache(device_pages=16, device_snaps=4, retention=4096, eviction="value"))
    cache = eng.cache
    eng.run(toks(1, 2, 3, 4, extra=1))             # one snapshot, at A's end (page 4)
    b = toks(1, 2, 5, 6, extra=1)
    m = cache.match(b)
    assert (m.resume_tokens, m.history_tokens, m.branch_tokens) == (0, 8, 8)
    assert cache.match(toks(1, 2, 3, 4, 7, extra=1)).branch_tokens == 0   # resumes at A's end
    assert cache.match(toks(1, 2, extra=1)).branch_tokens == 0            # the fork is its prompt end
    _, lease = eng.start(b)
    eng.publish(lease, b, 2, Boundary.BRANCH)      # the chunk ends at the fork, with a snapshot
    eng.publish(lease, b, 4, Boundary.PROMPT_END)
    cache.release(lease)
    fork = node_of(cache, toks(1, 2))
    assert len(fork.children) == 2 and fork.snapshot is not None and fork.snapshot.device_id is not None
    c = cache.match(toks(1, 2, 8, 9, extra=1))
    assert (c.resume_tokens, c.branch_tokens) == (8, 0)
    cache.check_integrity()
    cache.close()


@pytest.mark.parametrize("eviction, fork_tokens", [("lru", 0), ("value", 8)])
def test_a_request_passing_a_branch_points_snapshot_keeps_it_warm_under_value(eviction, fork_tokens):
    # P's snapshot at page 2 is a branch point (X and Y fork there). X's next turn resumes
    # at X's own snapshot, deeper: under value passing the fork counts as using its
    # snapshot, so when X2's snapshot needs a row, Y's leaf snapshot goes instead of the
    # fork's, and a new sibling still resumes at the fork.
    eng = Engine(make_cache(device_snaps=3, host_snaps=1, write_policy="write_through_selective", threshold=99,
                            eviction=eviction))
    eng.run(toks(1, 2, extra=1))
    eng.run(toks(1, 2, 3, extra=1))
    eng.run(toks(1, 2, 4, extra=1))
    fork = node_of(eng.cache, toks(1, 2))
    assert len(fork.children) == 2 and eng.cache.pools.device.num_used("state") == 3
    eng.run(toks(1, 2, 3, 5, extra=1))              # X2: resumes at X's snapshot, needs a row
    assert eng.cache.match(toks(1, 2, 3, 5, extra=1)).resume_tokens == 16
    assert eng.cache.match(toks(1, 2, 6, extra=1)).resume_tokens == fork_tokens
    assert eng.cache.match(toks(1, 2, 4, extra=1)).resume_tokens == (8 if eviction == "value" else 12)
    eng.cache.check_integrity()
    eng.cache.close()


def test_value_classes():
    """Intermediate snapshots rank 0, the end of a path 1 (with the page runs), a branch
    point 2 whatever its age."""
    from hicache.tree import Value
    eng = Engine(make_cache(device_snaps=8, eviction="value"))
    eng.run(toks(1, 2, extra=1))
    eng.run(toks(1, 2, 3, extra=1))
    eng.run(toks(1, 2, 4, extra=1))
    eng.run(toks(1, 2, 3, 5, extra=1))
    fork, x, x2 = (node_of(eng.cache, toks(*p)) for p in ((1, 2), (1, 2, 3), (1, 2, 3, 5)))
    v = Value()
    assert v.snapshot_priority(fork, fork.snapshot) == (2, fork.snapshot.last_access)
    assert v.snapshot_priority(x, x.snapshot) == (0, x.snapshot.last_access)
    assert v.snapshot_priority(x2, x2.snapshot) == (1, x2.snapshot.last_access)
    assert v.node_priority(x2) == (1, x2.last_access)
    eng.cache.check_integrity()
    eng.cache.close()


def test_a_branch_points_snapshot_outlasts_deeper_leaf_snapshots():
    # Rows for three snapshots: the fork (a branch point at depth 2, the oldest) and the
    # leaves X, Y at depth 3. Were the fork ranked with them by age, Z's snapshot would take
    # its row and no new sibling could resume.
    eng = Engine(make_cache(device_snaps=3, host_snaps=1, write_policy="write_through_selective", threshold=99,
                            eviction="value"))
    eng.run(toks(1, 2, extra=1))
    eng.run(toks(1, 2, 3, extra=1))
    eng.run(toks(1, 2, 4, extra=1))
    eng.run(toks(7, extra=1))
    assert eng.cache.match(toks(1, 2, 9, extra=1)).resume_tokens == 8      # new siblings still resume at the fork
    assert eng.cache.match(toks(1, 2, 3, extra=1)).resume_tokens == 8        # the older leaf (X) gave its row
    assert eng.cache.match(toks(1, 2, 4, extra=1)).resume_tokens == 12
    eng.cache.check_integrity()
    eng.cache.close()


def test_a_former_branch_point_keeps_its_snapshot_for_the_next_sibling():
    # Rows for four snapshots. X and Y fork after P (1, 2); X's next turn (X2) makes X's
    # snapshot intermediate and it goes; then Y's branch is evicted whole, so the fork has
    # one child and a deeper snapshot below it, like a shared system prompt whose other
    # tasks have gone. It is still where the next new branch resumes: when (9) needs a row
    # the oldest snapshot elsewhere (7's) gives it, not the fork's. Ranked as intermediate,
    # the fork's went and the new sibling recomputed the whole prefix.
    eng = Engine(make_cache(device_pages=7, device_snaps=4, write_policy="write_through_selective", threshold=99,
                            eviction="value"))
    cache = eng.cache
    for pages in [(7,), (1, 2), (1, 2, 3), (1, 2, 4), (7,), (1, 2, 3, 5), (8,)]:
        eng.run(toks(*pages, extra=1))
    fork = node_of(cache, toks(1, 2))
    assert len(fork.children) == 2 and fork.snapshot is not None
    eng.run(toks(9, extra=1))                   # Y's page run goes (the oldest leaf), then a row
    assert len(fork.children) == 1 and fork.forked and fork.snapshots_below == 1
    assert cache.match(toks(1, 2, 6, extra=1)).resume_tokens == 8      # a new sibling resumes at the fork
    assert cache.match(toks(7, extra=1)).resume_tokens == 0            # 7's snapshot gave its row
    assert cache.match(toks(1, 2, 3, 5, extra=1)).resume_tokens == 16
    cache.check_integrity()
    cache.close()


def test_without_state_adaptive_runs_the_candidates_that_can_rank_differently():
    # value and reuse rank as lru without snapshots; reuse-prompt and reuse-prompt-late both
    # put a decode's idle pages first, so one of them stays; probation ranks by hits
    cache = make_cache(mha_layout(), eviction="adaptive")
    try:
        names = [c.name for c in cache._policy._selector.candidates]
        assert names == ["lru", "reuse-prompt", "probation"]
        assert [getattr(c, "decoded_first", False) for c in cache._policy._selector.candidates] == [False, True, True]
    finally:
        cache.close()
    cache = make_cache(eviction="adaptive")   # with state: every default candidate
    try:
        assert [c.name for c in cache._policy._selector.candidates] == [
            "lru", "value", "reuse", "reuse-prompt", "reuse-prompt-late", "probation"]
        assert not any(getattr(c, "decoded_first", False) for c in cache._policy._selector.candidates)
    finally:
        cache.close()
