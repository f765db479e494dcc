"""Random traffic (StressRunner) on every layout kind, and hypothesis-chosen settings."""

from __future__ import annotations


import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from hicache.engine.stress import StressConfig, StressRunner
from tests.cache.conftest import hybrid_layout, make_cache, mha_layout


def run(cache, **kw):
    try:
        rep = StressRunner(cache, StressConfig(**kw)).run()
    finally:
        cache.close()
    assert rep.integrity_errors == 0, rep.first_error
    assert rep.mismatched_pages == 0 and rep.mismatched_snapshots == 0
    return rep


POLICIES = [("write_through", "inclusive"), ("write_through_selective", "inclusive"),
            ("write_back", "inclusive"), ("write_back", "exclusive")]


@pytest.mark.parametrize("policy, tier", POLICIES)
@pytest.mark.parametrize("layout", [hybrid_layout, mha_layout])
def test_stress_policies(policy, tier, layout):
    rep = run(make_cache(layout(), device_pages=12, device_snaps=4, host_pages=20, host_snaps=6,
                         write_policy=policy, host_tier=tier, retention=0), ops=400, seed=1)
    assert rep.verified_pages > 0 and rep.requests > 20
    s = rep.stats
    assert s["device_evicted_pages"] + s["device_demoted_pages"] > 0   # pressure happened


@pytest.mark.parametrize("policy, tier", [("write_through", "inclusive"), ("write_back", "inclusive"),
                                          ("write_back", "exclusive")])
def test_stress_with_l3_prefetch_and_copy_faults(policy, tier):
    rep = run(make_cache(device_pages=10, device_snaps=3, host_pages=14, host_snaps=5, write_policy=policy,
                         host_tier=tier, retention=0), ops=1500, seed=5, prefetch=0.7, fault_rate=0.05)
    s = rep.stats
    assert s["load_failures"] + s["backup_failures"] > 0      # faults happened ...
    assert rep.l3_tokens > 0 and s["l3_hit_tokens"] > 0       # ... and L3 served hits


def test_stress_hits_host_tier():
    rep = run(make_cache(device_pages=10, device_snaps=4, host_pages=40, host_snaps=16,
                         write_policy="write_through", retention=None), ops=600, seed=3)
    assert rep.stats["host_hit_tokens"] > 0 and rep.stats["loaded_pages"] > 0
    assert rep.stats["host_evicted_pages"] >= 0


@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(seed=st.integers(0, 10_000), device_pages=st.integers(6, 16), host_pages=st.integers(4, 30),
       snaps=st.integers(1, 5), retention=st.sampled_from([None, 0, 8]),
       policy=st.sampled_from(POLICIES),
       eviction=st.sampled_from(["lru", "lfu", "value", "reuse", "reuse-prompt", "adaptive"]),
       running=st.integers(1, 4),
       layout=st.sampled_from([hybrid_layout, mha_layout]), faults=st.sampled_from([0.0, 0.0, 0.1]),
       z=st.sampled_from([0.0, 2.0]), trial=st.sampled_from([0, 0, 5]))
def test_stress_random_settings(seed, device_pages, host_pages, snaps, retention, policy, eviction, running,
                                layout, faults, z, trial):
    # adaptive: a short window and no margin, so it switches orders (and rebuilds them) mid-run
    cache = make_cache(layout(), device_pages=device_pages, device_snaps=snaps, host_pages=host_pages,
                       host_snaps=snaps + 1, write_policy=policy[0], host_tier=policy[1], retention=retention,
                       eviction=eviction, window=8, margin=0.0, z=z, trial=trial)
    run(cache, ops=150, seed=seed, max_running=running, fault_rate=faults)


def test_stress_with_the_adaptive_policy_switching():
    rep = run(make_cache(device_pages=8, device_snaps=3, host_pages=16, host_snaps=5, write_policy="write_back",
                         host_tier="exclusive", eviction="adaptive", window=8, margin=0.0),
              ops=1500, seed=3, fault_rate=0.05)
    assert rep.stats["policy_switches"] > 0 and rep.verified_pages > 0


def test_stress_with_switches_on_trial():
    # each switch is tried first in a clone of the followed ghost: trials run beside the
    # real cache's events (publishes, expects, releases, faults) and some are taken
    rep = run(make_cache(device_pages=8, device_snaps=3, host_pages=16, host_snaps=5, write_policy="write_back",
                         host_tier="exclusive", eviction="adaptive", window=8, margin=0.0, trial=4),
              ops=1500, seed=3, fault_rate=0.05)
    assert rep.stats["policy_trials"] > 0 and rep.stats["policy_switches"] > 0 and rep.verified_pages > 0
