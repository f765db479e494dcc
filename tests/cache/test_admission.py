"""L3 admission (issue 26): chains reach L3 on their own, at the budget's pace, without
changing a device or host decision; a second cache resumes from them."""

from __future__ import annotations

import numpy as np
import pytest

from hicache.cache import HiCache, admission_active
from hicache.cache.admission import KeyMemo
from hicache.config import AdmitConfig, cache_config_from_mapping
from hicache.errors import ConfigError
from tests.cache.conftest import P, Engine, make_cache, mha_layout, toks

ON = AdmitConfig(mode="published", min_tokens=2 * P, gbps=1.0, burst_bytes=1 << 20)
OFF = AdmitConfig(mode="off")
# roomy tiers: nothing is ever evicted, so without admission L3 receives nothing
ROOMY = dict(device_pages=64, host_pages=64, device_snaps=16, host_snaps=16, write_policy="write_back")


def serve(eng: Engine, prompts, now: float = 0.0, step: float = 1.0) -> float:
    for t in prompts:
        eng.run(t)
        now += step
        eng.cache.poll(wait=True, now=now)
    return now


def test_published_chains_reach_l3_when_nothing_is_evicted():
    eng = Engine(make_cache(storage="memory://adm-a", admit=ON, **ROOMY))
    a, b = toks(1, 2, 3, extra=1), toks(7, 8, extra=1)
    serve(eng, [a, b, toks(9, extra=1)])                 # the last is under min_tokens
    c = eng.cache.counters
    assert c.device_evicted_pages == 0 and c.host_evicted_pages == 0
    assert c.l3_admit_chains == 2 and c.l3_admit_objects == 3 + 1 + 2 + 1
    assert c.l3_admit_bytes == 5 * eng.cache.layout.object_bytes("page") + 2 * eng.cache.layout.object_bytes("state")
    eng.cache.check_integrity()
    eng.cache.close()
    # without admission the same traffic leaves L3 empty (the symptom)
    eng = Engine(make_cache(storage="memory://adm-b", admit=OFF, **ROOMY))
    serve(eng, [a, b])
    assert eng.cache.counters.l3_put_objects == 0 and eng.cache.counters.l3_admit_chains == 0
    eng.cache.close()


def test_a_second_cache_resumes_from_what_admission_wrote_and_skips_what_is_there():
    first = Engine(make_cache(storage="memory://adm-c", admit=ON, **ROOMY))
    a = toks(1, 2, 3, extra=1)
    serve(first, [a])
    second = Engine(make_cache(storage="memory://adm-c", admit=ON, **ROOMY))
    m = second.cache.match(a)
    assert m.resume_tokens == 0 and len(m.l3_hashes) == 3
    assert second.cache.finish_prefetch(second.cache.prefetch(m)) == 3 * P
    _, lease = second.start(a)                           # loads and verifies every byte
    assert lease.l3_tokens == 3 * P
    second.cache.release(lease)
    second.cache.poll(wait=True, now=1.0)
    # the same chain computed again elsewhere: nothing new is written
    third = Engine(make_cache(storage="memory://adm-c", admit=ON, **ROOMY))
    serve(third, [a])
    c = third.cache.counters
    assert c.l3_admit_chains == 1 and c.l3_admit_objects == 0 and c.l3_admit_skipped_existing == 4
    for e in (first, second, third):
        e.cache.check_integrity()
        e.cache.close()


def paced(store: str):
    """An engine whose admission budget is one page a second, after serving ten prompts."""
    page = make_cache().layout.object_bytes("page")
    slow = AdmitConfig(mode="published", min_tokens=P, gbps=page / 1e9, burst_bytes=page)
    eng = Engine(make_cache(storage=store, admit=slow, **ROOMY))
    prompts = [toks(v, v + 1, extra=1) for v in range(10, 40, 3)]
    for t in prompts:
        eng.run(t)
    return eng, prompts


def test_the_bandwidth_budget_paces_the_writes():
    eng, prompts = paced("memory://adm-d")
    for second in range(1, 4):
        eng.cache.poll(wait=True, now=float(second))
        c = eng.cache.counters
        # the bucket lets through at most burst + rate x elapsed (one chain may overdraw it)
        assert c.l3_admit_chains <= second + 1, (second, c.l3_admit_chains)
    assert c.l3_admit_throttled > 0 and eng.cache._admission.pending() > 0
    # the bucket holds one burst: a long pause does not let a flood through at once
    eng.cache.poll(wait=True, now=1000.0)
    assert eng.cache.counters.l3_admit_chains == c.l3_admit_chains + 1
    for t in range(1001, 1040):
        eng.cache.poll(wait=True, now=float(t))
    assert eng.cache.counters.l3_admit_chains == len(prompts)
    eng.cache.check_integrity()
    eng.cache.close()


def test_a_poll_without_the_callers_clock_does_not_stop_the_pace():
    """A plain poll (monotonic time, far past the virtual clock) between virtual-time polls
    left the bucket's clock ahead of every later virtual time: admission stopped for good."""
    eng, prompts = paced("memory://adm-clock")
    eng.cache.poll(wait=True, now=1.0)
    eng.cache.poll(wait=True)                          # no clock given: nothing refilled
    before = eng.cache.counters.l3_admit_chains
    for t in range(2, 60):
        eng.cache.poll(wait=True, now=float(t))
    assert before < len(prompts) and eng.cache.counters.l3_admit_chains == len(prompts)
    eng.cache.check_integrity()
    eng.cache.close()


def test_max_pending_drops_the_lowest_ranked_and_counts_it():
    cfg = AdmitConfig(mode="published", min_tokens=P, gbps=1e-9, burst_bytes=1, max_pending=2)
    eng = Engine(make_cache(storage="memory://adm-e", admit=cfg, **ROOMY))
    for v in range(5):
        eng.run(toks(100 + v, extra=1))
    assert eng.cache._admission.pending() == 2 and eng.cache.counters.l3_admit_dropped == 3
    eng.cache.close()


def trace(admit: AdmitConfig, url: str) -> tuple[dict, list, int]:
    """Tight tiers under eviction; what the device and host decided, and the tree's shape."""
    eng = Engine(make_cache(storage=url, admit=admit, device_pages=6, host_pages=8, device_snaps=3,
                            host_snaps=4, write_policy="write_back"))
    rng = np.random.default_rng(5)
    now = 0.0
    for i in range(40):
        base = int(rng.integers(0, 6))
        eng.run(toks(base, base + 1, int(rng.integers(20, 24)), extra=1))
        now += 0.5
        eng.cache.poll(wait=True, now=now)
    s = eng.cache.stats()
    keep = {k: v for k, v in s.items() if not k.startswith(("l3_", "hit_rate"))}
    shape = sorted((n.depth, n.device_ids is not None, n.host_ids is not None)
                   for n in eng.cache._tree.nodes())
    eng.cache.check_integrity()
    eng.cache.close()
    return keep, shape, s["l3_admit_chains"]


def test_admission_changes_no_device_or_host_decision():
    everything = AdmitConfig(mode="published", min_tokens=P, gbps=100.0, burst_bytes=1 << 30)
    on, off = trace(everything, "memory://adm-f"), trace(OFF, "memory://adm-g")
    assert on[2] > 0 and off[2] == 0
    assert on[0]["device_evicted_pages"] + on[0]["device_demoted_pages"] > 0 and on[0]["host_evicted_pages"] > 0
    assert on[:2] == off[:2]


def test_reused_mode_waits_for_a_reuse_and_stateless_layouts_admit_pages():
    reused = AdmitConfig(mode="reused", min_tokens=P, gbps=1.0, burst_bytes=1 << 20)
    eng = Engine(make_cache(storage="memory://adm-h", admit=reused, **ROOMY))
    a = toks(1, 2, extra=1)
    serve(eng, [a])
    assert eng.cache.counters.l3_admit_chains == 0
    serve(eng, [toks(1, 2, 5, extra=1)])                 # resumes at a's end
    assert eng.cache.counters.l3_admit_chains == 1
    eng.cache.close()
    eng = Engine(make_cache(mha_layout(), storage="memory://adm-i", admit=ON, device_pages=64, host_pages=64,
                            write_policy="write_back"))
    serve(eng, [toks(1, 2, 3, extra=1)])
    assert eng.cache.counters.l3_admit_objects == 3
    eng.cache.check_integrity()
    eng.cache.close()


@pytest.mark.parametrize("key, value", [("l3_admit", "always"), ("l3_admit_gbps", 0), ("l3_admit_min_tokens", -1),
                                        ("l3_admit_max_pending", 0), ("l3_admit_burst_bytes", "lots")])
def test_bad_admission_settings_name_the_field(key, value):
    with pytest.raises(ConfigError) as exc:
        cache_config_from_mapping({key: value})
    assert key in str(exc.value)


@pytest.mark.parametrize("url, active", [("none://", False), ("memory://", False), ("memory://?capacity=1MiB", False),
                                        ("MEMORY://", False), ("memory:///", False), ("memory://adm-shared", True)])
def test_admission_only_for_stores_someone_else_reads(url, active):
    """A private memory:// store is read only by its own cache (the host path serves it);
    admission would only fill its capacity (the main job lost L3 hits that way)."""
    cache = make_cache(storage=url, admit=ON)
    assert isinstance(cache, HiCache) and cache._admission.enabled is active
    assert admission_active(ON, url) is active
    cache.close()


def test_the_memo_of_stored_keys_is_bounded_in_recency_order():
    memo = KeyMemo(2)
    memo.update([b"a", b"b"])
    assert b"a" in memo                   # found: now the most recent
    memo.add(b"c")                        # forgets b, the least recent
    assert len(memo) == 2 and memo.forgotten == 1
    assert b"b" not in memo and b"a" in memo and b"c" in memo


def test_a_bounded_memo_forgets_keys_but_never_writes_an_object_twice():
    small = AdmitConfig(mode="published", min_tokens=2 * P, gbps=1.0, burst_bytes=1 << 20, memo_keys=2)
    eng = Engine(make_cache(storage="memory://adm-memo", admit=small, **ROOMY))
    serve(eng, [toks(1, 2, 3, extra=1), toks(1, 2, 3, 4, extra=1)])
    c = eng.cache.counters
    # a: 3 pages + its snapshot; b: one page more + its snapshot. The memo kept two page
    # keys of a's three (1 forgotten), so b's chain asked the store about a's pages again:
    # found, not rewritten; recording them and b's page forgot 3 + 1 more.
    assert c.l3_admit_objects == 4 + 2
    assert c.l3_admit_skipped_existing == 3 and c.l3_admit_memo_forgotten == 1 + 3 + 1
    eng.cache.check_integrity()
    eng.cache.close()
    with pytest.raises(ConfigError, match="l3_admit_memo_keys"):
        AdmitConfig(memo_keys=0)
