"""The router between the cache's parts (hicache/cache/routing.py) and the lookup count."""

from __future__ import annotations

import pytest
import torch

from hicache.cache.results import LookupCounters
from hicache.transfer import Ack
from tests.cache.conftest import make_cache


def test_an_ack_of_a_copy_the_cache_never_submitted_is_an_invariant_failure():
    cache = make_cache()
    stray = Ack(tag="not-a-record", kind="load", direction="h2d", source="page",
                src_ids=torch.zeros(1, dtype=torch.int64), dst_ids=torch.zeros(1, dtype=torch.int64), ok=True, error=None, seq=0)
    with pytest.raises(AssertionError, match="never submitted: 'not-a-record'"):
        cache._router.apply(stray)
    cache.check_integrity()


def test_a_lookup_counts_device_host_and_l3_tokens_apart():
    c = LookupCounters()
    c.count(100, 64, 24, 8, loaded=True)
    c.count(50, 16, 0, 0, loaded=False)
    assert (c.matches, c.match_tokens, c.hit_tokens, c.loads) == (2, 150, 80, 1)
    assert (c.device_hit_tokens, c.host_hit_tokens, c.l3_hit_tokens) == (40 + 16, 16, 8)
