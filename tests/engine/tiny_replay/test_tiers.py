"""Each tier's resume path, through the facade, is exact against a no-cache recompute.

Conversation ``a``: turn 1 is a 70-token prompt and a 30-token answer (boundaries with a
snapshot at 32 and 64 = prompt end, and at 96 = finish); turn 2's prompt is turn 1's
prompt + answer + 20 new tokens, so it can resume at 96 and computes the other 34.
Between the turns, 100-token requests from other conversations push turn 1's pages out
of the device (10 pages) and then the host (16 pages).
"""

from __future__ import annotations

import numpy as np

from tests.engine.tiny_replay.conftest import assert_exact, request, serve, small_cache, toks

A_PROMPT, A_OUT = toks(1, 70), toks(2, 30)
A2_PROMPT, A2_OUT = np.concatenate([A_PROMPT, A_OUT, toks(3, 20)]), toks(4, 10)
RESUME = 96
COMPUTED = len(A2_PROMPT) + len(A2_OUT) - RESUME


def _two_turns(cache, fillers: int):
    """Turn 1, ``fillers`` other requests, turn 2; returns turn 2's report."""
    first = serve(cache, [request(0, A_PROMPT, A_OUT, conv="a")])
    assert_exact(first, checked=100)
    for i in range(fillers):
        assert_exact(serve(cache, [request(10 + i, toks(100 + 2 * i, 70), toks(101 + 2 * i, 30))]))
    return serve(cache, [request(1, A2_PROMPT, A2_OUT, conv="a", turn=1)])


def test_resume_from_the_device_is_exact():
    cache = small_cache()
    report = _two_turns(cache, fillers=0)
    rec = report.records[0]
    assert (rec.hit_tokens, rec.device_hit_tokens, rec.host_hit_tokens, rec.l3_hit_tokens) == (RESUME, RESUME, 0, 0)
    assert rec.verified_pages == RESUME // 16 + 1  # six pages and the snapshot, bit-identical
    assert_exact(report, checked=COMPUTED)
    cache.close()


def test_resume_from_the_host_after_device_eviction_is_exact():
    cache = small_cache()
    report = _two_turns(cache, fillers=1)
    rec = report.records[0]
    s = cache.stats()
    assert s["device_demoted_pages"] > 0 and s["loaded_pages"] > 0
    # Device eviction takes leaves first: the deepest pages come back from the host, the
    # first ones are still on the device.
    assert rec.hit_tokens == RESUME and rec.l3_hit_tokens == 0
    assert rec.host_hit_tokens > 0 and rec.device_hit_tokens + rec.host_hit_tokens == RESUME
    assert_exact(report, checked=COMPUTED)
    cache.close()


def test_resume_from_l3_after_host_eviction_is_exact():
    cache = small_cache()
    report = _two_turns(cache, fillers=3)
    rec = report.records[0]
    s = cache.stats()
    assert s["host_evicted_pages"] > 0 and s["l3_prefetched_pages"] == RESUME // 16
    assert (rec.hit_tokens, rec.device_hit_tokens, rec.host_hit_tokens, rec.l3_hit_tokens) == (RESUME, 0, 0, RESUME)
    assert_exact(report, checked=COMPUTED)
    cache.close()


def test_resume_from_another_caches_l3_is_exact(tmp_path):
    """A second cache (another engine instance) resumes from pages and a snapshot the
    first one stored in a file:// L3: nothing in its own tiers."""
    url = f"file://{tmp_path}/l3"
    first = small_cache(storage=url)
    assert_exact(serve(first, [request(0, A_PROMPT, A_OUT, conv="a")]), checked=100)
    first.close()  # drains: every put has landed
    second = small_cache(storage=url)
    report = serve(second, [request(1, A2_PROMPT, A2_OUT, conv="a", turn=1)])
    assert report.records[0].l3_hit_tokens == RESUME
    assert_exact(report, checked=COMPUTED)
    second.close()


def test_turns_of_a_synthetic_conversation_each_resume_exactly():
    """Four turns of one conversation back to back: each resumes at the previous turn's
    finish boundary (the deepest page boundary of its prompt + answer)."""
    from hicache.engine.tiny_serving import tiny_workload

    reqs = tiny_workload(1, 3, turns=(4, 4), arrival_rate=None, think_time_s=0.0)
    cache = small_cache(device_pages=32, host_pages=48)
    report = serve(cache, reqs)
    for prev, rec in zip(reqs, report.records[1:]):
        assert rec.hit_tokens == (prev.prompt_len + prev.output_len) // 16 * 16
        assert rec.device_hit_tokens == rec.hit_tokens
    computed = sum(r.prompt_len + r.output_len for r in reqs) - sum(r.hit_tokens for r in report.records)
    assert_exact(report, checked=computed)
    cache.close()
