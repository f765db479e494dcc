"""hicache as a vLLM secondary tier, in the style of vLLM's own tiering tests
(tests/v1/kv_offload/tiering/test_tiering_offloading.py), but with vLLM's real manager,
primary tier and factory, and an L3 store behind the tier (memory:// and redis-server)."""

from __future__ import annotations

import threading
from unittest.mock import MagicMock

import numpy as np
import pytest
from vllm.v1.kv_offload.base import LookupResult, ReqContext
from vllm.v1.kv_offload.tiering.base import SecondaryTierManager

from hicache.integrations.vllm.tier import HiCacheSecondaryTier

from .harness import keys, lookup_until, make_manager, payload, primary_bytes, settle, step, store

CTX = ReqContext(req_id="writer")


def _tier(manager) -> HiCacheSecondaryTier:
    (tier,) = manager.secondary_tiers
    assert isinstance(tier, HiCacheSecondaryTier) and isinstance(tier, SecondaryTierManager)
    return tier


def _l3_bytes(tier, key) -> np.ndarray | None:
    """Read one chunk back from L3 the way any other engine would (verified object)."""
    hash_, group = key[:-4], int.from_bytes(key[-4:], "big")
    store_ = tier.stores(group)
    out = np.zeros(tier.block_size_bytes, np.uint8)
    return out if store_.get([hash_], "page", [out]).hits == 1 else None


def test_cascade_store_writes_every_chunk_to_l3(l3_url):
    m = make_manager(l3_url)
    tier = _tier(m)
    tier.submit_store = MagicMock(wraps=tier.submit_store)
    ks = keys(range(3))
    m.on_new_request(CTX)
    store(m, ks, CTX)
    tier.submit_store.assert_called_once()
    job = tier.submit_store.call_args.args[0]
    assert list(job.keys) == ks and not job.is_promotion
    for k in ks:  # pinned in the primary tier while the cascade runs
        assert m.primary_tier._policy.get(k).ref_cnt == 1
    settle(m)
    for k in ks:
        assert m.primary_tier._policy.get(k).ref_cnt == 0
        assert np.array_equal(_l3_bytes(tier, k), payload(k))
    assert tier.stats()["stored_chunks"] == 3 and tier.stats()["store_failures"] == 0
    # Stored by this process: the tier answers HIT without asking L3.
    assert [tier.lookup(k, CTX) for k in ks] == [LookupResult.HIT] * 3
    # Storing the same chunks again writes nothing new (L3 already holds them).
    tier.submit_store(type(job)(job_id=999, keys=ks, chunk_ids=job.chunk_ids, is_promotion=False,
                                req_context=CTX))
    tier.drain_jobs()
    (done,) = tier.get_finished_jobs()
    assert done.job_id == 999 and done.success and tier.stats()["skipped_chunks"] == 3
    m.shutdown()


def test_load_back_into_a_fresh_engine(l3_url):
    writer = make_manager(l3_url)
    ks = keys(range(4))
    writer.on_new_request(CTX)
    store(writer, ks, CTX)
    settle(writer)
    reader = make_manager(l3_url)   # another engine (or a restart): empty primary tier
    writer.shutdown()               # (memory://NAME lives while one engine has it open)
    tier = _tier(reader)
    tier.submit_load = MagicMock(wraps=tier.submit_load)
    ctx = ReqContext(req_id="reader")
    reader.on_new_request(ctx)
    assert reader.lookup(ks[0], ctx) is LookupResult.RETRY   # L3 is asked off-thread first
    assert lookup_until(reader, ks, ctx) == [LookupResult.HIT_PENDING] * 4
    tier.submit_load.assert_not_called()                      # batched at the end of the step
    step(reader)
    tier.submit_load.assert_called_once()
    job = tier.submit_load.call_args.args[0]
    assert list(job.keys) == ks and job.is_promotion and job.req_context is ctx
    settle(reader)
    assert [reader.lookup(k, ctx) for k in ks] == [LookupResult.HIT] * 4
    for k in ks:
        assert np.array_equal(primary_bytes(reader, k), payload(k))
    assert tier.stats()["loaded_chunks"] == 4 and tier.stats()["load_failures"] == 0
    reader.shutdown()


def test_failed_load_keeps_the_verified_prefix_and_stops_promoting(l3_url):
    writer = make_manager(l3_url)
    ks = keys(range(3))
    writer.on_new_request(CTX)
    store(writer, ks, CTX)
    settle(writer)
    wtier = _tier(writer)
    # The middle chunk gets damaged in L3 (a bit flip) after the reader saw it exist.
    hash1 = ks[1][:-4]
    store1 = wtier.stores(0)
    raw = bytearray(64 + 4096)
    assert store1.backend.get_into([store1.key(hash1, "page")], [raw]) == [64 + 4096]
    raw[-1] ^= 0xFF

    reader = make_manager(l3_url)
    tier = _tier(reader)
    ctx = ReqContext(req_id="reader")
    reader.on_new_request(ctx)
    assert lookup_until(reader, ks, ctx) == [LookupResult.HIT_PENDING] * 3
    assert store1.backend.put([store1.key(hash1, "page")], [bytes(raw)]) == [True]
    settle(reader)
    # Chunk 0 loaded and verified; chunk 1 failed its checksum, chunk 2 came after it.
    assert reader.primary_tier.lookup(ks[0], ctx) is LookupResult.HIT
    assert np.array_equal(primary_bytes(reader, ks[0]), payload(ks[0]))
    assert [reader.primary_tier.lookup(k, ctx) for k in ks[1:]] == [LookupResult.MISS] * 2
    # The tier now answers MISS for the failed chunks: the scheduler recomputes them
    # instead of promoting them again (no livelock).
    assert [reader.lookup(k, ctx) for k in ks[1:]] == [LookupResult.MISS] * 2
    st = tier.stats()
    assert st["load_failures"] == 1 and st["failed_chunks"] == 2 and st["loaded_chunks"] == 1
    (l3,) = tier.l3_stats()
    assert l3["rejected"] == {"corrupt": 1}
    reader.shutdown()
    writer.shutdown()


def _hold_puts(tier) -> threading.Event:
    """Make the tier's L3 writes wait until the returned event is set."""
    gate = threading.Event()
    backend = tier.stores.backend
    real_put = backend.put
    backend.put = lambda ks_, vs: (gate.wait(10), real_put(ks_, vs))[1]
    return gate


def test_retry_while_the_store_is_in_flight(l3_url):
    m = make_manager(l3_url)
    tier = _tier(m)
    gate = _hold_puts(tier)
    ks = keys(range(2))
    m.on_new_request(CTX)
    store(m, ks, CTX)
    assert [tier.lookup(k, CTX) for k in ks] == [LookupResult.RETRY] * 2
    assert m.has_pending_work()
    step(m)
    assert [tier.lookup(k, CTX) for k in ks] == [LookupResult.RETRY] * 2  # still held at the gate
    gate.set()
    settle(m)
    assert [tier.lookup(k, CTX) for k in ks] == [LookupResult.HIT] * 2
    m.shutdown()


def test_reset_cache_drains_transfers_in_flight(l3_url):
    m = make_manager(l3_url)
    tier = _tier(m)
    gate = _hold_puts(tier)
    ks = keys(range(3))
    m.on_new_request(CTX)
    store(m, ks, CTX)
    threading.Timer(0.2, gate.set).start()
    m.reset_cache()                      # calls drain_jobs(): waits for the gated store
    assert not tier.runner.in_flight and not m._jobs
    assert all(np.array_equal(_l3_bytes(tier, k), payload(k)) for k in ks)
    m.shutdown()


def test_groups_are_separate_namespaces(l3_url):
    m = make_manager(l3_url, groups=2)
    tier = _tier(m)
    same = keys(range(2), group=0) + keys(range(2), group=1)   # same block hashes, two groups
    m.on_new_request(CTX)
    store(m, same, CTX)
    settle(m)
    s0, s1 = tier.stores(0), tier.stores(1)
    assert s0.namespace != s1.namespace and s0.breaker is s1.breaker
    for k in same:
        assert np.array_equal(_l3_bytes(tier, k), payload(k))
    assert not np.array_equal(payload(same[0]), payload(same[2]))
    reader = make_manager(l3_url, groups=2)
    ctx = ReqContext(req_id="reader")
    reader.on_new_request(ctx)
    assert lookup_until(reader, same, ctx) == [LookupResult.HIT_PENDING] * 4
    settle(reader)
    for k in same:
        assert np.array_equal(primary_bytes(reader, k), payload(k))
    reader.shutdown()
    m.shutdown()


def test_unreachable_redis_is_misses_and_failed_jobs_never_exceptions():
    from tests.redis_server import free_port

    url = f"redis://127.0.0.1:{free_port()}/0?connect_timeout=0.2&timeout=0.2"
    m = make_manager(url, l3={"breaker_threshold": 2})
    tier = _tier(m)
    ks = keys(range(3))
    m.on_new_request(CTX)
    store(m, ks, CTX)
    settle(m)
    assert tier.stats()["store_failures"] == 1
    # The primary tier still serves what it holds; an unknown chunk is a plain miss.
    assert [m.lookup(k, CTX) for k in ks] == [LookupResult.HIT] * 3
    assert lookup_until(m, keys([99]), CTX) == [LookupResult.MISS]
    (l3,) = tier.l3_stats()
    assert l3["breaker"]["state"] == "open" and l3["faults"].get("connection", 0) >= 1
    m.shutdown()


def test_bad_tier_config_is_a_config_error():
    from hicache.errors import ConfigError

    with pytest.raises(ConfigError, match="threads"):
        make_manager("memory://", threads=0)
    with pytest.raises(ConfigError, match="l3"):
        make_manager("memory://", l3={"no_such_field": 1})
    with pytest.raises(ConfigError, match="storage_url"):
        make_manager("nosuch://x")


def test_tier_metrics_drop_into_a_registry(l3_url):
    prom = pytest.importorskip("prometheus_client")
    from prometheus_client.parser import text_string_to_metric_families

    from hicache.cache.metrics import PrometheusExporter

    m = make_manager(l3_url, groups=2)
    tier = _tier(m)
    registry = prom.CollectorRegistry()
    exporter = PrometheusExporter(tier, registry=registry, labels={"model_name": "test/tiny-model", "rank": "0"})
    ks = keys(range(2), group=0) + keys(range(2), group=1)
    m.on_new_request(CTX)
    store(m, ks, CTX)
    settle(m)
    exporter.update()
    got = {(s.name, tuple(sorted(s.labels.items()))): s.value
           for f in text_string_to_metric_families(prom.generate_latest(registry).decode()) for s in f.samples}
    lab = (("model_name", "test/tiny-model"), ("rank", "0"))
    assert got[("hicache_stored_chunks_total", lab)] == 4
    assert got[("hicache_stores_total", lab)] == 1
    # one put per group store, summed over the two groups' stores
    assert got[("hicache_l3_latency_seconds_count", tuple(sorted(lab + (("op", "put"),))))] == 2
    assert got[("hicache_l3_breaker_state", tuple(sorted(lab + (("state", "closed"),))))] == 1.0
    m.shutdown()


def test_metrics_port_serves_the_tier_metrics():
    pytest.importorskip("prometheus_client")
    import urllib.request

    from tests.redis_server import free_port

    port = free_port()
    m = make_manager("memory://", metrics_port=port)
    m.on_new_request(CTX)
    store(m, keys(range(3)), CTX)
    settle(m)
    _tier(m)._exported_at = 0.0   # the next step refreshes the copy
    step(m)
    text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10).read().decode()
    assert 'hicache_stored_chunks_total{model_name="test/tiny-model",rank="0"} 3.0' in text
    assert 'hicache_l3_latency_seconds_count{model_name="test/tiny-model",op="put",rank="0"}' in text
    m.shutdown()


def _salted_keys(prompt: list[int], salt: str | None, group: int = 0) -> list:
    """The offload keys vLLM makes for a request with ``cache_salt=salt``: its own block
    hasher folds the salt into the first block's hash, so every later hash differs too."""
    from vllm.sampling_params import SamplingParams
    from vllm.utils.hashing import sha256
    from vllm.v1.core.kv_cache_utils import get_request_block_hasher, init_none_hash
    from vllm.v1.kv_offload.base import make_offload_key
    from vllm.v1.request import Request

    init_none_hash(sha256)
    req = Request(f"r-{salt}", prompt, SamplingParams(max_tokens=1), None, cache_salt=salt,
                  block_hasher=get_request_block_hasher(16, sha256))
    return [make_offload_key(h, group) for h in req.block_hashes]


def test_cache_salt_keeps_tenants_apart_in_l3(l3_url):
    """vLLM passes no salt to a tier: its ``cache_salt`` is already in the block hashes the
    keys carry. So chunks one tenant stored are a MISS for a tenant with another salt (or
    none) on another engine, and a HIT for the same salt."""
    prompt = list(range(48))
    alice, bob, shared = (_salted_keys(prompt, s) for s in ("alice", "bob", None))
    assert len(alice) == 3 and not set(alice) & set(bob) and not set(alice) & set(shared)
    writer = make_manager(l3_url)
    writer.on_new_request(CTX)
    store(writer, alice, CTX)
    settle(writer)
    reader = make_manager(l3_url)
    writer.shutdown()
    ctx = ReqContext(req_id="bob")
    reader.on_new_request(ctx)
    assert lookup_until(reader, bob, ctx) == [LookupResult.MISS] * 3
    assert lookup_until(reader, shared, ctx) == [LookupResult.MISS] * 3
    assert lookup_until(reader, alice, ctx) == [LookupResult.HIT_PENDING] * 3
    reader.shutdown()
