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
    cache.set_fault_injector(faults)
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
    assert all(n.is_shadow for n in cache._tree.nodes())   # back to host-only, still usable
    _, lease = eng.start(a)                                 # a retry loads and verifies
    assert lease.resume_tokens == 12
    cache.release(lease)
    cache.close()


def test_no_load_below_a_node_that_is_still_loading():
    from hicache.cache.tags import Load

    cache, faults = faulty_cache(device_pages=8)
    eng = Engine(cache)
    eng.run(toks(1, 2, extra=1), chunk_pages=1)
    demote_all(eng, 8)
    l1 = cache.load(cache.match(toks(1, extra=1)), start=False)
    faults.only = [t for t in cache._copies.tags() if isinstance(t, Load)]
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
    assert all(eng.cache._l3.store.exists(eng.hashes(a)[:3], "page"))
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
    assert eng.cache._l3.prefetcher.held_bytes == 0
    assert eng.cache.finish_prefetch(eng.cache.prefetch(eng.cache.match(t))) == 12
    eng.cache.check_integrity()
    eng.cache.close()


# -- second session's review: the exclusive host tier and deferred headers -----------------
def _small_queue_cache(q, **kw):
    from hicache.cache import HiCache
    from hicache.transfer import TransferConfig
    from tests.cache.conftest import hybrid_layout

    cfg = make_cache(**kw)
    config = cfg.config
    cfg.close()
    return HiCache(hybrid_layout(), config, transfer=TransferConfig(max_queued_ops=q))


def test_exclusive_load_under_backpressure_keeps_the_snapshot_row_it_reads():
    # A drain inside load() acked the page load first; its release freed the host row of
    # the snapshot whose load was about to be submitted ("host state id N is not allocated").
    from hicache.engine.stress import StressConfig, StressRunner

    cache = _small_queue_cache(2, device_pages=16, device_snaps=3, host_pages=24, host_snaps=2,
                               write_policy="write_back", host_tier="exclusive", retention=0)
    try:
        rep = StressRunner(cache, StressConfig(ops=300, seed=820483, max_running=3, prefetch=0.0)).run()
    finally:
        cache.close()
    assert rep.integrity_errors == 0 and rep.mismatched_pages == 0 and rep.mismatched_snapshots == 0


def test_exclusive_eviction_keeps_the_backup_it_just_made_under_backpressure():
    # A drain during eviction finished the L3 put of a node just backed up and released its
    # host copy before it was demoted: the node was dropped, or stuck on the device.
    cache = _small_queue_cache(1, device_pages=4, device_snaps=8, host_pages=16, host_snaps=8,
                               write_policy="write_back", host_tier="exclusive", retention=0)
    eng = Engine(cache)
    eng.run(toks(1, 2))
    eng.run(toks(3, 4))
    lease = cache.load(cache.match(toks(5, 6, 7, 8)))
    assert lease.wait()
    assert cache.alloc_pages(lease, 4).ok
    assert cache.counters.host_released_pages == 0 and cache.counters.device_evicted_pages == 0
    assert cache.counters.device_demoted_pages == 4
    cache.release(lease)
    cache.drain()
    cache.check_integrity()
    cache.close()


def test_exclusive_snapshot_loaded_during_its_l3_put_leaves_the_host_when_the_put_ends(monkeypatch):
    import hicache.cache.l3tier as l3mod
    from tests.storage.gated import GatedBackend

    made = {}
    real_open = l3mod.open_backend

    def open_gated(url):
        made["b"] = GatedBackend(real_open("memory://"), gate_ops=("put",))
        return made["b"]

    monkeypatch.setattr(l3mod, "open_backend", open_gated)
    cache = make_cache(device_pages=16, device_snaps=1, host_pages=32, host_snaps=8,
                       write_policy="write_back", host_tier="exclusive", retention=0)
    eng = Engine(cache)
    a = toks(1, 2)
    eng.run(a)
    made["b"].gate.clear()                          # hold L3 puts
    _, lb = eng.start(toks(3, 4))
    eng.publish(lb, toks(3, 4), 2)                  # the one device state row: A's snapshot goes to host
    cache.release(lb)
    cache.poll()
    _, la = eng.start(toks(1, 2, extra=1))          # resumes from it: loaded while its put is held
    cache.poll()
    snap = next(n for n in cache._tree.nodes() if n.hashes == eng.hashes(a)).snapshot
    assert snap.device_id is not None and snap.host_id is not None and snap.put_pending
    cache.release(la)
    made["b"].gate.set()
    cache.drain()
    assert snap.host_id is None and cache.counters.snapshots_released_host == 1
    cache.check_integrity()
    cache.close()


def test_a_backend_written_to_the_plain_contract_gets_plain_buffers():
    from hicache.storage import L3Store, open_backend
    from tests.storage.gated import ForwardingBackend

    class PlainBackend(ForwardingBackend):
        """Written to the plain contract: joins each value's pieces as buffers."""

        def put(self, keys, values):
            return self.inner.put(keys, [b"".join(memoryview(p) for p in v) for v in values])

    store = L3Store(PlainBackend(open_backend("memory://")), "a" * 16, "")
    assert store.put([b"\x01" * 32], "page", [bytearray(b"x" * 64)]) == [True]
    dst = bytearray(64)
    assert store.get([b"\x01" * 32], "page", [dst]).hits == 1 and dst == bytearray(b"x" * 64)
    store.close()
