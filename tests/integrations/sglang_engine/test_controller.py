"""SGLang's own HiCache controller with hicache as its L3 (``--hicache-storage-backend dynamic``).

A producer cache writes a sequence through ``HiCacheStorageBackend``; a fresh consumer
cache prefetches it back and loads it to its device pool; every layer's K and V must come
back byte for byte. Run in the SGLang venv (see ``tests/integrations/test_sglang_engine.py``).
"""

from __future__ import annotations

import os
import time

import pytest
from sglang.srt.mem_cache.unified_cache.components.base import ComponentType
from sglang.test.kits.unified_radix_cache.config import CacheConfig
from sglang.test.kits.unified_radix_cache.fixtures import match_prefix

from tests.integrations.sglang_engine.conftest import HICACHE_BACKEND
from tests.integrations.sglang_engine.scenario import load_back, prefetch, produce, same, side

FULL = CacheConfig(page_size=4, kv_size=256)
SEQ = list(range(1, 1 + 8 * FULL.page_size))  # 8 pages


def urls(request, tmp_path):
    kind = request.param
    if kind == "memory":
        return f"memory://{request.node.name}"
    if kind == "file":
        return f"file://{tmp_path}/l3"
    fixture = "redis_server" if kind == "redis" else "redis_cluster"
    return request.getfixturevalue(fixture).url


@pytest.fixture(params=["memory", "file", "redis", "cluster"])
def url(request, tmp_path):
    return urls(request, tmp_path)


@pytest.mark.parametrize("producer_v1, consumer_v1", [(0, 0), (1, 1), (0, 1)],
                         ids=["legacy", "v1", "legacy-writes-v1-reads"])
def test_round_trip_through_l3(make_kit, request, url, producer_v1, consumer_v1, logged_errors):
    common = {**HICACHE_BACKEND, "url": url, "salt": request.node.name}
    prod = side(make_kit, FULL, "dynamic", {**common, "interface_v1": producer_v1})
    expected = produce(prod, SEQ, seed=1)
    assert prod.backend.hicache_stats()["kv"]["counters"]["put_ok"] == 8

    cons = side(make_kit, FULL, "dynamic", {**common, "interface_v1": consumer_v1})
    assert cons.cache.cache_controller.page_get_func.__name__ == (
        "_page_get_zero_copy" if consumer_v1 else "_generic_page_get")
    assert prefetch(cons, SEQ, "r1") == len(SEQ)
    assert same(load_back(cons, SEQ), expected)
    st = cons.backend.hicache_stats()["kv"]
    assert st["counters"]["get_hits"] == 8 and not st["rejected"] and not st["faults"]
    # v1 reads land in the host pool's own K and V regions, no staging page
    assert cons.backend._slot("kv").zero_copy is (True if consumer_v1 else None)
    assert not logged_errors


SWA = CacheConfig(page_size=4, components=(ComponentType.FULL, ComponentType.SWA), sliding_window_size=8,
                  kv_size=512)
SWA_SEQ = list(range(1, 1 + 6 * SWA.page_size))  # 6 pages; the window is the last 2


def test_swa_hybrid_through_v2_matches_sglang_file_backend(make_kit, request, url, tmp_path, logged_errors):
    """Same writes to hicache and to SGLang's own ``file`` backend; both consumers must see
    the same hits and load the same bytes (FULL layers and the SWA window)."""
    ours = side(make_kit, SWA, "dynamic", {**HICACHE_BACKEND, "url": url, "salt": request.node.name,
                                          "interface_v1": 1})
    ref_dir = str(tmp_path / "sglang-file")
    ref = side(make_kit, SWA, "file", {}, storage_dir=ref_dir)
    window = SWA.sliding_window_size
    expected = produce(ours, SWA_SEQ, seed=7, swa_tokens=window)
    assert same(produce(ref, SWA_SEQ, seed=7, swa_tokens=window), expected)

    stats = ours.backend.hicache_stats()
    ref_files = os.listdir(ref_dir)
    assert stats["swa"]["counters"]["put_ok"] == sum(f.split("__")[0].endswith(".swa") for f in ref_files)
    assert stats["kv"]["counters"]["put_ok"] == sum(not f.split("__")[0].endswith(".swa") for f in ref_files)

    got = side(make_kit, SWA, "dynamic", {**HICACHE_BACKEND, "url": url, "salt": request.node.name,
                                         "interface_v1": 1})
    want = side(make_kit, SWA, "file", {}, storage_dir=ref_dir)
    assert prefetch(got, SWA_SEQ, "ours") == prefetch(want, SWA_SEQ, "ref") == len(SWA_SEQ)
    assert got.kit._swa_host_on_path(got.cache, SWA_SEQ) and want.kit._swa_host_on_path(want.cache, SWA_SEQ)
    assert (match_prefix(got.cache, SWA_SEQ).swa_host_hit_length
            == match_prefix(want.cache, SWA_SEQ).swa_host_hit_length > 0)
    ours_kv, ref_kv = load_back(got, SWA_SEQ, window), load_back(want, SWA_SEQ, window)
    assert same(ours_kv, ref_kv) and same(ours_kv, expected)
    st = got.backend.hicache_stats()
    assert st["swa"]["counters"]["get_hits"] >= window // SWA.page_size and not st["swa"]["rejected"]
    assert not logged_errors


def test_redis_killed_is_a_miss_and_sglang_keeps_serving(make_kit, redis_server, logged_errors):
    extra = {**HICACHE_BACKEND, "url": redis_server.url, "interface_v1": 1, "breaker_cooldown_s": 0.2,
             "breaker_max_cooldown_s": 0.2}
    prod = side(make_kit, FULL, "dynamic", extra)
    produce(prod, SEQ, seed=1)
    redis_server.kill()

    cons = side(make_kit, FULL, "dynamic", extra)
    assert prefetch(cons, SEQ, "after-kill") == 0          # a miss, not an exception
    # the cache keeps serving: a new prompt is computed, backed up to host, its L3 write fails
    seq2 = list(range(1000, 1000 + 4 * FULL.page_size))
    produce(cons, seq2, seed=2)
    m = match_prefix(cons.cache, seq2)
    assert m.device_prefix_len == len(seq2)
    assert cons.cache.tree_core.is_backuped(m.last_device_node)
    st = cons.backend.hicache_stats()["kv"]
    assert st["faults"].get("connection", 0) > 0 and st["breaker"]["trips"] >= 1
    assert st["counters"].get("put_ok", 0) == 0 and st["counters"].get("get_hits", 0) == 0

    # Redis back (empty: persistence is off): after the cooldown the breaker's probe closes it
    redis_server.start()
    time.sleep(0.3)
    seq3 = list(range(2000, 2000 + 4 * FULL.page_size))
    expected3 = produce(cons, seq3, seed=3)
    assert cons.backend.hicache_stats()["kv"]["breaker"]["state"] == "closed"
    fresh = side(make_kit, FULL, "dynamic", extra)
    assert prefetch(fresh, seq3, "after-restart") == len(seq3)
    assert same(load_back(fresh, seq3), expected3)
    assert not logged_errors


@pytest.mark.parametrize("url", ["memory", "redis"], indirect=True)
def test_layer_first_host_layout_moves_pages_as_pieces(make_kit, request, url, logged_errors):
    """``layer_first``: a page is one region per layer and K/V (48 here); v1 writes and reads
    them in place, and the object is the same bytes the legacy path stores."""
    common = {**HICACHE_BACKEND, "url": url, "salt": request.node.name}
    prod = side(make_kit, FULL, "dynamic", {**common, "interface_v1": 1}, mem_layout="layer_first")
    expected = produce(prod, SEQ, seed=5)
    slot = prod.backend._slot("kv")
    assert slot.zero_copy and len(slot.pieces(0)) == 2 * FULL.num_layers
    for v1 in (1, 0):
        cons = side(make_kit, FULL, "dynamic", {**common, "interface_v1": v1}, mem_layout="layer_first")
        assert prefetch(cons, SEQ, f"lf{v1}") == len(SEQ)
        assert same(load_back(cons, SEQ), expected)
    assert not logged_errors
