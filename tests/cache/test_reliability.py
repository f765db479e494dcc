"""The reliability floor (issue 11): each defect pinned by the scenario that exposed it.

Every test here failed on main at 2a780e8 (checked by running it there).
"""

from __future__ import annotations

import numpy as np
import pytest

from hicache.cache.tags import Load
from hicache.errors import MisuseError, TransferError
from hicache.transfer import TransferConfig
from tests.cache.conftest import Engine, make_cache, mha_layout, toks


class PageLoadFaults:
    """Fails every H2D copy that carries a page load (not a snapshot load) while on."""

    def __init__(self):
        self.on = False

    def __call__(self, fp):
        if self.on and fp.direction == "h2d" and any(isinstance(t, Load) and t.nodes for t in fp.tags):
            raise TransferError("injected")


def faulty(**kw):
    faults = PageLoadFaults()
    cache = make_cache(**kw)
    cache.set_fault_injector(faults)
    return cache, faults


def demote(eng, pages, snapshots=0):
    """A filler request takes every device page (and snapshot row), then goes away."""
    _, filler = eng.start(toks(50, extra=1))
    assert eng.cache.alloc_pages(filler, pages).ok
    eng.cache.drain()                            # write_back: the boundary snapshots' backups
    for _ in range(snapshots):
        assert eng.cache.alloc_snapshot(filler).ok
    eng.cache.release(filler)
    eng.cache.drain()


# -- 1. acks are never applied inside load() / alloc ------------------------------------
def test_a_load_failing_while_load_waits_for_queue_room_fails_the_lease():
    # max_queued_ops=1: the snapshot load waits for the page load to finish. That page
    # load fails; the lease must see it (its ids were freed), never report ok.
    cache, faults = faulty(device_pages=8, device_snaps=2, transfer=TransferConfig(max_queued_ops=1))
    eng = Engine(cache)
    a = toks(1, 2, 3, extra=1)
    eng.run(a)
    demote(eng, 8, snapshots=2)
    faults.on = True
    lease = cache.load(cache.match(a))
    assert lease.loaded_tokens == 12 and lease.snapshot_id is not None
    assert not lease.wait() and not lease.ok
    faults.on = False
    cache.poll()
    with pytest.raises(MisuseError, match="load failed"):
        cache.publish(lease, a, 3)
    cache.release(lease)
    cache.check_integrity()
    _, again = eng.start(a)                      # the host copy is intact: a retry loads it
    assert again.resume_tokens == 12 and again.ok
    cache.release(again)
    cache.check_integrity()
    cache.close()


def test_a_write_back_eviction_inside_load_does_not_apply_another_requests_failed_load():
    # L1 loads [1][2] and the snapshot at 2 (the page load fails); L2 resumes at [1] and
    # needs a device row for the snapshot at 1, whose eviction backs a snapshot up
    # synchronously. That backup must not apply L1's failed load under L2's feet.
    cache, faults = faulty(device_pages=8, device_snaps=2, host_snaps=8, write_policy="write_back")
    eng = Engine(cache)
    a = toks(1, 2, extra=1)
    eng.run(a, chunk_pages=1)                    # [1] with a snapshot, [2] with a snapshot
    demote(eng, 8, snapshots=2)
    eng.run(toks(7, extra=1))                    # a device-only snapshot: the next victim
    faults.on = True
    l1 = cache.load(cache.match(a), start=False)
    cache.step()
    assert not l1.wait()
    l2 = cache.load(cache.match(toks(1, extra=1)))
    assert l2.resume_tokens == 4
    assert not l2.wait() and not l2.ok           # it borrowed [1], whose load failed
    faults.on = False
    cache.poll()
    cache.check_integrity()
    cache.release(l1)
    cache.release(l2)
    cache.check_integrity()
    _, again = eng.start(toks(1, 2, extra=1))
    assert again.resume_tokens == 8
    cache.release(again)
    cache.check_integrity()
    cache.close()


# -- 12. Lease.wait() from a forward thread never drives the controller ----------------
def test_wait_from_another_thread_never_steps_the_controller():
    import threading

    eng = Engine(make_cache(device_pages=8))
    cache = eng.cache
    a = toks(1, 2, extra=1)
    eng.run(a)
    demote(eng, 8)
    lease = cache.load(cache.match(a), start=False)     # loads queued, not launched
    assert lease.loaded_tokens == 8
    seen = []

    def forward(layer):
        try:
            seen.append(lease.wait(layer=layer, timeout=10))
        except MisuseError as exc:
            seen.append(exc)

    t = threading.Thread(target=forward, args=(0,))
    t.start()
    t.join()
    assert isinstance(seen[0], MisuseError) and "cache.step()" in str(seen[0])
    assert cache.transfer_stats()["pending_ops"] > 0          # it did not launch them either
    cache.step()                                         # the engine thread launches
    threads = [threading.Thread(target=forward, args=(layer,)) for layer in (0, 1, 2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert seen[1:] == [True, True, True]
    assert lease.wait()
    cache.poll()
    cache.release(lease)
    cache.check_integrity()
    cache.close()


# -- 7. token ids outside int32 never alias ---------------------------------------------
@pytest.mark.parametrize("tokens", [
    np.array([1, 2, 2 ** 31 + 1, 4, 5], np.int64),     # would wrap to 1 - 2**31 ... and alias
    np.array([2 ** 32 + 1, 2, 3, 4, 5], np.uint64),    # wraps to 1
    [1, 2, 3, 4, -1],
    np.array([True, False, True, True, True]),
    [1.0, 2.0, 3.0, 4.0, 5.0],
])
def test_token_ids_outside_int32_are_refused(tokens):
    cache = make_cache(mha_layout())
    with pytest.raises(MisuseError, match="token"):
        cache.match(tokens)
    cache.close()


def test_wrapped_ids_cannot_reuse_another_prompts_pages():
    eng = Engine(make_cache(mha_layout()))
    a = toks(1, 2, extra=1)
    eng.run(a)
    alias = a.astype(np.int64)
    alias[0] += 2 ** 32                                # equal to a after an int32 cast
    with pytest.raises(MisuseError, match="outside"):
        eng.cache.match(alias)
    assert eng.cache.match(np.array(a, np.int64)).resume_tokens == 8   # in range: fine
    eng.cache.close()


# -- 6. an impossible allocation evicts nothing -----------------------------------------
def cached_pages(cache):
    return sorted((n.node_id, n.on_device, n.on_host) for n in cache._tree.nodes())


@pytest.mark.parametrize("budget", ["split", "shared"])
@pytest.mark.parametrize("policy", ["write_through", "write_back"])
def test_an_allocation_larger_than_the_device_evicts_nothing(policy, budget):
    eng = Engine(make_cache(mha_layout(), device_pages=8, write_policy=policy, budget=budget))
    cache = eng.cache
    for v in (1, 2, 3):
        eng.run(toks(v, v + 10, extra=1))
    before = cached_pages(cache)
    lease = cache.load(cache.match(toks(9, extra=1)))
    res = cache.alloc_pages(lease, 9)                       # capacity is 8: can never fit
    assert not res.ok and res.requested == 9
    assert cached_pages(cache) == before
    assert cache.counters.device_evicted_pages == cache.counters.device_demoted_pages == 0
    assert cache.alloc_pages(lease, 8).ok                   # what can fit still does
    cache.release(lease)
    cache.check_integrity()
    cache.close()


@pytest.mark.parametrize("budget", ["split", "shared"])
def test_an_allocation_blocked_by_pinned_pages_evicts_nothing(budget):
    eng = Engine(make_cache(mha_layout(), device_pages=8, write_policy="write_through", budget=budget))
    cache = eng.cache
    a = toks(1, 2, 3, 4, extra=1)
    eng.run(toks(5, 6, extra=1))
    _, holder = eng.start(a)                                  # nothing cached for a yet
    eng.publish(holder, a, 4)                                 # 4 pages, locked by holder
    before = cached_pages(cache)
    lease = cache.load(cache.match(toks(9, extra=1)))
    assert cache.pools.device.num_free("page") == 2
    assert not cache.alloc_pages(lease, 5).ok                 # 2 free + 2 evictable < 5
    assert cached_pages(cache) == before
    assert cache.alloc_pages(lease, 4).ok                     # 2 free + 2 evicted
    for lz in (lease, holder):
        cache.release(lz)
    cache.check_integrity()
    cache.close()



# -- 8. exclusive tier: a page loaded back during its L3 put leaves the host after it ----
@pytest.fixture
def gated_l3(monkeypatch):
    import hicache.cache.l3tier as l3mod
    from tests.storage.gated import GatedBackend

    made = {}
    real_open = l3mod.open_backend

    def open_gated(url):
        made["b"] = GatedBackend(real_open("memory://"), gate_ops=("put",))
        return made["b"]

    monkeypatch.setattr(l3mod, "open_backend", open_gated)
    return made


def test_exclusive_page_loaded_during_its_l3_put_leaves_the_host_when_the_put_ends(gated_l3):
    cache = make_cache(mha_layout(), device_pages=2, host_pages=8, write_policy="write_back",
                       host_tier="exclusive")
    eng = Engine(cache)
    a = toks(1, 2, extra=1)
    eng.run(a)
    gated_l3["b"].gate.clear()                      # hold L3 puts
    b = toks(3, 4, extra=1)
    _, lb = eng.start(b)
    eng.publish(lb, b, 2)                           # write_back: a's pages go to the host
    cache.release(lb)
    node = next(n for n in cache._tree.nodes() if n.hashes == eng.hashes(a)[:2])
    assert node.is_shadow and node.l3_put is not None
    _, la = eng.start(a)                            # loaded back while the put reads them
    cache.poll()
    assert node.on_device and node.on_host          # the put still reads the host rows
    cache.release(la)
    gated_l3["b"].gate.set()
    cache.drain()
    assert node.on_device and not node.on_host      # exclusive: one tier at a time
    assert cache.counters.host_released_pages == 2
    cache.check_integrity()
    cache.close()


# -- 3. a provisional snapshot whose owner moved on goes at its last unlock --------------
def test_an_orphaned_provisional_snapshot_is_dropped_at_its_last_unlock():
    eng = Engine(make_cache(retention=0))
    cache = eng.cache
    a = toks(1, 2, 3, extra=1)
    _, la = eng.start(a)
    assert eng.publish(la, a, 1).snapshot == "provisional"
    node = next(iter(cache._tree.nodes()))
    snap = node.snapshot
    _, lb = eng.start(toks(1, extra=1))               # a sibling resumes from it
    assert lb.resume_tokens == 4 and lb.snapshot_id == snap.device_id
    assert eng.publish(la, a, 2).snapshot == "provisional"    # the owner moves on
    assert node.snapshot is snap                       # still read by the sibling
    cache.check_integrity()
    cache.release(lb)                                  # its last unlock
    assert node.snapshot is None
    assert cache.counters.snapshots_dropped_retention == 1   # the orphan, counted
    cache.release(la)
    cache.check_integrity()
    assert cache.counters.snapshots_dropped_retention == 2   # la's own provisional at 2
    cache.close()


def test_an_orphan_offered_again_by_a_sibling_changes_owner():
    eng = Engine(make_cache(retention=0))
    cache = eng.cache
    a = toks(1, 2, 3, extra=1)
    _, la = eng.start(a)
    eng.publish(la, a, 1)
    snap = next(iter(cache._tree.nodes())).snapshot
    b = toks(1, 7, extra=1)
    _, lb = eng.start(b)
    eng.publish(la, a, 2)                              # orphaned: lb resumed from it
    eng.publish(lb, toks(1, extra=1), 1)               # lb offers the same boundary (prefill)
    assert snap.provisional_owner == lb.lease_id
    eng.publish(lb, b, 2)                              # lb moves on: it goes, counted
    cache.check_integrity()
    cache.release(lb)
    assert all(n.snapshot is not snap for n in cache._tree.nodes())
    cache.release(la)
    cache.check_integrity()
    cache.close()


def test_an_orphan_promoted_by_a_keeper_is_kept():
    eng = Engine(make_cache(retention=0))
    cache = eng.cache
    a = toks(1, 2, 3, extra=1)
    _, la = eng.start(a)
    eng.publish(la, a, 1)
    snap = next(iter(cache._tree.nodes())).snapshot
    _, lb = eng.start(toks(1, extra=1))
    eng.publish(la, a, 2)                              # orphaned
    from hicache.cache import Boundary
    eng.publish(lb, toks(1, extra=1), 1, why=Boundary.PROMPT_END)   # a keeper promotes it
    cache.release(lb)
    cache.release(la)
    assert any(n.snapshot is snap for n in cache._tree.nodes())
    cache.check_integrity()
    cache.close()


# -- 5. a corrupt L3 object is repaired, not a permanent wall ---------------------------
def test_a_corrupt_l3_object_is_rewritten_by_the_next_writer():
    url = "memory://reliability-repair"
    a = toks(1, 2, 3, 4, extra=1)

    def fresh():
        return Engine(make_cache(mha_layout(), storage=url, write_policy="write_through"))

    first = fresh()
    first.run(a)
    store = first.cache._l3.store
    key = store.key(first.hashes(a)[1], "page")
    buf = bytearray(1 << 16)
    n = store.backend.get_into([key], [buf])[0]
    bad = bytearray(buf[:n])
    bad[-1] ^= 0xFF
    store.backend.put([key], [bytes(bad)])                   # page 1's object goes bad

    def l3_pages(eng):
        pf = eng.cache.prefetch(eng.cache.match(a))
        return eng.cache.finish_prefetch(pf) // 4

    second = fresh()
    assert l3_pages(second) == 1                             # the chain stops at the bad object
    second.run(a)                                            # recomputes and backs up pages 1-3
    second.cache.close()
    third = fresh()
    assert l3_pages(third) == 4                              # repaired: the whole chain again
    third.run(a)
    third.cache.close()
    first.cache.close()                                      # the last open of the named store


# -- 4. a refused or failed L3 put is retried ---------------------------------------------
class FlakyPuts:
    """Wraps a backend: while ``down`` its puts fail with a connection error, and with
    ``outage`` every data call does (a dead server, which trips the breaker)."""

    def __init__(self, inner):
        from tests.storage.gated import ForwardingBackend

        from hicache.storage.faults import StorageConnectionError

        class Flaky(ForwardingBackend):
            down = True
            outage = False

            def _before(self, op, n):
                if self.down and (op == "put" or self.outage):
                    raise StorageConnectionError("injected: connection refused")

        self.backend = Flaky(inner)


@pytest.fixture
def flaky_l3(monkeypatch):
    import hicache.cache.l3tier as l3mod

    real_open = l3mod.open_backend
    made = {}

    def open_flaky(url):
        made["b"] = FlakyPuts(real_open(url)).backend
        return made["b"]

    monkeypatch.setattr(l3mod, "open_backend", open_flaky)
    return made


def test_a_failed_l3_put_is_retried_once_the_store_is_back(flaky_l3):
    class Clock:
        t = 0.0

        def __call__(self):
            return self.t

    url = "memory://reliability-retry"
    eng = Engine(make_cache(mha_layout(), storage=url, write_policy="write_through"))
    cache = eng.cache
    clock = Clock()
    cache._l3.store.breaker._clock = clock
    flaky_l3["b"].outage = True
    a, b = toks(1, 2, extra=1), toks(3, 4, 5, extra=1)
    eng.run(a)
    eng.run(b)                                         # every put fails: the breaker opens
    assert cache._l3.store.breaker.state == "open" and cache.counters.l3_put_objects == 0
    for _ in range(3):
        cache.poll()                                   # open: nothing is retried
    assert cache.counters.l3_put_retries == 0
    flaky_l3["b"].down = False                         # the store is back ...
    clock.t += 60                                      # ... and the cooldown has passed
    for _ in range(10):
        cache.poll()
        cache._l3.store.flush(10)
    assert cache._l3.store.breaker.state == "closed"
    assert cache.counters.l3_put_retries == 5 and cache.counters.l3_put_objects == 5
    assert all(cache._l3.store.exists(eng.hashes(a)[:2] + eng.hashes(b)[:3], "page"))
    cache.check_integrity()
    cache.close()


def test_a_put_the_store_keeps_refusing_is_abandoned(flaky_l3):
    eng = Engine(make_cache(mha_layout(), write_policy="write_through"))
    cache = eng.cache
    cache._l3.store.breaker.threshold = 1000               # refusals, not an outage: stays closed
    eng.run(toks(1, extra=1))
    for _ in range(10):
        cache.poll()
        cache._l3.store.flush(10)
    assert cache.counters.l3_put_retries == 3 and cache.counters.l3_put_abandoned == 1
    assert not cache._l3._unstored
    cache.check_integrity()
    cache.close()


# -- 2. an open prefetch keeps its prefix in the tree without holding device pages -------
def test_an_open_prefetch_pins_its_prefix_against_removal_not_against_demotion():
    eng = Engine(make_cache(mha_layout(), device_pages=4, host_pages=4, write_policy="write_through",
                            prefetch_policy="best_effort"))
    cache = eng.cache
    a = toks(1, 2, extra=1)
    eng.run(a)                                              # [1,2] on device and host
    node = next(iter(cache._tree.nodes()))
    pf = cache.prefetch(cache.match(toks(1, 2, 3, extra=1)))   # extends [1,2] from L3
    assert pf is not None and node.lock_device == 0
    _, other = eng.start(toks(7, extra=1))
    assert cache.alloc_pages(other, 4).ok                   # the device needs every page:
    assert node.is_shadow                                   # the prefix was demoted, ...
    cache.publish(other, toks(7, 8, 9, 6, extra=1), 4)
    cache.drain()                                           # ... and the host fills up with [7..6]
    assert node.parent is cache._tree.root and node.is_shadow   # but the pinned prefix stays
    cache.check_integrity()
    cache.release(other)
    cache.finish_prefetch(pf)
    cache.check_integrity()
    cache.close()


def test_l3_errors_counts_each_fault_once(flaky_l3):
    eng = Engine(make_cache(mha_layout(), write_policy="write_through"))
    cache = eng.cache
    flaky_l3["b"].outage = True
    eng.run(toks(1, extra=1))
    faults = cache.l3_stats()["faults"]
    by_type = sum(v for k, v in faults.items() if "." not in k)
    assert by_type > 0 and cache.stats()["l3_errors"] == by_type
    cache.close()
