"""Prefetch: lookup -> plan -> fetch -> take, with each policy, threshold, cap and state."""

from __future__ import annotations

import numpy as np
import pytest

from hicache.errors import MisuseError
from hicache.storage import (L3Config, L3Store, PrefetchConfig, Prefetcher, PrefetchStatus,
                             open_backend)

from .conftest import page_hashes, rows
from .gated import GatedBackend

FP = "0123456789abcdef"
PB, SB = 2048, 512  # page and state object sizes


def setup(n_pages=6, states=(), policy="wait_complete", **pcfg):
    g = GatedBackend(open_backend("memory://"), gate_ops=("get_into",))
    store = L3Store(g, FP, "", L3Config(read_batch=2))
    hs = page_hashes(10)
    pages = rows(10, PB, seed=1)
    snaps = rows(10, SB, seed=2)
    store.put(hs[:n_pages], "page", list(pages[:n_pages]))
    for i in states:
        store.put([hs[i]], "state", [snaps[i]])
    pf = Prefetcher(store, PB, SB, PrefetchConfig(policy=policy, **pcfg))
    return g, store, pf, hs, pages, snaps


def planned(op):
    assert op.wait_planned(10)
    return op


def test_no_state_full_fetch_wait_complete():
    g, store, pf, hs, pages, _ = setup()
    op = planned(pf.start(hs))
    assert op.status is PrefetchStatus.PLANNED
    p = op.plan
    assert (p.pages, p.state_index, p.l3_pages, p.nbytes) == (6, None, 6, 6 * PB)
    assert pf.held_bytes == 6 * PB
    dst = np.zeros((6, PB), dtype=np.uint8)
    op.fetch(list(dst))
    res = op.take()
    assert (res.usable_pages, res.complete, res.fetched_pages, res.reason) == (6, True, 6, None)
    assert np.array_equal(dst, pages[:6])
    assert op.settled and pf.held_bytes == 0
    assert pf.counts["pages_used"] == 6 and pf.counts["pages_fetched"] == 6
    pf.close()


def test_best_effort_uses_what_is_complete_and_settles_later():
    g, store, pf, hs, pages, _ = setup(policy="best_effort")
    op = planned(pf.start(hs))
    g.gate.clear()
    g.gate.allow(1)                       # first batch (2 pages) only
    dst = np.zeros((6, PB), dtype=np.uint8)
    op.fetch(list(dst))
    assert g.entered.acquire(timeout=10) and g.entered.acquire(timeout=10)  # 2nd batch is waiting
    res = op.take()
    assert (res.usable_pages, res.complete, res.reason) == (2, False, "cancelled")
    assert np.array_equal(dst[:2], pages[:2])
    assert not op.settled and pf.held_bytes == 6 * PB   # rows still being written: keep them
    g.gate.set()
    assert op.wait_settled(10)
    assert pf.held_bytes == 0
    # the batch in flight at cancel time finished and was verified; the caller took 2
    assert op.progress() == 4 and op.status is PrefetchStatus.DONE
    pf.close()


def test_timeout_policy_waits_then_takes_partial():
    g, store, pf, hs, pages, _ = setup(policy="timeout", timeout_s=0.3)
    op = planned(pf.start(hs))
    g.gate.clear()
    g.gate.allow(2)                       # 4 pages, then the store hangs
    dst = np.zeros((6, PB), dtype=np.uint8)
    op.fetch(list(dst))
    res = op.take()                       # returns once the timeout passed
    assert (res.usable_pages, res.complete) == (4, False)
    assert np.array_equal(dst[:4], pages[:4])
    g.gate.set()
    assert op.wait_settled(10) and pf.held_bytes == 0
    pf.close()


def test_timeout_policy_returns_full_result_when_fast():
    g, store, pf, hs, pages, _ = setup(policy="timeout", timeout_s=30)
    op = planned(pf.start(hs))
    dst = np.zeros((6, PB), dtype=np.uint8)
    op.fetch(list(dst))
    assert op.take().usable_pages == 6
    pf.close()


def test_state_is_fetched_with_history_or_nothing_is_used():
    g, store, pf, hs, pages, snaps = setup(n_pages=6, states=(1, 3))
    op = planned(pf.start(hs, need_state=True))
    p = op.plan
    assert (p.pages, p.state_index, p.l3_pages, p.nbytes) == (4, 3, 6, 4 * PB + SB)
    dst, sdst = np.zeros((4, PB), dtype=np.uint8), np.zeros(SB, dtype=np.uint8)
    op.fetch(list(dst), sdst)
    res = op.take()
    assert (res.usable_pages, res.state_ok, res.complete) == (4, True, True)
    assert np.array_equal(dst, pages[:4]) and np.array_equal(sdst, snaps[3])
    pf.close()


def test_partial_history_with_state_is_unusable():
    g, store, pf, hs, pages, snaps = setup(n_pages=6, states=(5,), policy="best_effort")
    op = planned(pf.start(hs, need_state=True))
    assert op.plan.pages == 6
    g.gate.clear()
    g.gate.allow(2)                       # the state object and the first 2 pages
    op.fetch(list(np.zeros((6, PB), dtype=np.uint8)), np.zeros(SB, dtype=np.uint8))
    for _ in range(3):
        assert g.entered.acquire(timeout=10)
    res = op.take()
    assert (res.usable_pages, res.state_ok, res.fetched_pages) == (0, False, 2)
    g.gate.set()
    assert op.wait_settled(10) and pf.held_bytes == 0
    pf.close()


def test_corrupt_state_means_no_page_is_fetched():
    g, store, pf, hs, pages, snaps = setup(n_pages=4, states=(3,))
    key = store.key(hs[3], "state")
    store.backend.inner.put([key], [b"garbage" * 100])
    op = planned(pf.start(hs, need_state=True))
    op.fetch(list(np.zeros((4, PB), dtype=np.uint8)), np.zeros(SB, dtype=np.uint8))
    res = op.take()
    assert (res.usable_pages, res.fetched_pages, res.reason) == (0, 0, "state foreign")
    assert [c for c in g.calls if c[0] == "get_into"] == [("get_into", 1)]  # pages never read
    pf.close()


@pytest.mark.parametrize("n_pages, states, need_state, kw, reason", [
    (0, (), False, {}, "miss"),
    (4, (), True, {}, "no_state"),
    (2, (), False, {"threshold_pages": 3}, "below_threshold"),
    (4, (), False, {"max_host_bytes": PB - 1}, "over_budget"),
    (4, (3,), True, {"max_host_bytes": 4 * PB}, "over_budget"),  # 4 pages + state do not fit
])
def test_skips(n_pages, states, need_state, kw, reason):
    g, store, pf, hs, *_ = setup(n_pages=n_pages, states=states, **kw)
    op = planned(pf.start(hs, need_state=need_state))
    assert op.status is PrefetchStatus.SKIPPED and op.skip_reason == reason and op.settled
    assert op.take().usable_pages == 0 and pf.held_bytes == 0
    pf.close()


def test_host_memory_cap_cuts_plans_and_is_released():
    g, store, pf, hs, *_ = setup(n_pages=6, states=(1, 4), max_host_bytes=3 * PB + SB)
    a = planned(pf.start(hs, need_state=True))
    assert (a.plan.pages, a.plan.state_index) == (2, 1)   # 5 pages + state would not fit
    assert pf.counts["cut_by_budget"] == 1 and pf.held_bytes == 2 * PB + SB
    b = planned(pf.start(hs))                              # 1 page left in the budget
    assert b.plan.pages == 1 and pf.held_bytes == 3 * PB + SB
    c = planned(pf.start(hs))
    assert c.skip_reason == "over_budget"
    a.cancel()                                             # never fetched: released at once
    assert a.settled and a.status is PrefetchStatus.CANCELLED and pf.held_bytes == PB
    b.fetch([np.zeros(PB, dtype=np.uint8)])
    assert b.take().usable_pages == 1 and pf.held_bytes == 0
    pf.close()


def test_key_evicted_between_lookup_and_read_shortens_the_hit():
    g, store, pf, hs, pages, _ = setup(n_pages=6)
    op = planned(pf.start(hs))
    assert op.plan.pages == 6
    store.delete([hs[3]])
    dst = np.zeros((6, PB), dtype=np.uint8)
    op.fetch(list(dst))
    res = op.take()
    assert (res.usable_pages, res.complete, res.reason) == (3, False, "missing")
    assert np.array_equal(dst[:3], pages[:3])
    pf.close()


def test_fetch_misuse():
    g, store, pf, hs, *_ = setup(n_pages=3, states=(2,))
    op = planned(pf.start(hs, need_state=True))
    with pytest.raises(MisuseError):
        op.fetch([np.zeros(PB, dtype=np.uint8)] * 2, np.zeros(SB, dtype=np.uint8))
    with pytest.raises(MisuseError):
        op.fetch([np.zeros(PB, dtype=np.uint8)] * 3)
    op.fetch([np.zeros(PB, dtype=np.uint8) for _ in range(3)], np.zeros(SB, dtype=np.uint8))
    with pytest.raises(MisuseError):
        op.fetch([np.zeros(PB, dtype=np.uint8)] * 3, np.zeros(SB, dtype=np.uint8))
    assert op.take().usable_pages == 3
    with pytest.raises(MisuseError):
        Prefetcher(store, PB, 0).start(hs, need_state=True)
    pf.close()


def test_take_before_fetch_cancels_the_plan():
    g, store, pf, hs, *_ = setup()
    op = planned(pf.start(hs))
    res = op.take()
    assert res.usable_pages == 0 and op.status is PrefetchStatus.CANCELLED and pf.held_bytes == 0
    pf.close()


def test_for_layout_sizes(configs_dir):
    from hicache.config import load_config

    layout, _ = load_config(configs_dir / "tiny-hybrid.yaml")
    pf = Prefetcher.for_layout(L3Store(open_backend("memory://"), layout.fingerprint), layout)
    assert (pf.page_bytes, pf.state_bytes) == (layout.object_bytes("page"), layout.object_bytes("state"))
    pf.close()


def test_close_settles_queued_ops():
    g, store, pf, hs, *_ = setup()
    g.gate.clear()
    a = planned(pf.start(hs))
    a.fetch(list(np.zeros((6, PB), dtype=np.uint8)))   # worker 1 blocks inside the read
    assert g.entered.acquire(timeout=10)
    b = planned(pf.start(hs))
    b.fetch(list(np.zeros((6, PB), dtype=np.uint8)))   # worker 2 blocks too
    assert g.entered.acquire(timeout=10)
    c = pf.start(hs)                                   # queued behind them
    a.cancel()
    b.cancel()
    g.gate.allow(2)                                    # the two blocked reads finish, then stop
    pf.close()
    assert a.settled and b.settled and c.settled
    assert (a.progress(), b.progress()) == (2, 2)
    assert c.status is PrefetchStatus.CANCELLED        # never looked up, or planned and never fetched
    assert pf.held_bytes == 0
