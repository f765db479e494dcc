"""The virtual clock: its cost model, and the engine's times (TTFT, queueing, L3 landing)."""

from __future__ import annotations

import numpy as np
import pytest

from hicache.engine.clock import ClockConfig, clock_from_mapping
from hicache.engine.loop import EngineConfig, ReferenceEngine
from hicache.engine.workloads import Request, synthetic
from hicache.errors import ConfigError
from tests.cache.conftest import make_cache, mha_layout
from tests.engine.test_loop import run as run_engine

P = 4


def test_cost_model():
    c = ClockConfig(prefill_tokens_per_s=1000, decode_step_s=0.01, h2d_gbps=1, d2h_gbps=2, l3_gbps=1, l3_rtt_s=0.001)
    assert c.step_s(500, 3, h2d_bytes=10**9, blocking_d2h_bytes=10**9) == pytest.approx(0.5 + 0.03 + 1 + 0.5)
    assert c.fetch_s(10**6) == pytest.approx(0.002 + 0.001)
    # stateless: pages land one by one after the two round trips
    assert [c.landed_pages(t, 10, 10**5, 0) for t in (0.0, 0.002, 0.00211, 0.0025, 1.0)] == [0, 0, 1, 5, 10]
    # with a snapshot (read first): all or nothing
    assert c.landed_pages(0.0029, 2, 10**5, 8 * 10**5) == 0
    assert c.landed_pages(0.003, 2, 10**5, 8 * 10**5) == 2


def test_config_section_and_flags():
    c = clock_from_mapping({"decode_step_s": 0.05}, prefill_tokens_per_s=5000.0, l3_gbps=None)
    assert (c.decode_step_s, c.prefill_tokens_per_s, c.l3_gbps) == (0.05, 5000.0, ClockConfig().l3_gbps)
    with pytest.raises(ConfigError, match="engine.decode_step"):
        clock_from_mapping({"decode_step": 1})
    with pytest.raises(ConfigError, match="engine.h2d_gbps"):
        clock_from_mapping({"h2d_gbps": 0})
    assert clock_from_mapping(None, l3_rtt_s=0.0).l3_rtt_s == 0.0


def req(rid, prompt, output, t=0.0, conv=None):
    return Request(rid, conv or f"c{rid}", 0, t, np.asarray(prompt, np.int32), np.asarray(output, np.int32))


CLOCK = ClockConfig(prefill_tokens_per_s=100.0, decode_step_s=0.01)


def run(cache, reqs, **kw):
    kw.setdefault("clock", CLOCK)
    return run_engine(cache, reqs, **kw)


def test_one_request_ttft_is_its_prefill_and_decode_follows():
    cache = make_cache(mha_layout(), device_pages=32, host_pages=8)
    rep = run(cache, [req(0, range(10, 30), range(50, 58), t=2.0)], chunk_tokens=8, decode_stride=4)
    (r,) = rep.records
    assert (r.ready_s, r.queue_s) == (2.0, 0.0)
    assert r.ttft_s == pytest.approx(20 / 100.0)          # three chunks (8, 8, 4 tokens)
    assert r.ttft_uncached_s == pytest.approx(r.ttft_s)   # nothing to reuse
    assert r.finish_s == pytest.approx(2.0 + 0.2 + 8 * 0.01)
    assert rep.virtual_s == pytest.approx(r.finish_s)


def test_without_reuse_the_cached_and_uncached_clocks_agree():
    rng = np.random.default_rng(5)
    reqs = [req(i, rng.integers(100, 10**6, int(rng.integers(5, 40))), rng.integers(100, 10**6, 6), t=i * 0.05)
            for i in range(12)]
    rep = run(make_cache(mha_layout(), device_pages=40, host_pages=16), reqs, max_running=3, chunk_tokens=8,
              step_tokens=16, decode_stride=4)
    assert sum(r.hit_tokens for r in rep.records) == 0
    for r in rep.records:
        assert r.ttft_s == pytest.approx(r.ttft_uncached_s), r
        assert 0 <= r.queue_s <= r.ttft_s


def test_an_arrival_is_admitted_when_it_arrives_not_after_a_long_stride():
    reqs = [req(0, range(10, 14), range(100, 300)), req(1, range(20, 24), range(300, 310), t=0.5)]
    rep = run(make_cache(mha_layout(), device_pages=80, host_pages=8), reqs, max_running=2, decode_stride=64)
    second = rep.records[1]
    assert second.queue_s <= CLOCK.decode_step_s + 1e-9
    # its prefill runs with one decode iteration of the first request (a chunked-prefill batch)
    assert second.ttft_s == pytest.approx(second.queue_s + 4 / 100.0 + CLOCK.decode_step_s)


def test_best_effort_l3_hits_only_what_lands_while_queued():
    # A first cache fills a shared in-process L3; fresh caches replay the same requests.
    reqs = synthetic(6, 2, system_prompts=1, system_len=40, user_len=(4, 12), output_len=(4, 8), turns=(1, 1),
                     vocab_size=500, arrival_rate=None)

    def cache(policy="best_effort"):
        return make_cache(mha_layout(), device_pages=40, host_pages=40, storage="memory://clock-test",
                          prefetch_policy=policy, write_policy="write_through")

    def replay(l3_gbps, policy="best_effort"):
        clock = ClockConfig(prefill_tokens_per_s=100.0, decode_step_s=0.01, l3_gbps=l3_gbps)
        return run(cache(policy), reqs, max_running=1, clock=clock, verify="full").records

    owner = cache()   # keeps the named in-process store open
    first = ReferenceEngine(owner, EngineConfig(max_running=1)).run(reqs)
    owner.drain()
    assert sum(r.l3_hit_tokens for r in first.records) == 0 and owner.stats()["l3_put_objects"] > 0
    slow = replay(1e-9)                      # nothing lands in time: read nothing, hit nothing
    assert sum(r.l3_planned_pages for r in slow) > 0
    assert sum(r.l3_landed_pages for r in slow) == sum(r.l3_hit_tokens for r in slow) == 0
    fast = replay(1.0)                       # queued behind one another: lands while waiting
    assert fast[0].queue_s == 0 and fast[0].l3_planned_pages > 0 and fast[0].l3_hit_tokens == 0
    for r in fast[1:]:
        assert r.queue_s > 0 and r.l3_landed_pages == r.l3_planned_pages > 0
        assert r.l3_hit_tokens == r.l3_landed_pages * P
    waited = replay(1e-6, policy="wait_complete")   # waits until its whole fetch landed
    r = waited[0]
    assert r.l3_landed_pages == r.l3_planned_pages == 13
    assert r.hit_tokens == 52 and r.l3_hit_tokens > 0   # the rest: pages another request published meanwhile
    assert r.queue_s == pytest.approx(ClockConfig(l3_gbps=1e-6).fetch_s(13 * 4 * 16), rel=1e-6)
    owner.close()


def test_a_held_turn_keeps_its_place_in_arrival_order():
    # Turn 1 of conversation a arrives while turn 0 still runs; b0..b2 arrive after it.
    a0 = Request(0, "a", 0, 0.0, np.arange(10, 30, dtype=np.int32), np.arange(60, 100, dtype=np.int32))
    a1 = Request(1, "a", 1, 0.1, np.concatenate([a0.prompt, a0.output, np.arange(200, 210, dtype=np.int32)]),
                 np.arange(300, 304, dtype=np.int32))
    bs = [req(2 + i, range(400 + 50 * i, 420 + 50 * i), range(900, 904), t=0.2 + 0.01 * i, conv=f"b{i}")
          for i in range(3)]
    rep = run(make_cache(mha_layout(), device_pages=60, host_pages=8), [a0, a1, *bs], max_running=1)
    order = sorted(rep.records, key=lambda r: r.finish_s)
    assert [r.request_id for r in order] == [0, 1, 2, 3, 4]
    r1 = rep.records[1]
    assert r1.ready_s == pytest.approx(rep.records[0].finish_s)   # ready when its previous turn finished
    assert r1.queue_s == pytest.approx(0.0) and r1.hit_tokens == 60   # a0's prompt + output
