"""Concurrent requests sharing a prefix: mid-flight reuse and duplicate pages, exact."""

from __future__ import annotations

import numpy as np
import pytest

from tests.engine.tiny_replay.conftest import assert_exact, request, serve, small_cache, toks

BASE = toks(31, 200)


@pytest.mark.parametrize("retention", [None, 0])
def test_a_sibling_resumes_from_pages_published_mid_prefill(retention):
    """``a`` prefills 200 tokens, two pages a step, publishing each chunk. ``b`` shares
    its first 150 tokens and arrives at step 3, when ``a`` has published 96 tokens and is
    still prefilling: ``b`` borrows those pages and ``a``'s newest snapshot (provisional
    under retention 0) and resumes at 96 while ``a`` runs on."""
    cache = small_cache(device_pages=32, device_snapshots=8, host_pages=48, retention=retention)
    a = request(0, BASE, toks(32, 10))
    b = request(1, np.concatenate([BASE[:150], toks(33, 40)]), toks(34, 10), arrival=2.5)
    report = serve(cache, [a, b], chunk_pages=2)
    ra, rb = report.records
    assert rb.admit_step == 3 and ra.finish_step > rb.admit_step   # a was still running
    assert (rb.hit_tokens, rb.device_hit_tokens) == (96, 96)
    assert rb.verified_pages == 96 // 16 + 1
    assert_exact(report, checked=210 + (200 - 96))
    cache.close()


def test_two_requests_computing_the_same_prefix_at_once():
    """Admitted in the same step, both compute the shared pages; the second to publish
    gets its copies freed and its page table repointed to the first's (bit-identical)
    pages, and keeps computing through them."""
    cache = small_cache(device_pages=32, device_snapshots=8, host_pages=48)
    a = request(0, np.concatenate([BASE[:100], toks(35, 30)]), toks(36, 20))
    b = request(1, np.concatenate([BASE[:100], toks(37, 50)]), toks(38, 20))
    report = serve(cache, [a, b], chunk_pages=2)
    assert [r.hit_tokens for r in report.records] == [0, 0]
    assert cache.stats()["duplicate_pages"] == 6          # pages 0..5 of the shared 100 tokens
    assert_exact(report, checked=150 + 170)
    cache.close()


def test_a_fork_snapshot_is_exact_and_later_siblings_resume_at_it():
    """``a`` (70-token prompt) keeps snapshots at 32, 64 and its finish. ``b`` shares its
    first 48 tokens and goes on elsewhere: its first chunk stops at the fork (48, a
    Boundary.BRANCH snapshot of real model state, not a chunk boundary of ``a``). ``c``,
    sharing the same 48 tokens, resumes there -- at 32 without the fork -- and every logit
    it computes matches the no-cache recompute."""
    cache = small_cache(device_pages=32, device_snapshots=8, host_pages=48)
    shared = BASE[:48]
    a = request(0, np.concatenate([shared, toks(41, 22)]), toks(42, 8))
    b = request(1, np.concatenate([shared, toks(43, 30)]), toks(44, 8), arrival=10.0)
    c = request(2, np.concatenate([shared, toks(45, 30)]), toks(46, 8), arrival=20.0)
    report = serve(cache, [a, b, c], chunk_pages=2)
    assert [r.hit_tokens for r in report.records] == [0, 32, 48]
    assert_exact(report)
    cache.close()
