"""A policy-only replay (pools with no bytes, ``bytes_mode="none"``) makes the decisions of
the byte replay, exactly.

Each case runs the reference engine twice on the same requests and config -- once with
bytes (sampled checks on), once without (checks off) -- at budgets tight enough that
eviction, demotion, compaction, the exclusive host tier and (greedy admission) preemption
all happen, and compares every per-request record (hits per tier, recomputed tokens,
preemptions, queueing, TTFT), every cache counter and the bytes charged to the clock.
"""

from __future__ import annotations

import dataclasses

import pytest

from hicache.cache import HiCache
from hicache.cli.common import resolve_config
from hicache.config import load_config
from hicache.engine import EngineConfig, ReferenceEngine
from hicache.engine.workloads import AgenticSpec, agentic, sharegpt, synthetic
from hicache.errors import ConfigError

KiB, MiB = 1 << 10, 1 << 20
BYTE_ONLY = {"verified_pages", "mismatched_pages"}   # what only a byte replay can count
# transfer stats both modes must agree on (seconds and GB/s are the copies' own; launches
# follow the device: a CUDA byte replay loads layer by layer, a pool without bytes as a CPU one)
TRANSFER_KEYS = ("bytes", "launched_bytes", "ops", "batches", "failures")

AGENTIC = AgenticSpec(system_prompts=(2, 3), system_len=(100, 300), task_len=(20, 80), rollouts=(2, 4),
                      steps=(2, 5), call_len=(5, 30), result_len=(10, 60), arrival_rate=1.0,
                      rollout_spread_s=0.2, think_time_s=1.0)


def chat(n: int, seed: int = 0):
    return synthetic(conversations=n, seed=seed, system_prompts=3, system_len=120, user_len=(10, 80),
                     output_len=(10, 60), turns=(2, 6), vocab_size=5000)


HYBRID_TIGHT = dict(budget="shared_host", write_policy="write_back", host_tier="exclusive", retention_interval=None)

# name: (config, requests, cache overrides, engine overrides, counters that must be > 0)
CASES = {
    "multi-turn, hybrid, shared_host, exclusive, adaptive switching": (
        "tiny-hybrid", lambda: chat(16),
        dict(HYBRID_TIGHT, eviction="adaptive", adaptive_window=8, adaptive_margin=0.0, adaptive_z=0.0, adaptive_trial=4,
             device_bytes=28 * KiB, host_bytes=12 * KiB),
        {}, ("device_demoted_pages", "host_evicted_pages", "host_released_pages", "compaction_moves",
             "snapshots_evicted_device", "snapshots_evicted_host", "host_hit_tokens", "policy_switches", "policy_trials")),
    "agentic, hybrid, shared arenas, exclusive, lru": (
        "tiny-hybrid", lambda: agentic(6, 1, spec=AGENTIC),
        dict(HYBRID_TIGHT, budget="shared", eviction="lru", state_share=None, device_bytes=24 * KiB,
             host_bytes=16 * KiB),
        {}, ("device_demoted_pages", "host_evicted_pages", "host_released_pages", "compaction_moves",
             "snapshots_evicted_host", "host_hit_tokens")),
    "sharegpt, hybrid, shared_host, exclusive, value": (
        "tiny-hybrid", lambda: sharegpt(30, 0, max_prompt_tokens=800),
        dict(HYBRID_TIGHT, eviction="value", device_bytes=48 * KiB, host_bytes=40 * KiB),
        {}, ("device_demoted_pages", "host_evicted_pages", "host_released_pages", "compaction_moves",
             "snapshots_evicted_device", "host_hit_tokens")),
    "sharegpt, MHA, split, exclusive": (
        "tiny-mha", lambda: sharegpt(30, 0, max_prompt_tokens=800),
        dict(write_policy="write_back", host_tier="exclusive", device_bytes=320 * KiB, host_bytes=256 * KiB),
        {}, ("device_demoted_pages", "host_evicted_pages", "host_released_pages", "host_hit_tokens")),
    "multi-turn, MHA, write_through, greedy admission": (
        "tiny-mha", lambda: chat(16), dict(device_bytes=192 * KiB, host_bytes=512 * KiB),
        dict(admission="greedy", max_running=8),
        ("device_demoted_pages", "host_evicted_pages", "preemptions", "host_hit_tokens")),
    "sharegpt, DeepSeek-V4-Flash, its config's policies": (
        "deepseek-v4-flash", lambda: sharegpt(40, 0, max_prompt_tokens=6000),
        dict(device_bytes=int(0.06 * 1024 * MiB), host_bytes=int(0.05 * 1024 * MiB)),
        {}, ("device_demoted_pages", "host_evicted_pages", "host_released_pages",
             "compaction_moves", "snapshots_evicted_host", "host_hit_tokens")),
}


def replay(config: str, reqs, bytes_mode: str, cache_over: dict, engine_over: dict):
    layout, cfg = load_config(resolve_config(config), storage_url="none://", bytes_mode=bytes_mode, **cache_over)
    cache = HiCache(layout, cfg)
    try:
        ecfg = EngineConfig(verify="sample" if bytes_mode == "real" else "off", **engine_over)
        report = ReferenceEngine(cache, ecfg).run(reqs)
        cache.check_integrity()
        assert cache.pools.holds_bytes == (bytes_mode == "real")
        return report, cache.stats(), cache.transfer_stats()
    finally:
        cache.close()


def records(report) -> list[dict]:
    return [{k: v for k, v in dataclasses.asdict(r).items() if k not in BYTE_ONLY} for r in report.records]


@pytest.mark.parametrize("name", list(CASES))
def test_policy_only_replay_makes_the_byte_replays_decisions(name):
    config, build, cache_over, engine_over, happens = CASES[name]
    reqs = build()
    real, real_stats, real_t = replay(config, reqs, "real", cache_over, engine_over)
    none, none_stats, none_t = replay(config, reqs, "none", cache_over, engine_over)
    assert real.verified_pages > 0 and real.mismatched_pages == 0
    assert none.verified_pages == 0 and none.mismatched_pages == 0
    assert records(none) == records(real)
    assert (none.steps, none.preemptions, none.rejected, none.virtual_s) == \
           (real.steps, real.preemptions, real.rejected, real.virtual_s)
    assert none_stats == real_stats
    for d in ("d2h", "h2d"):
        assert {k: none_t[d][k] for k in TRANSFER_KEYS} == {k: real_t[d][k] for k in TRANSFER_KEYS}, d
    assert real_t["h2d"]["launched_bytes"] > 0 and none_t["backend"] == "none"
    # the case is tight enough for what it is meant to show
    totals = dict(real_stats, preemptions=real.preemptions,
                  host_hit_tokens=sum(r.host_hit_tokens for r in real.records))
    assert all(totals[k] > 0 for k in happens), {k: totals[k] for k in happens}


def test_a_policy_only_cache_takes_no_l3_and_checks_nothing():
    with pytest.raises(ConfigError, match="storage_url.*none://"):
        load_config(resolve_config("tiny-hybrid"), bytes_mode="none")   # the config's memory:// L3
    layout, cfg = load_config(resolve_config("tiny-hybrid"), bytes_mode="none", storage_url="none://")
    cache = HiCache(layout, cfg)
    try:
        with pytest.raises(ConfigError, match="verify"):
            ReferenceEngine(cache, EngineConfig(verify="sample")).run(chat(2))
    finally:
        cache.close()
