"""``HiCacheConnector`` inside vLLM's real CPU engine, serving a tiny random-weight GQA Llama
(made here, no hub) in-process with greedy sampling.

* within one engine: after vLLM's ``reset_prefix_cache`` the prefix comes from hicache's
  pools, the outputs equal an engine without a connector, ``num_cached_tokens`` > 0;
* across engines: a second engine on the same ``file://`` store loads the prefix from L3
  (hicache's L3 hit counter > 0), same outputs;
* the model reads what hicache loaded: zeroing the loaded blocks changes the outputs;
* a damaged store: hicache rejects the damaged objects, vLLM recomputes, same outputs.
"""

from __future__ import annotations

import contextlib
import gc
import os
import random
from pathlib import Path

import pytest

from .tiny_llama import VOCAB, make_tiny_llama

pytestmark = pytest.mark.filterwarnings("ignore")
LENGTHS = (300, 700, 1100)      # CPU blocks are 128 tokens: 2, 5 and 8 whole blocks to reuse
MAX_TOKENS = 8


@pytest.fixture(scope="module")
def engine_env(tmp_path_factory):
    model = make_tiny_llama(tmp_path_factory.mktemp("model") / "tiny-llama")
    rng = random.Random(7)
    prompts = [[rng.randrange(3, VOCAB) for _ in range(n)] for n in LENGTHS]
    return model, prompts


EXTRA = {"device_bytes": "16MiB", "host_bytes": "64MiB", "host_reserve_bytes": "256MiB",
         "write_policy": "write_through", "prefetch_policy": "wait_complete"}


def start(model: Path, store: Path | str | None, engine: dict | None = None, **extra):
    """An in-process engine; ``store``: None (no connector), a directory (``file://``) or a URL;
    ``engine``: more ``LLM`` arguments; ``extra``: more connector keys."""
    from vllm import LLM
    from vllm.config import KVTransferConfig

    os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"   # read when an engine starts: in-process
    os.environ["VLLM_CPU_KVCACHE_SPACE"] = "1"
    kw = {}
    if store is not None:
        kw["kv_transfer_config"] = KVTransferConfig(
            kv_connector="HiCacheConnector", kv_connector_module_path="hicache.integrations.vllm.connector",
            kv_role="kv_both", kv_load_failure_policy="recompute",
            kv_connector_extra_config={**EXTRA, "storage_url": store if isinstance(store, str) else f"file://{store}",
                                       **extra})
    return LLM(model=str(model), enforce_eager=True, enable_prefix_caching=True, max_model_len=2048,
               dtype="bfloat16", seed=0, **kw, **(engine or {}))


def generate(llm, prompts):
    from vllm import SamplingParams

    out = llm.generate([{"prompt_token_ids": p} for p in prompts],
                       SamplingParams(temperature=0, max_tokens=MAX_TOKENS), use_tqdm=False)
    return [list(o.outputs[0].token_ids) for o in out], [o.num_cached_tokens for o in out]


def bridge(llm):
    from hicache.integrations.vllm.connector import bridge_for

    b = bridge_for(llm.llm_engine.vllm_config.kv_transfer_config.engine_id)
    assert b is not None
    return b


def stop(llm) -> None:
    """Shut the engine down (the connector drains hicache: its L3 puts finish)."""
    llm.llm_engine.engine_core.shutdown()
    del llm
    gc.collect()


@pytest.fixture(scope="module")
def reference(engine_env):
    model, prompts = engine_env
    llm = start(model, None)
    outs, _ = generate(llm, prompts)
    again, cached = generate(llm, prompts)     # vLLM's own prefix cache: same greedy tokens
    assert again == outs and all(c > 0 for c in cached)
    stop(llm)
    return outs


@pytest.fixture(scope="module")
def store(engine_env, reference, tmp_path_factory):
    """A store written by one engine: the first test's engine fills it, later ones read it."""
    return tmp_path_factory.mktemp("store")


def test_one_engine_resumes_from_hicache_after_reset_prefix_cache(engine_env, reference, store):
    model, prompts = engine_env
    llm = start(model, store)
    b = bridge(llm)
    outs, cached = generate(llm, prompts)
    assert outs == reference and cached == [0, 0, 0]
    assert b.counters["published_pages"] >= sum(n // 128 for n in LENGTHS)
    assert llm.reset_prefix_cache()            # vLLM forgets; hicache keeps
    outs, cached = generate(llm, prompts)
    assert outs == reference
    assert cached == [(n - 1) // 128 * 128 for n in LENGTHS], cached
    s = b.stats()
    assert s["loaded_tokens"] == sum(cached) and s["cache_hit_tokens"] > 0 and s["load_failed_tokens"] == 0
    stop(llm)
    assert len([p for p in store.rglob("*") if p.is_file()]) >= sum(n // 128 for n in LENGTHS)


def test_second_engine_loads_from_the_shared_store(engine_env, reference, store):
    model, prompts = engine_env
    llm = start(model, store)
    b = bridge(llm)
    outs, cached = generate(llm, prompts)
    assert outs == reference
    assert cached == [(n - 1) // 128 * 128 for n in LENGTHS], cached
    s = b.stats()
    assert s["cache_l3_hit_tokens"] == sum(cached) and s["loaded_tokens"] == sum(cached), s

    # The model reads what hicache loaded: zero the loaded blocks after the copy.
    assert llm.reset_prefix_cache()
    with zeroed_loads():
        bad, cached = generate(llm, prompts)
    assert sum(cached) > 0 and bad != reference, (cached, bad)
    stop(llm)


@contextlib.contextmanager
def zeroed_loads():
    """The worker's copies into vLLM's blocks, each followed by zeroing those blocks."""
    import torch
    from vllm.distributed.kv_transfer import get_kv_transfer_group

    copier = get_kv_transfer_group()._copier
    real_load = copier.load

    def zeroing_load(layer, pages, blocks):
        real_load(layer, pages, blocks)
        if blocks:
            copier.rows[layer].index_fill_(0, torch.tensor(list(blocks)), 0)

    copier.load = zeroing_load
    try:
        yield
    finally:
        copier.load = real_load


def test_damaged_store_falls_back_to_recompute(engine_env, reference, store):
    files = sorted(p for p in store.rglob("*") if p.is_file())
    assert files
    for f in files[::2]:                        # every other object: one byte of its payload
        data = bytearray(f.read_bytes())
        data[len(data) // 2] ^= 0xFF
        f.write_bytes(bytes(data))
    model, prompts = engine_env
    llm = start(model, store)
    b = bridge(llm)
    outs, cached = generate(llm, prompts)
    assert outs == reference
    s = b.stats()
    assert s["l3_rejected"] > 0, s
    assert s["load_failed_tokens"] == 0 and s["loaded_tokens"] == sum(cached) < sum((n - 1) // 128 * 128
                                                                                   for n in LENGTHS), (s, cached)
    stop(llm)


def test_store_killed_midway_the_engine_keeps_serving(engine_env, reference):
    """Redis dies after the first pass: hicache's host pool still serves the second pass
    (identical outputs), its L3 calls fail behind the breaker, no exception reaches vLLM;
    a fresh engine on the dead store computes everything, same outputs."""
    from tests.redis_server import REDIS_SERVER, SKIP_REASON, RedisServer

    if REDIS_SERVER is None:
        pytest.skip(SKIP_REASON)
    model, prompts = engine_env
    server = RedisServer()
    try:
        url = server.url
        llm = start(model, url)
        b = bridge(llm)
        assert generate(llm, prompts)[0] == reference
        server.kill()
        assert llm.reset_prefix_cache()
        outs, cached = generate(llm, prompts)
        assert outs == reference and sum(cached) > 0          # from hicache's host pool
        fresh = [t + 1 for t in prompts[2]]                    # a prefix L3 is asked about, and written
        assert len(generate(llm, [fresh])[0][0]) == MAX_TOKENS
        b.cache.drain()
        assert b.stats()["l3_errors"] > 0, b.stats()
        stop(llm)
        llm = start(model, url)
        outs, cached = generate(llm, prompts)
        assert outs == reference and cached == [0, 0, 0]
        stop(llm)
    finally:
        server.close()



def test_concurrent_requests_chunked_prefill_and_a_small_kv_budget(engine_env):
    """Six requests sharing a 400-token prefix, at most four running, prefilled in 256-token
    chunks (pages published mid-prefill), 24 KV blocks: after ``reset_prefix_cache`` the
    prefixes come from hicache and the outputs equal the same engine without a connector."""
    model, _ = engine_env
    cached, s = concurrent_resume(model, blocks=24, url="memory://vllm-concurrent")
    assert all(c >= 384 for c in cached), cached
    assert s["loaded_tokens"] > 0 and s["save_failures"] == 0 and s["load_failed_tokens"] == 0, s


def concurrent_resume(model, *, blocks: int, url: str) -> tuple[list[int], dict]:
    """Six requests sharing a 400-token prefix, at most four running, 256-token chunks,
    ``blocks`` KV blocks: served by vLLM alone, then with the connector on ``url`` twice
    (``reset_prefix_cache`` between); every output equal to vLLM alone's. Returns the second
    pass's ``num_cached_tokens`` and the bridge's stats."""
    rng = random.Random(3)
    base = [rng.randrange(3, VOCAB) for _ in range(400)]
    prompts = [base + [rng.randrange(3, VOCAB) for _ in range(n)] for n in (300, 350, 420, 500, 280, 330)]
    small = {"num_gpu_blocks_override": blocks, "max_num_batched_tokens": 256, "max_num_seqs": 4}
    ref = start(model, None, small)
    expected, _ = generate(ref, prompts)
    stop(ref)
    llm = start(model, url, small)
    b = bridge(llm)
    outs, _ = generate(llm, prompts)
    assert outs == expected
    assert llm.reset_prefix_cache()
    outs, cached = generate(llm, prompts)
    assert outs == expected, cached
    s = b.stats()
    stop(llm)
    return cached, s


def test_prometheus_series_through_vllms_connector_metrics():
    # vLLM's own KVConnectorProm resolves the connector class from the transfer config,
    # asks it for its metrics and feeds it the interval's stats; the series land in
    # prometheus_client's registry under vLLM's per-engine labels.
    from types import SimpleNamespace

    import prometheus_client
    from vllm.config import KVTransferConfig
    from vllm.distributed.kv_transfer.kv_connector.v1.metrics import KVConnectorProm

    from hicache.integrations.vllm.connector import PROM_COUNTERS, HiCacheConnector

    ktc = KVTransferConfig(kv_connector="HiCacheConnector", kv_role="kv_both",
                           kv_connector_module_path="hicache.integrations.vllm.connector")
    prom = KVConnectorProm(SimpleNamespace(kv_transfer_config=ktc), ["model_name", "engine"],
                           {0: ["tiny", "0"], 1: ["tiny", "1"]})
    assert prom.prom_metrics is not None and set(prom.prom_metrics.counters) == set(PROM_COUNTERS)
    stats = HiCacheConnector.build_kv_connector_stats({"loaded_tokens": 256, "lookups": 3, "hit_rate": 0})
    prom.observe(stats.data, engine_idx=1)
    prom.observe({"loaded_tokens": 128}, engine_idx=1)
    value = prometheus_client.REGISTRY.get_sample_value
    assert value("vllm:hicache_loaded_tokens_total", {"model_name": "tiny", "engine": "1"}) == 384
    assert value("vllm:hicache_lookups_total", {"model_name": "tiny", "engine": "1"}) == 3
    assert value("vllm:hicache_loaded_tokens_total", {"model_name": "tiny", "engine": "0"}) == 0
