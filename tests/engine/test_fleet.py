"""Several engines on one L3 store (issue 26 part 3): the router's assignment, turn order
across engines on one virtual clock, and L3 carrying a conversation between engines."""

from __future__ import annotations

import pytest

from hicache.config import AdmitConfig
from hicache.engine import EngineConfig, run_fleet
from hicache.engine.fleet import assign
from hicache.errors import ConfigError
from tests.cache.conftest import make_cache
from tests.engine.test_loop import small_chat

ADMIT = AdmitConfig(mode="published", min_tokens=8, gbps=1.0)
CFG = EngineConfig(max_running=2, chunk_tokens=8, step_tokens=32, decode_stride=8)


def fleet(n, url, routing, reqs):
    caches = [make_cache(device_pages=60, host_pages=60, device_snaps=8, host_snaps=8, write_policy="write_back",
                         storage=url, admit=ADMIT, prefetch_policy="timeout") for _ in range(n)]
    try:
        run = run_fleet(caches, CFG, reqs, routing)
        for c in caches:
            c.check_integrity()
    finally:
        for c in caches:
            c.close()
    return run


def test_round_robin_sends_each_turn_to_the_next_engine_and_conversation_routing_sticks():
    reqs = small_chat(n=6)
    rr, sticky = assign(reqs, 3, "round-robin"), assign(reqs, 3, "conversation")
    order = sorted(reqs, key=lambda r: (r.arrival_s, r.request_id))
    assert [rr[r.request_id] for r in order] == [i % 3 for i in range(len(order))]
    for conv in {r.conversation_id for r in reqs}:
        assert len({sticky[r.request_id] for r in reqs if r.conversation_id == conv}) == 1
    with pytest.raises(ConfigError, match="routing"):
        assign(reqs, 2, "random")


def test_a_conversation_moves_between_engines_through_l3_in_turn_order():
    reqs = small_chat(n=8)
    run = fleet(2, "memory://fleet-rr", "round-robin", reqs)
    recs = {r.request_id: r for rep in run.reports for r in rep.records}
    assert len(recs) == len(reqs) and all(r.finished for r in recs.values())
    assert sum(rep.mismatched_pages for rep in run.reports) == 0
    assert sum(r.l3_hit_tokens for r in recs.values()) > 0
    # turn k+1 starts after turn k finished, wherever each ran
    by_conv: dict = {}
    for q in reqs:
        by_conv.setdefault(q.conversation_id, []).append(q)
    for turns in by_conv.values():
        turns.sort(key=lambda q: q.turn)
        for a, b in zip(turns, turns[1:]):
            assert recs[b.request_id].ready_s >= recs[a.request_id].finish_s
    # without a shared store the other engine has nothing of the conversation
    alone = fleet(2, "none://", "round-robin", reqs)
    hit = sum(r.hit_tokens for rep in run.reports for r in rep.records)
    assert hit > sum(r.hit_tokens for rep in alone.reports for r in rep.records)
    assert sum(r.l3_hit_tokens for rep in alone.reports for r in rep.records) == 0


@pytest.mark.redis
def test_redis_killed_midway_every_engine_finishes_with_no_mismatch():
    from tests.redis_server import REDIS_SERVER, SKIP_REASON, RedisServer

    if REDIS_SERVER is None:
        pytest.skip(SKIP_REASON)
    server = RedisServer()
    reqs = small_chat(n=10)
    caches = [make_cache(device_pages=60, host_pages=60, device_snaps=8, host_snaps=8, write_policy="write_back",
                         storage=server.url, admit=ADMIT, prefetch_policy="timeout") for _ in range(3)]
    killed = []

    def progress(done, total):
        if done == total // 3 and not killed:
            server.kill()
            killed.append(done)

    try:
        run = run_fleet(caches, CFG, reqs, "round-robin", progress)
        for c in caches:
            c.check_integrity()
        stats = [c.stats() for c in caches]
    finally:
        for c in caches:
            c.close()
        server.close()
    recs = [r for rep in run.reports for r in rep.records]
    assert killed and len(recs) == len(reqs) and all(r.finished for r in recs)
    assert sum(rep.mismatched_pages for rep in run.reports) == 0
    assert sum(r.l3_hit_tokens for r in recs) > 0          # before the kill
    assert sum(s["l3_errors"] for s in stats) > 0           # after it: faults, counted, not raised
