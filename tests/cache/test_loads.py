"""The load path (``cache/loads.py``): a staged swap on an exclusive host tier."""

from __future__ import annotations

import pytest

from tests.cache.conftest import Engine, make_cache, node_of, toks

A, B = toks(1, 2, 3, 4, 5, 6, extra=1), toks(7, 8, 9, 10, 11, 12, extra=1)


def swap_setup(host_pages):
    """A (six pages, three nodes) on the host only, B (the same) on the device: device 8
    pages, so loading A displaces four of B's pages, and the host holds A with
    ``host_pages - 6`` rows free."""
    eng = Engine(make_cache(device_pages=8, host_pages=host_pages, device_snaps=8, host_snaps=8,
                            write_policy="write_back", host_tier="exclusive", eviction="value"))
    eng.run(A, chunk_pages=2)
    _, filler = eng.start(toks(50, extra=1))
    assert eng.cache.alloc_pages(filler, 8).ok     # every device page of A goes to the host
    eng.cache.release(filler)
    eng.run(B, chunk_pages=2)
    m = eng.cache.match(A)
    assert (m.resume_tokens, m.device_tokens, m.host_tokens) == (24, 0, 24)
    assert eng.cache.match(B).device_tokens == 24
    return eng


def read_back(eng, tokens):
    """Start a request on ``tokens`` (every borrowed byte verified), release it, check the
    cache; the lease."""
    _, lease = eng.start(tokens)
    eng.cache.release(lease)
    eng.cache.check_integrity()
    return lease


@pytest.mark.parametrize("host_pages", [8, 9])
def test_a_load_bigger_than_the_free_host_room_swaps_in_stages_and_keeps_the_displaced_chain(host_pages):
    eng = swap_setup(host_pages)
    cache = eng.cache
    _, lease = eng.start(A)                        # verifies A's loaded bytes
    assert lease.resume_tokens == 24 and lease.loaded_tokens == 24
    cache.release(lease)
    cache.drain()
    m = cache.match(B)                             # B's four displaced pages were demoted, none dropped
    assert m.resume_tokens == 24 and m.device_tokens + m.host_tokens == 24 and m.host_tokens == 16
    assert cache.counters.device_evicted_pages == 0
    read_back(eng, B)                              # and read back exactly
    cache.close()


def test_a_failed_stage_falls_back_and_loses_no_host_copy():
    from tests.cache.test_regressions import Faults

    eng = swap_setup(8)
    cache = eng.cache
    faults = Faults()
    cache.set_fault_injector(faults)
    faults.on = True                               # the first stage's H2D copy fails
    m = cache.match(A)
    lease = cache.load(m)
    assert lease.resume_tokens == 0 and lease.loaded_tokens == 0   # fell back: nothing of A on the device
    cache.release(lease)
    faults.on = False
    cache.drain()
    cache.check_integrity()
    assert cache.match(A).host_tokens == 24 and cache.counters.load_failures == 1
    assert read_back(eng, A).loaded_tokens == 24   # the host copy is intact: the swap now succeeds
    cache.close()


def test_a_swap_that_cannot_land_whole_keeps_its_stages_and_counts_what_it_resumes_on():
    eng = swap_setup(8)
    cache = eng.cache
    _, holder = eng.start(toks(7, 8, 9, 10, extra=1))     # pins four of B's device pages
    host_hits = cache.counters.host_hit_tokens
    lease = cache.load(cache.match(A))                     # six pages, at most four evictable
    assert cache.counters.load_fallbacks == 1
    # two stages of two pages landed; their intermediate snapshots stayed on the device
    # (value does not demote them), so the lease resumes at the second one, and those four
    # pages count as loaded from the host
    assert node_of(cache, A[:8]).on_device and node_of(cache, A[:16]).on_device
    assert not node_of(cache, A[:24]).on_device
    assert lease.resume_tokens == lease.loaded_tokens == cache.counters.host_hit_tokens - host_hits == 16
    cache.release(lease)
    cache.release(holder)
    cache.check_integrity()
    read_back(eng, A)                                      # every byte of A still reads back
    cache.close()
