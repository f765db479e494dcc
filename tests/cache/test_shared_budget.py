"""One byte budget per tier (``budget="shared"``): pages and snapshots compete for one arena.

Layout: hybrid_layout, page objects 64 B, snapshot objects 136 B. Device arena of
6 pages + 2 snapshots = 656 B: page ids 0..9 from byte 0, state ids 0..3 ending at byte
656 (the first snapshot gets id 3). Two finished requests A and B of 3 pages and one
snapshot each fill it exactly: A pages 0-2 + state 3, B pages 3-5 + state 2.
"""

from __future__ import annotations

from contextlib import contextmanager
from unittest import mock

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from hicache.cache import Boundary
from hicache.cache.room import Room, _node_still
from hicache.pools import Source, Tier
from hicache.tree import Snapshot
from hicache.transfer import TransferConfig
from tests.cache.conftest import Engine, hybrid_layout, make_cache, mha_layout, toks
from tests.cache.test_stress import POLICIES, run

A, B, C = toks(1, 2, 3), toks(4, 5, 6), toks(7, extra=1)


def scanned_owners(room, tier, source, wanted):
    """The owners of ``wanted`` ids found by scanning every node (what the owner index
    replaces): the reference its lookups are checked against."""
    device, out = tier is Tier.DEVICE, {}
    resume = {id(s) for s in room._res.resume_snapshots()} if device else set()
    for node in room._res._tree.nodes():
        if source is Source.PAGE:
            held = node.device_ids if device else node.host_ids
            for pos, i in enumerate([] if held is None else held.tolist()):
                if i in wanted and _node_still(node):
                    out[i] = (node, pos)
        elif node.snapshot is not None:
            s = node.snapshot
            row = s.device_id if device else s.host_id
            if row in wanted and not s.busy and id(s) not in resume:
                out[row] = s
    return out


@contextmanager
def owners_checked_by_scan():
    """Every compaction's owner lookup is compared with a scan of the tree; yields the
    number of lookups made."""
    real, calls = Room._owners, [0]

    def checked(room, tier, source, wanted):
        got = real(room, tier, source, wanted)
        want = scanned_owners(room, tier, source, wanted)
        assert got.keys() == want.keys() and all(
            (got[k] is want[k]) if isinstance(want[k], Snapshot) else
            (got[k][0] is want[k][0] and got[k][1] == want[k][1]) for k in want), (tier, source, wanted)
        calls[0] += 1
        return got

    with mock.patch.object(Room, "_owners", checked):
        yield calls


def node_of(cache, tokens):
    return next(n for n in cache._tree.nodes() if np.array_equal(n.tokens, tokens))


def filled(**kw):
    eng = Engine(make_cache(device_pages=6, device_snaps=2, host_pages=12, host_snaps=4, budget="shared",
                            retention=None, **kw))
    eng.run(A)
    eng.run(B)
    cache = eng.cache
    a, b = node_of(cache, A), node_of(cache, B)
    assert (a.device_ids.tolist(), a.snapshot.device_id) == ([0, 1, 2], 3)
    assert (b.device_ids.tolist(), b.snapshot.device_id) == ([3, 4, 5], 2)
    assert cache.pools.device.middle_bytes() == 0
    return eng, a, b


def fresh_lease(cache):
    return cache.load(cache.match(C))   # nothing cached for C: locks nothing


def reread(eng, tokens):
    """Start a request on ``tokens`` (every borrowed byte verified), release it, check the
    cache; its match and lease."""
    m, lease = eng.start(tokens)
    eng.cache.release(lease)
    eng.cache.check_integrity()
    return m, lease


def test_a_snapshot_evicts_a_colder_page_run():
    eng, a, b = filled()
    cache = eng.cache
    b.last_access = -1.0                                  # B's pages are the coldest object
    lease = fresh_lease(cache)
    res = cache.alloc_snapshot(lease)
    assert res.ok and res.ids.tolist() == [1]             # the middle B's pages left
    assert not b.on_device and b.on_host                   # demoted (write_through backed it up)
    assert b.snapshot.device_id == 2 and a.device_ids.tolist() == [0, 1, 2]
    assert cache.counters.device_demoted_pages == 3 and cache.counters.snapshots_evicted_device == 0
    cache.release(lease)
    cache.check_integrity()
    cache.close()


def test_a_page_run_evicts_a_colder_snapshot():
    eng, a, b = filled()
    cache = eng.cache
    b.snapshot.last_access = -1.0                         # B's snapshot is the coldest object
    lease = fresh_lease(cache)
    res = cache.alloc_pages(lease, 2)
    assert res.ok and res.ids.tolist() == [6, 7]          # where B's snapshot (id 2) was
    assert b.snapshot.device_id is None and b.on_device   # only the snapshot's device copy went
    assert a.device_ids.tolist() == [0, 1, 2] and a.snapshot.device_id == 3
    cache.release(lease)
    cache.check_integrity()
    cache.close()


def test_compaction_moves_a_page_and_its_node_reads_back_its_bytes():
    eng, a, b = filled()
    cache = eng.cache
    a.last_access = -1.0                                  # A's pages go; B's are then moved down
    lease = fresh_lease(cache)
    res = cache.alloc_snapshot(lease)
    assert res.ok and res.ids.tolist() == [1]
    assert not a.on_device
    # moves (5 -> 0), (4 -> 1), (3 -> 2): B's node now holds [2, 1, 0]
    assert b.device_ids.tolist() == [2, 1, 0] and cache.counters.compaction_moves == 3
    assert cache.pools.device.extent("page") == 3 * 64
    cache.release(lease)
    cache.check_integrity()
    m, again = reread(eng, toks(4, 5, 6, extra=1))        # verifies every byte it borrows
    assert m.resume_tokens == m.device_tokens == 12 and again.page_table == [2, 1, 0]
    assert again.snapshot_id == 2
    cache.close()


def test_locked_pages_never_move():
    eng, a, b = filled()
    cache = eng.cache
    a.last_access = -1.0
    m, holder = eng.start(toks(4, 5, 6, extra=1))         # B's pages and snapshot locked
    assert m.resume_tokens == 12 and b.lock_device == 1
    lease = fresh_lease(cache)
    res = cache.alloc_snapshot(lease)
    assert res.ok and res.ids.tolist() == [3]             # A's snapshot went instead
    assert b.device_ids.tolist() == [3, 4, 5] and cache.counters.compaction_moves == 0
    assert a.snapshot is None or a.snapshot.device_id is None
    for lz in (lease, holder):
        cache.release(lz)
    cache.check_integrity()
    cache.close()


def test_a_running_requests_newest_snapshot_moves_out_of_its_way():
    """The lease's lock on its newest published snapshot holds no row id: compaction moves
    it into the hole A's snapshot left, and the lease's own page allocation then fits in
    the middle (left in place it pinned the state frontier and starved its own request)."""
    eng = Engine(make_cache(device_pages=6, device_snaps=2, host_pages=12, host_snaps=4, budget="shared",
                            retention=None))
    cache = eng.cache
    eng.run(A)                                            # A: pages 0-2, state 3 (rank 0)
    a = node_of(cache, A)
    lease = cache.load(cache.match(B))
    eng.publish(lease, B, 3, why=Boundary.PROMPT_END)    # B: pages 3-5, state 2, locked as newest
    cache.drain()                                         # B's backups done: nothing reads it
    b = node_of(cache, B)
    assert b.device_ids.tolist() == [3, 4, 5] and b.snapshot.device_id == 2 and b.snapshot.lock == 1
    assert not b.snapshot.busy
    a.snapshot.last_access = -1.0                         # A's snapshot is the coldest object
    res = cache.alloc_pages(lease, 2)
    assert res.ok and res.ids.tolist() == [6, 7]          # the middle, once B's snapshot moved
    assert b.snapshot.device_id == 3 and cache.counters.compaction_moves == 1
    assert a.device_ids.tolist() == [0, 1, 2] and a.snapshot.device_id is None
    cache.release(lease)
    cache.check_integrity()
    m, again = reread(eng, toks(4, 5, 6, extra=1))        # reads B's moved snapshot back
    assert m.resume_tokens == 12 and again.snapshot_id == 3
    cache.close()


def test_a_running_requests_resume_snapshot_never_moves():
    eng, a, b = filled()
    cache = eng.cache
    m, holder = eng.start(toks(4, 5, 6, extra=1))         # resumes from B's snapshot (row 2)
    assert holder.snapshot_id == 2
    a.snapshot.last_access = -1.0
    lease = fresh_lease(cache)
    res = cache.alloc_pages(lease, 2)
    # A's snapshot went (a hole at row 3), but B's snapshot is the holder's snapshot_id: it
    # stays, and A's pages go down instead
    assert res.ok and res.ids.tolist() == [0, 1] and not a.on_device
    assert b.snapshot.device_id == holder.snapshot_id == 2 and cache.counters.compaction_moves == 0
    for lz in (lease, holder):
        cache.release(lz)
    cache.check_integrity()
    cache.close()


def chain(retention=None, eviction="lru"):
    """Write_back, shared: one request X of 6 pages published in two chunks, so a mid-chain
    snapshot at page 3 (node x, one child) and a leaf snapshot at page 6 (node y); the device
    arena is full (6 pages + 2 snapshots)."""
    eng = Engine(make_cache(device_pages=6, device_snaps=2, host_pages=12, host_snaps=4, budget="shared",
                            write_policy="write_back", retention=retention, eviction=eviction))
    eng.run(toks(1, 2, 3, 4, 5, 6), chunk_pages=3)
    cache = eng.cache
    x, y = node_of(cache, toks(1, 2, 3)), node_of(cache, toks(4, 5, 6))
    assert list(x.children.values()) == [y] and x.snapshot.device_id is not None and y.snapshot is not None
    assert cache.pools.device.middle_bytes() == 0 and not x.on_host and not y.on_host
    return eng, x, y


@pytest.mark.parametrize("eviction", ["value", "lru"])
def test_write_back_drops_a_mid_chain_snapshot_under_value(eviction):
    """A request passing x's boundary resumes at y's deeper snapshot: under ``value`` x's
    snapshot is not worth host bytes, so its eviction drops it (y's leaf snapshot would be
    backed up). The decision is the placement policy's, as with split pools: ``lru``
    backs every victim up."""
    eng, x, y = chain(eviction=eviction)
    cache = eng.cache
    x.snapshot.last_access = -1.0                         # x's snapshot is the coldest object
    res = cache.alloc_snapshot(fresh_lease(cache))
    if eviction == "value":
        assert res.ok and x.snapshot is None and cache.counters.snapshots_evicted_device == 1
        assert cache.counters.snapshots_backed_up == 0 and cache.pools.host.num_used("state") == 0
    else:
        assert res.ok and x.snapshot.device_id is None and x.snapshot.host_id is not None
        assert cache.counters.snapshots_backed_up == 1 and cache.pools.host.num_used("state") == 1
    assert y.snapshot.device_id is not None and x.on_device and y.on_device
    cache.release(next(iter(cache._leases.values())))
    cache.check_integrity()
    m, _ = reread(eng, toks(1, 2, 3, 4, 5, 6, extra=1))   # still resumes at y, bytes checked
    assert m.resume_tokens == 24
    cache.close()


def test_write_back_backs_up_a_leaf_snapshot():
    eng, x, y = chain()
    cache = eng.cache
    y.snapshot.last_access = -1.0                         # the leaf's snapshot is the coldest
    lease = fresh_lease(cache)
    res = cache.alloc_snapshot(lease)
    assert res.ok and y.snapshot.device_id is None and y.snapshot.host_id is not None
    assert cache.counters.snapshots_backed_up == 1 and cache.counters.snapshots_evicted_device == 0
    cache.release(lease)
    cache.check_integrity()
    cache.close()


def test_pages_with_a_copy_in_flight_never_move():
    eng, a, b = filled(write_policy="write_back")
    cache = eng.cache
    a.last_access = -1.0
    b.backup_pending += 1                                 # as a D2H copy reading B would
    lease = fresh_lease(cache)
    res = cache.alloc_snapshot(lease)
    assert b.device_ids.tolist() == [3, 4, 5] and cache.counters.compaction_moves == 0
    # A's pages went down with their snapshot's backup, whose L3 put now reads A's
    # snapshot: the next victim is B's snapshot (a copy reading B's pages never stops that)
    assert a.snapshot.put_pending and not a.on_device
    assert res.ok and res.ids.tolist() == [2] and b.snapshot.device_id is None
    b.backup_pending -= 1
    cache.release(lease)
    cache.check_integrity()
    cache.close()


def test_state_cap_keeps_snapshots_under_their_share():
    cache = make_cache(device_pages=6, device_snaps=2, host_pages=12, host_snaps=4, budget="shared",
                       state_cap=0.25, retention=None)
    # 656 B x 0.25 = 164 B: one snapshot
    assert cache.pools.device.capacity("state") == 1 and cache.pools.device.capacity("page") == 10
    eng = Engine(cache)
    eng.run(A)
    eng.run(B)                                            # B's snapshot evicts A's
    assert node_of(cache, B).snapshot.device_id == 0
    assert cache.pools.device.num_used("state") == 1
    cache.check_integrity()
    cache.close()


@pytest.mark.parametrize("budget", ["shared", "shared_host"])
@pytest.mark.parametrize("policy, tier", POLICIES)
def test_stress_shared_budget_compacts_and_stays_whole(policy, tier, budget):
    cache = make_cache(device_pages=12, device_snaps=4, host_pages=20, host_snaps=6, write_policy=policy,
                       host_tier=tier, retention=0, budget=budget)
    assert (cache.pools.device.arena is None) == (budget == "shared_host") and cache.pools.host.arena is not None
    with owners_checked_by_scan() as lookups:
        rep = run(cache, ops=400, seed=1, fault_rate=0.05, prefetch=0.7)
    assert rep.verified_pages > 0
    if budget == "shared":   # a host arena alone need not fill up under every write policy
        assert rep.stats["compaction_moves"] > 0 and lookups[0] > 0


@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(seed=st.integers(0, 10_000), device_pages=st.integers(6, 16), host_pages=st.integers(4, 30),
       snaps=st.integers(1, 5), retention=st.sampled_from([None, 0, 8]), policy=st.sampled_from(POLICIES),
       eviction=st.sampled_from(["lru", "lfu", "value"]), running=st.integers(1, 4),
       layout=st.sampled_from([hybrid_layout, mha_layout]), faults=st.sampled_from([0.0, 0.0, 0.1]),
       cap=st.sampled_from([None, None, 0.5]), queue=st.sampled_from([2, 4096]),
       budget=st.sampled_from(["shared", "shared_host"]))
def test_shared_budget_random_operations(seed, device_pages, host_pages, snaps, retention, policy, eviction,
                                         running, layout, faults, cap, queue, budget):
    cache = make_cache(layout(), device_pages=device_pages, device_snaps=snaps, host_pages=host_pages,
                       host_snaps=snaps + 1, write_policy=policy[0], host_tier=policy[1], retention=retention,
                       eviction=eviction, budget=budget, state_cap=cap,
                       transfer=TransferConfig(max_queued_ops=queue))
    with owners_checked_by_scan():
        run(cache, ops=150, seed=seed, max_running=running, fault_rate=faults)
