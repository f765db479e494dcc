"""The reliability floor (issue 11): each defect pinned by the scenario that exposed it.

Every test here failed on main at 2a780e8 (checked by running it there).
"""

from __future__ import annotations

import numpy as np
import pytest

from hicache.cache.residency import Load
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
    cache.ctl.set_fault_injector(faults)
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
    assert cache.ctl.stats()["pending_ops"] > 0          # it did not launch them either
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
    return sorted((n.node_id, n.on_device, n.on_host) for n in cache.tree.nodes())


@pytest.mark.parametrize("policy", ["write_through", "write_back"])
def test_an_allocation_larger_than_the_device_evicts_nothing(policy):
    eng = Engine(make_cache(mha_layout(), device_pages=8, write_policy=policy))
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


def test_an_allocation_blocked_by_pinned_pages_evicts_nothing():
    eng = Engine(make_cache(mha_layout(), device_pages=8, write_policy="write_through"))
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

