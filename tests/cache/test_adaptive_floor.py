"""``eviction: adaptive`` while it follows LRU *is* ``eviction: lru``: the same victims, the
same demotions, the same hits request by request. The floor the selector keeps is hicache's
own plain LRU, so nothing but the order it follows may differ (a rule of another candidate,
such as dropping a dead tail instead of demoting it, must not apply under LRU) -- until the
traffic shows that no prompt reads a decode's output: then the floor drops those idle tails
first (``lru-tails``, hicache.tree.outputs), and only then."""

from __future__ import annotations

import dataclasses

from hicache.cache import HiCache
from hicache.cli.common import resolve_config
from hicache.config import load_config
from hicache.engine import EngineConfig, ReferenceEngine
from hicache.engine.workloads import sharegpt, synthetic
from hicache.engine.workloads.reasoning import ReasoningSpec, reasoning

KiB = 1 << 10
TIGHT = dict(budget="shared_host", write_policy="write_back", host_tier="exclusive", retention_interval=None,
             device_bytes=24 * KiB, host_bytes=16 * KiB)


def replay(reqs, **over):
    layout, cfg = load_config(resolve_config("tiny-hybrid"), storage_url="none://", bytes_mode="none",
                              **TIGHT, **over)
    cache = HiCache(layout, cfg)
    try:
        report = ReferenceEngine(cache, EngineConfig(verify="off")).run(reqs)
        cache.check_integrity()
        stats = cache.stats()
        policy = {k: stats.pop(k) for k in list(stats) if k.startswith(("policy_", "ghost_"))}
        return [dataclasses.asdict(r) for r in report.records], stats, policy
    finally:
        cache.close()


def workloads():
    yield synthetic(conversations=16, seed=0, system_prompts=3, system_len=120, user_len=(10, 80),
                    output_len=(10, 60), turns=(2, 6), vocab_size=5000)
    yield sharegpt(30, 0, max_prompt_tokens=800)


def test_adaptive_following_lru_throughout_decides_as_plain_lru():
    for reqs in workloads():
        lru = replay(reqs, eviction="lru")
        # a window longer than the run: the selector never leaves LRU (its warm-up)
        ada = replay(reqs, eviction="adaptive", adaptive_window=10**6)
        assert ada[2]["policy_followed"] == "lru" and ada[2]["policy_switches"] == 0
        assert ada[0] == lru[0]
        assert ada[1] == lru[1]
        assert lru[1]["device_demoted_pages"] > 0 and lru[1]["host_evicted_pages"] > 0


def test_where_no_prompt_reads_a_decodes_output_the_floor_drops_idle_tails_first():
    # reasoning turns: each next prompt carries the answers, not the thinking, so it goes
    # on past where the previous decode began without entering its output
    reqs = reasoning(16, 0, spec=ReasoningSpec(turns=(3, 6), system_prompts=3, system_len=120, user_len=(10, 80),
                                               thinking_len=(20, 100), answer_len=(10, 40), vocab_size=5000))
    lru = replay(reqs, eviction="lru")
    ada = replay(reqs, eviction="adaptive", adaptive_window=10**6, adaptive_dead_outputs=4)
    assert ada[2]["policy_followed"] == "lru-tails" and ada[2]["policy_switches"] == 0
    hits = [sum(r["hit_tokens"] for r in run[0]) for run in (lru, ada)]
    assert hits[1] > hits[0]
    # off, it is plain LRU again, request by request
    off = replay(reqs, eviction="adaptive", adaptive_window=10**6, adaptive_dead_outputs=0)
    assert off[2]["policy_followed"] == "lru" and off[0] == lru[0]
