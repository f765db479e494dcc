"""Bugs found in review, each pinned by the scenario that exposed it."""

from __future__ import annotations

import pytest

from hicache.errors import MisuseError, TransferError
from tests.cache.conftest import Engine, make_cache, mha_layout, toks


class Faults:
    """A switchable transfer fault injector (raises on H2D copies while on)."""

    def __init__(self):
        self.on = False
        self.only = None

    def __call__(self, fp):
        if self.on and fp.direction == "h2d" and (self.only is None or any(t in self.only for t in fp.tags)):
            raise TransferError("injected")


def faulty_cache(**kw):
    faults = Faults()
    cache = make_cache(**kw)
    cache.ctl._exec.fault_injector = faults
    return cache, faults


def demote_all(eng, pages):
    _, filler = eng.start(toks(50, extra=1))
    assert eng.cache.alloc_pages(filler, pages).ok
    eng.cache.release(filler)
    eng.cache.drain()


def test_failed_load_of_a_chain_of_shadows_is_rolled_back():
    cache, faults = faulty_cache(device_pages=8)
    eng = Engine(cache)
    a = toks(1, 2, 3, extra=1)
    eng.run(a, chunk_pages=1)              # three nodes, each backed up
    demote_all(eng, 8)
    faults.on = True
    lease = cache.load(cache.match(a))
    assert lease.loaded_tokens == 12 and not lease.wait() and not lease.ok
    faults.on = False
    cache.poll()
    with pytest.raises(MisuseError, match="load failed"):
        cache.publish(lease, a, 3)
    cache.release(lease)
    cache.check_integrity()
    assert cache.counters.load_failures == 1
    assert all(n.is_shadow for n in cache.tree.nodes())   # back to host-only, still usable
    _, lease = eng.start(a)                                 # a retry loads and verifies
    assert lease.resume_tokens == 12
    cache.release(lease)
    cache.close()


def test_no_load_below_a_node_that_is_still_loading():
    from hicache.cache.residency import Load

    cache, faults = faulty_cache(device_pages=8)
    eng = Engine(cache)
    eng.run(toks(1, 2, extra=1), chunk_pages=1)
    demote_all(eng, 8)
    l1 = cache.load(cache.match(toks(1, extra=1)), start=False)
    faults.only = [t for t in cache._inflight.values() if isinstance(t, Load)]
    faults.on = True
    cache.step()
    l2 = cache.load(cache.match(toks(1, 2, extra=1)))   # would load [2] below the loading [1]
    assert l2.loaded_tokens == 0
    l1.wait()
    l2.wait()
    cache.poll()
    cache.check_integrity()
    cache.release(l1)
    cache.release(l2)
    cache.check_integrity()
    cache.close()


def test_publish_below_the_resume_point_is_refused():
    eng = Engine(make_cache(device_pages=6))
    a = toks(1, 2, 3, extra=1)
    eng.run(a)
    _, lease = eng.start(a)
    assert lease.published_pages == 3
    with pytest.raises(MisuseError, match="publish of 0 pages"):
        eng.cache.publish(lease, a, 0)
    eng.cache.release(lease)
    eng.cache.close()


def test_republishing_other_tokens_is_refused():
    eng = Engine(make_cache(write_policy="write_back"))
    a = toks(1, 2, 3, extra=1)
    _, lease = eng.start(a)
    eng.publish(lease, a, 2)
    eng.cache.alloc_pages(lease, 1)
    with pytest.raises(MisuseError, match="differ"):
        eng.cache.publish(lease, toks(1, 7, 3, extra=1), 3)
    eng.cache.release(lease)
    eng.cache.check_integrity()
    eng.cache.close()


def test_a_split_during_a_backup_still_puts_both_halves_to_l3():
    eng = Engine(make_cache(write_policy="write_through"))
    a, b = toks(1, 2, 3, extra=1), toks(1, 2, 9, extra=1)
    _, la = eng.start(a)
    eng.publish(la, a, 3)                 # backup of [1,2,3] queued
    _, lb = eng.start(b)
    eng.publish(lb, b, 3)                 # splits it before the ack
    eng.cache.release(la)
    eng.cache.release(lb)
    eng.cache.drain()
    eng.cache.check_integrity()
    assert all(eng.cache.store.exists(eng.hashes(a)[:3], "page"))
    eng.cache.close()


def test_write_back_evicts_a_whole_chain_when_needed():
    eng = Engine(make_cache(mha_layout(), device_pages=4, host_pages=16, write_policy="write_back"))
    eng.run(toks(1, 2, 3, 4), chunk_pages=1)
    lease = eng.cache.load(eng.cache.match(toks(9, extra=1)))
    assert eng.cache.alloc_pages(lease, 4).ok
    eng.cache.release(lease)
    eng.cache.check_integrity()
    eng.cache.close()


def test_cancelled_prefetches_return_their_memory_budget():
    eng = Engine(make_cache(device_pages=4, host_pages=10, host_snaps=4))
    t = toks(1, 2, 3, extra=1)
    eng.run(t)
    for v in (10, 20, 30, 40):
        eng.run(toks(v, v + 1, v + 2, extra=1))
    for _ in range(10):                   # an engine that gives up on the request
        pf = eng.cache.prefetch(eng.cache.match(t))
        pf.op.wait_planned(2)
        eng.cache.cancel_prefetch(pf)
    assert eng.cache.prefetcher.held_bytes == 0
    assert eng.cache.finish_prefetch(eng.cache.prefetch(eng.cache.match(t))) == 12
    eng.cache.check_integrity()
    eng.cache.close()
