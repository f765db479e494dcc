"""``eviction: adaptive`` while it follows LRU *is* ``eviction: lru``: the same victims, the
same demotions, the same hits request by request. The floor the selector keeps is hicache's
own plain LRU, so nothing but the order it follows may differ (a rule of another candidate,
such as dropping a dead tail instead of demoting it, must not apply under LRU)."""

from __future__ import annotations

import dataclasses

from hicache.cache import HiCache
from hicache.cli.common import resolve_config
from hicache.config import load_config
from hicache.engine import EngineConfig, ReferenceEngine
from hicache.engine.workloads import sharegpt, synthetic

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
