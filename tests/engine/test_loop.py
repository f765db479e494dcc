"""The reference engine: every tier serves hits, bytes verify, turns keep their order."""

from __future__ import annotations

import numpy as np
import pytest

from hicache.engine.loop import EngineConfig, ReferenceEngine
from hicache.errors import ConfigError
from hicache.engine.workloads import synthetic
from tests.cache.conftest import make_cache


def small_chat(n=12, seed=0):
    return synthetic(conversations=n, seed=seed, system_prompts=2, system_len=40, user_len=(4, 20),
                     output_len=(4, 20), turns=(2, 4), vocab_size=1000)


def run(cache, reqs, **kw):
    try:
        rep = ReferenceEngine(cache, EngineConfig(**kw)).run(reqs)
        cache.check_integrity()
        return rep
    finally:
        cache.close()


def test_replay_hits_every_tier_and_verifies_every_page():
    reqs = small_chat()
    cache = make_cache(device_pages=60, host_pages=80, device_snaps=8, host_snaps=16, retention=0)
    rep = run(cache, reqs, max_running=2, chunk_tokens=8, step_tokens=32, decode_stride=8)
    assert len(rep.records) == len(reqs) and rep.mismatched_pages == 0 and rep.verified_pages > 0
    tiers = {k: sum(getattr(r, k) for r in rep.records)
             for k in ("device_hit_tokens", "host_hit_tokens", "l3_hit_tokens")}
    assert all(v > 0 for v in tiers.values()), tiers
    for r in rep.records:
        assert r.hit_tokens == r.device_hit_tokens + r.host_hit_tokens + r.l3_hit_tokens
        assert r.hit_tokens + r.recomputed_tokens == r.prompt_tokens


def test_next_turn_waits_for_the_previous_one():
    reqs = small_chat(n=3)
    cache = make_cache(device_pages=64, host_pages=64)
    rep = run(cache, reqs, max_running=8)
    by_conv = {}
    for req, rec in zip(sorted(reqs, key=lambda r: r.request_id), rep.records):
        by_conv.setdefault(req.conversation_id, []).append((req.turn, rec))
    for turns in by_conv.values():
        turns.sort(key=lambda t: t[0])
        steps = [rec.finish_step for _, rec in turns]
        assert steps == sorted(steps)
        # turn k+1 resumes at least at turn k's whole prompt (its prefix was published)
        for (_, a), (_, b) in zip(turns, turns[1:]):
            assert b.hit_tokens >= a.prompt_tokens // 4 * 4 - 4


def test_requests_larger_than_the_device_are_rejected_not_looped():
    reqs = small_chat(n=4)
    cache = make_cache(device_pages=8, host_pages=8, device_snaps=2, host_snaps=2)
    rep = run(cache, reqs, max_running=2)
    too_big = [r for r in reqs if -(-(len(r.prompt) + len(r.output)) // 4) > 8]
    assert rep.rejected == len(too_big) > 0
    assert sum(r.rejected for r in rep.records) == rep.rejected
    assert rep.mismatched_pages == 0


def test_preemption_under_device_pressure():
    reqs = synthetic(conversations=8, seed=3, system_prompts=2, system_len=40, user_len=(4, 20),
                     output_len=(4, 20), turns=(2, 4), vocab_size=1000, arrival_rate=None)  # all at once
    cache = make_cache(device_pages=30, host_pages=30, device_snaps=4, host_snaps=4)
    rep = run(cache, reqs, max_running=8, chunk_tokens=4, step_tokens=16, admission="greedy")
    assert rep.preemptions > 0 and rep.mismatched_pages == 0
    assert len(rep.records) == len(reqs)
    assert np.all([r.hit_tokens <= r.prompt_tokens for r in rep.records])


def test_reserve_admission_runs_the_same_pressure_without_preemption():
    reqs = synthetic(conversations=8, seed=3, system_prompts=2, system_len=40, user_len=(4, 20),
                     output_len=(4, 20), turns=(2, 4), vocab_size=1000, arrival_rate=None)
    cache = make_cache(device_pages=30, host_pages=30, device_snaps=4, host_snaps=4)
    rep = run(cache, reqs, max_running=8, chunk_tokens=4, step_tokens=16)  # admission="reserve"
    assert rep.preemptions == 0 and rep.mismatched_pages == 0 and rep.verified_pages > 0
    assert len(rep.records) == len(reqs)
    too_big = {q.request_id for q in reqs if -(-(len(q.prompt) + len(q.output)) // 4) > 30}
    assert {r.request_id for r in rep.records if r.rejected} == too_big
    for r in rep.records:  # hits are what the cache offered at arrival
        assert r.hit_tokens + r.recomputed_tokens == r.prompt_tokens
        assert r.readmission_recomputed_tokens == 0


def test_reserve_admission_in_a_shared_arena_counts_pinned_snapshots():
    """A shared arena holds pages and snapshots in one budget: admission that counted the
    whole arena as pages let in more requests than their pages plus pinned snapshots fit,
    and they preempted each other. Counting each request's snapshots, none is preempted."""
    from hicache.engine.loop import SNAPSHOTS_PER_REQUEST, snapshot_overhead_pages

    reqs = synthetic(conversations=8, seed=3, system_prompts=2, system_len=40, user_len=(4, 20),
                     output_len=(4, 20), turns=(2, 4), vocab_size=1000, arrival_rate=None)
    cache = make_cache(device_pages=48, host_pages=30, device_snaps=4, host_snaps=4, budget="shared",
                       write_policy="write_back", host_tier="exclusive")   # counting only pages: 1 preemption
    page, state = cache.layout.object_bytes("page"), cache.layout.object_bytes("state")
    overhead = snapshot_overhead_pages(cache)
    assert overhead == -(-SNAPSHOTS_PER_REQUEST * state // page) > 0
    assert snapshot_overhead_pages(make_cache(device_pages=30, device_snaps=4)) == 0   # split: own rows
    rep = run(cache, reqs, max_running=8, chunk_tokens=4, step_tokens=16)  # admission="reserve"
    assert rep.preemptions == 0 and rep.mismatched_pages == 0 and rep.verified_pages > 0
    assert len(rep.records) == len(reqs)
    assert rep.rejected == 0
    for r in rep.records:
        assert r.readmission_recomputed_tokens == 0 and r.hit_tokens + r.recomputed_tokens == r.prompt_tokens


def test_greedy_admission_counts_hits_at_first_admission_only():
    reqs = synthetic(conversations=8, seed=3, system_prompts=2, system_len=40, user_len=(4, 20),
                     output_len=(4, 20), turns=(2, 4), vocab_size=1000, arrival_rate=None)
    cache = make_cache(device_pages=30, host_pages=30, device_snaps=4, host_snaps=4)
    rep = run(cache, reqs, max_running=8, chunk_tokens=4, step_tokens=16, admission="greedy")
    preempted = [r for r in rep.records if r.preemptions]
    assert preempted and sum(r.readmission_recomputed_tokens for r in preempted) > 0
    for r in rep.records:
        assert r.hit_tokens + r.recomputed_tokens == r.prompt_tokens


def test_unknown_admission_policy_is_a_config_error():
    import pytest

    from hicache.errors import ConfigError

    with pytest.raises(ConfigError, match="admission"):
        EngineConfig(admission="fifo")


def test_a_request_leaving_a_cached_path_leaves_a_resume_point_at_the_fork():
    # A is cached with one snapshot, at its end; B shares A's first 3 pages (12 tokens of
    # 4-token pages) and goes on elsewhere. B's first chunk ends at the fork, so C, a third
    # prompt with the same first 3 pages, resumes there instead of at 0.
    from hicache.engine.workloads.request import Request

    shared = np.arange(12, dtype=np.int32) + 1
    a = np.concatenate([shared, np.arange(20, dtype=np.int32) + 100])
    b = np.concatenate([shared, np.arange(20, dtype=np.int32) + 200])
    c = np.concatenate([shared, np.arange(20, dtype=np.int32) + 300])
    out = np.arange(3, dtype=np.int32) + 900
    reqs = [Request(i, f"c{i}", 0, float(i), p, out) for i, p in enumerate((a, b, c))]
    cache = make_cache(device_pages=40, device_snaps=8, retention=4096, eviction="value")
    rep = run(cache, reqs, max_running=1, chunk_tokens=64)
    assert [r.hit_tokens for r in rep.records] == [0, 0, 12]
    assert rep.mismatched_pages == 0


@pytest.mark.parametrize("landing, waits", [("step", True), ("wallclock", False)])
def test_copy_landing_step_waits_for_every_copy_at_each_poll(landing, waits):
    cache = make_cache(device_pages=24, host_pages=30, device_snaps=4, host_snaps=6, retention=0,
                       write_policy="write_back", host_tier="exclusive", storage="none://")
    seen = []
    poll = cache.poll

    def spy(*, wait=False, now=None):
        seen.append(wait)
        assert now is not None   # the virtual clock paces L3 admission
        return poll(wait=wait, now=now)

    cache.poll = spy   # type: ignore[method-assign]
    rep = run(cache, small_chat(n=6, seed=3), max_running=3, chunk_tokens=8, copy_landing=landing)
    assert rep.mismatched_pages == 0 and seen and set(seen) == {waits}


def test_copy_landing_is_checked():
    with pytest.raises(ConfigError, match="copy_landing"):
        EngineConfig(copy_landing="later")


def test_copies_launched_between_steps_are_charged_to_the_next_step():
    from hicache.engine.records import NullExecutor
    from hicache.engine.scheduler import Scheduler

    class Moving(NullExecutor):
        """Each admission launches a 1 GB load (as an eviction's backup launching a queued
        load would): the clock must charge it to the step that follows."""
        loaded = 0

        def admit(self, job, now, first):
            Moving.loaded += 10**9
            return super().admit(job, now, first)

        def moved(self):
            return Moving.loaded, 0

    reqs = small_chat(n=1)[:1]
    cfg = EngineConfig(max_running=1)
    plain = Scheduler(NullExecutor(4, 1000, 0), cfg).run(reqs).records[0].ttft_s
    loaded = Scheduler(Moving(4, 1000, 0), cfg).run(reqs).records[0].ttft_s
    assert loaded == pytest.approx(plain + 10**9 / (cfg.clock.h2d_gbps * 1e9))


@pytest.mark.parametrize("device_pages, expect_queued", [(20, False), (40, True)])
def test_step_copy_landing_makes_slow_l3_puts_invisible_to_a_replay(monkeypatch, device_pages, expect_queued):
    """Device <-> host copies and L3 puts land by each step's end under ``step``, so what a
    later L3 lookup finds does not depend on the put threads: a replay whose puts take
    20 ms each gives the records of one whose puts are instant. (Without the put settle it
    does not; under ``wallclock`` it usually does not, but that depends on thread timing, so
    it is not asserted.) With the queue's head kept warm (the default) a 20-page device serves
    nothing from L3 here, so that case runs on 40 pages."""
    landing = "step"
    import time

    from hicache.storage.memory import MemoryBackend

    def replay(salt):
        cache = make_cache(device_pages=device_pages, host_pages=16, device_snaps=4, host_snaps=4,
                           retention=0, write_policy="write_back", host_tier="exclusive", storage="memory://",
                           salt=salt)
        rep = run(cache, small_chat(n=24, seed=5), max_running=4, chunk_tokens=8, decode_stride=4,
                  copy_landing=landing, expect_queued=expect_queued)
        assert rep.mismatched_pages == 0
        return [(r.request_id, r.hit_tokens, r.l3_hit_tokens, r.host_hit_tokens, r.finish_s) for r in rep.records]

    fast = replay(f"fast-{landing}-{device_pages}")   # memory:// is process-wide: a namespace each
    put = MemoryBackend.put

    def slow_put(self, keys, values):
        time.sleep(0.02)
        return put(self, keys, values)

    monkeypatch.setattr(MemoryBackend, "put", slow_put)
    slow = replay(f"slow-{landing}-{device_pages}")
    assert sum(r[2] for r in fast) > 0                 # L3 served hits
    assert slow == fast


@pytest.mark.parametrize("on", [True, False])
def test_the_queue_head_is_expected_at_each_step_the_next_to_admit_last(on):
    from hicache.engine.records import NullExecutor
    from hicache.engine.scheduler import Scheduler
    from hicache.engine.workloads.request import Request

    class Recording(NullExecutor):
        def __init__(self, *a):
            super().__init__(*a)
            self.calls, self.admitted = [], []

        def expect(self, req):
            assert req.request_id not in self.admitted, "a running request was expected"
            self.calls.append(req.request_id)

        def admit(self, job, now, first):
            self.admitted.append(job.req.request_id)
            return super().admit(job, now, first)

    out = np.arange(3, dtype=np.int32) + 900
    reqs = [Request(i, f"c{i}", 0, 0.0, np.arange(8, dtype=np.int32) + 10 * i, out) for i in range(4)]
    ex = Recording(4, 1000, 0)
    Scheduler(ex, EngineConfig(max_running=1, prefetch_ahead=2, expect_queued=on)).run(reqs)
    assert ex.admitted == [0, 1, 2, 3]
    if not on:
        assert ex.calls == []
        return
    # first pass: the queue is [0, 1, 2, 3], its head [0, 1], expected back to front
    assert ex.calls[:2] == [1, 0]
    # then, while 0 runs, [2, 1] at every step; 3 is expected only once 1 has started
    assert ex.calls[2:4] == [2, 1]
    assert ex.calls.index(3) > max(i for i, r in enumerate(ex.calls) if r == 1)


def test_reserve_admission_runs_no_more_requests_than_state_rows():
    """``request_slots`` caps what runs at once under ``reserve`` (never under ``greedy``),
    and every request still runs to its finish."""
    from hicache.engine.scheduler import Scheduler
    from hicache.engine.records import NullExecutor

    class Counting(NullExecutor):
        def __init__(self, *a):
            super().__init__(*a)
            self.now = self.most = 0

        def admit(self, job, now, first):
            self.now += 1
            self.most = max(self.most, self.now)
            return super().admit(job, now, first)

        def release(self, job):
            self.now -= 1
            super().release(job)

    reqs = synthetic(conversations=6, seed=2, system_prompts=1, system_len=8, user_len=(4, 8),
                     output_len=(30, 40), turns=(1, 1), vocab_size=1000, arrival_rate=None)
    for admission, slots, most in (("reserve", 2, 2), ("reserve", None, 6), ("greedy", 2, 6)):
        ex = Counting(4, 1000, 0, slots)
        rep = Scheduler(ex, EngineConfig(max_running=8, admission=admission)).run(reqs)
        assert ex.most == most, (admission, slots)
        assert all(r.finished for r in rep.records) and len(rep.records) == 6


@pytest.mark.parametrize("limit", [True, False])
def test_reserve_admission_leaves_every_running_request_a_state_row(monkeypatch, limit):
    """Split device pools: each running request holds a state row. Admitting more requests
    than rows, the next one's load found no row for its resume snapshot and resumed at the
    deepest point already on the device (the prompt recomputed from there); one request per
    row, no load falls back."""
    from hicache.engine import loop

    if not limit:
        monkeypatch.setattr(loop, "request_slots", lambda cache: None)
    reqs = synthetic(conversations=10, seed=5, system_prompts=1, system_len=40, user_len=(4, 20),
                     output_len=(20, 40), turns=(3, 4), vocab_size=1000, arrival_rate=None)
    cache = make_cache(device_pages=200, host_pages=80, device_snaps=3, host_snaps=24,
                       write_policy="write_back", host_tier="exclusive")   # pages for 8: rows for 3
    try:
        assert loop.request_slots(cache) == (3 if limit else None)
        rep = ReferenceEngine(cache, EngineConfig(max_running=8, chunk_tokens=8, step_tokens=64)).run(reqs)
        fallbacks = cache.stats()["load_fallbacks"]
        cache.check_integrity()
    finally:
        cache.close()
    assert rep.mismatched_pages == 0 and rep.preemptions == 0 and len(rep.records) == len(reqs)
    assert (fallbacks == 0) if limit else (fallbacks > 0), fallbacks
    hits = sum(r.hit_tokens for r in rep.records)
    assert (hits == 3280) if limit else (hits == 2184), hits   # this seed: a third of the hits lost


def test_request_slots_count_split_state_rows_only():
    from hicache.engine.loop import request_slots
    from tests.cache.conftest import mha_layout

    assert request_slots(make_cache(device_pages=30, device_snaps=5)) == 5
    assert request_slots(make_cache(device_pages=30, device_snaps=4, budget="shared")) is None   # arena
    assert request_slots(make_cache(mha_layout(), device_pages=30, device_snaps=0, host_snaps=0)) is None
