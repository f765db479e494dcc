"""The hybrid reference: kvcache-simulator's LRU reimplemented (checked against the simulator
on random traces) and each hit counted again at snapshot boundaries (exact hand-built cases)."""

from __future__ import annotations

import json

import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from hicache.engine.hybrid_ref import hit_rates, plan_trace, reference
from hicache.engine.workloads import parse_trace
from hicache.errors import ConfigError

BS = 16


def write(tmp_path, reqs, name="t.jsonl"):
    path = tmp_path / name
    path.write_text("".join(json.dumps({"hash_ids": list(ids), "input_length": n, "block_size": BS}) + "\n"
                            for ids, n in reqs))
    return path


def rates(tmp_path, reqs, cap, chunk_blocks=0):
    return hit_rates(plan_trace(parse_trace(write(tmp_path, reqs))), cap, chunk_blocks=chunk_blocks)


def test_a_hybrid_hit_ends_at_a_request_end_or_a_fork(tmp_path):
    # r0, r1 warm up (4 blocks fill the cache); r2, r3 are measured. r1 leaves r0's path
    # after block 2: a fork snapshot there. r3 reaches block 5 (r2's), which ends no
    # request and no fork. r2's 10 tokens past its last hash are not counted (simulator).
    reqs = [([1, 2, 3], 48), ([1, 2, 4], 48), ([1, 2, 5, 6], 74), ([1, 2, 5, 8], 64)]
    assert rates(tmp_path, reqs, 4) == ((32 + 48) / 128, (32 + 32) / 128)


def test_eviction_is_lru_leaf_first_and_takes_the_snapshot_it_ends(tmp_path):
    # cap 3: r1 evicts r0's blocks 3 then 2 (leaves, least recently used first), so r2
    # finds only block 1 -- a block hit, but no snapshot ends there (block 3's went with it)
    reqs = [([1, 2, 3], 48), ([4, 5], 32), ([1, 2, 3], 48), ([4, 5], 32)]
    assert rates(tmp_path, reqs, 3) == (16 / 80, 0.0)


def test_a_partial_last_block_counts_for_the_block_lru_only(tmp_path):
    # r2 repeats r0's 40 tokens (2 whole blocks + 8): the simulator counts all 40 as hit; a
    # hybrid cache resumes at the whole-block boundary, 32
    reqs = [([1, 2, 3], 40), ([4], 16), ([1, 2, 3], 40), ([4], 16)]
    assert rates(tmp_path, reqs, 4) == (1.0, (32 + 16) / 56)


def test_chunk_end_snapshots_let_a_hit_resume_inside_a_long_prompt(tmp_path):
    # chunks of 2 blocks: r0's prefill offers snapshots at blocks 2 and 4 (and its end, 5);
    # r2 reaches block 4 and r3 block 2, which without chunk snapshots end nothing
    reqs = [([1, 2, 3, 4, 5], 80), ([1, 2, 3, 7], 64), ([1, 2, 3, 4, 8], 80), ([1, 2, 9], 48)]
    assert rates(tmp_path, reqs, 6) == (96 / 128, 48 / 128)
    assert rates(tmp_path, reqs, 6, chunk_blocks=2) == (96 / 128, 96 / 128)


def test_a_cache_not_full_before_the_measured_half_has_no_figure(tmp_path):
    reqs = [([1, 2, 3], 48), ([1, 2, 4], 48), ([1, 2, 5, 6], 74), ([1, 2, 5, 8], 64)]
    assert rates(tmp_path, reqs, 5) == (None, None)
    (point,) = reference(write(tmp_path, reqs), [5])
    assert (point.capacity_blocks, point.block_lru, point.hybrid_lru) == (5, None, None)


def test_bad_capacity_and_chunk_are_config_errors(tmp_path):
    plan = plan_trace(parse_trace(write(tmp_path, [([1], 16), ([1], 16)])))
    for kw in ({"capacity_blocks": 0}, {"capacity_blocks": 2, "chunk_blocks": -1}):
        with pytest.raises(ConfigError):
            hit_rates(plan, **kw)


# Random traces over a few ids: prefixes shared and repeated, ids that are not prefix-unique
# (the same id under two parents, or twice in one request), partial and unhashed tails, and
# requests longer than the cache.
requests_st = st.lists(
    st.tuples(st.lists(st.integers(0, 5), min_size=1, max_size=7), st.integers(-20, 20)),
    min_size=2, max_size=14)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(requests_st, st.integers(1, 10))
def test_the_block_count_is_kvcache_simulators_lru(tmp_path, reqs, cap):
    trace_mod = pytest.importorskip("kvcache_sim.trace")
    from kvcache_sim.plan import build_execution_plan
    from kvcache_sim.policies import simulate_trie_policy

    path = write(tmp_path, [(ids, max(1, len(ids) * BS + extra)) for ids, extra in reqs])
    sim = simulate_trie_policy(build_execution_plan(trace_mod.parse_trace_file(path)), cap, optimal=False)
    block, hybrid = rates(tmp_path, [(ids, max(1, len(ids) * BS + extra)) for ids, extra in reqs], cap)
    if sim.measurementMode == "underfilled_at_window":
        assert block is None and hybrid is None
    else:
        assert block == pytest.approx(sim.hitRate, abs=1e-12)
        assert hybrid is not None and hybrid <= block
