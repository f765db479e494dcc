"""hicache as the secondary tier of vLLM's own offloading stack, end to end in vLLM's real
CPU engine: ``OffloadingConnector`` -> ``TieringOffloadingSpec`` (its CPU-backend test
variant, :mod:`.cpu_offload_spec`: only the block copies and their streams and events are
host stand-ins) -> CPU primary tier in /dev/shm -> ``HiCacheSecondaryTier`` on a
``memory://`` store, serving the tiny random-weight Llama with greedy sampling.

* after ``reset_prefix_cache(reset_connector=True)`` vLLM's prefix cache and the primary
  tier are empty, hicache's tier is not: the second pass is promoted from hicache into the
  primary tier and loaded from there, ``num_cached_tokens`` > 0, hicache reports lookup
  hits and loaded chunks, and the outputs equal an engine without a connector;
* the model reads what was loaded: zeroing the loaded bytes changes the outputs.
"""

from __future__ import annotations

import contextlib
import ctypes
import gc
import os
import random
import uuid

import pytest

from .cpu_offload_spec import SPEC_CONFIG
from .tiny_llama import VOCAB, make_tiny_llama

pytestmark = pytest.mark.filterwarnings("ignore")
LENGTHS = (300, 700, 1100)      # CPU blocks are 128 tokens: 2, 5 and 8 whole blocks to reuse
MAX_TOKENS = 8
SPEC = SPEC_CONFIG


def start(model, url: str | None):
    """An in-process engine; ``url``: None (no connector) or hicache's tier store."""
    from vllm import LLM
    from vllm.config import KVTransferConfig

    from hicache.integrations.vllm import tier_config

    os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"   # read when an engine starts: in-process
    os.environ["VLLM_CPU_KVCACHE_SPACE"] = "1"
    kw = {}
    if url is not None:
        kw["kv_transfer_config"] = KVTransferConfig(
            kv_connector="OffloadingConnector", kv_role="kv_both",
            kv_connector_extra_config={**SPEC, "cpu_bytes_to_use": 64 << 20,
                                       "secondary_tiers": [tier_config(url)]})
    return LLM(model=str(model), enforce_eager=True, enable_prefix_caching=True, max_model_len=2048,
               dtype="bfloat16", seed=0, **kw)


def generate(llm, prompts):
    from vllm import SamplingParams

    out = llm.generate([{"prompt_token_ids": p} for p in prompts],
                       SamplingParams(temperature=0, max_tokens=MAX_TOKENS), use_tqdm=False)
    return [list(o.outputs[0].token_ids) for o in out], [o.num_cached_tokens for o in out]


def stop(llm) -> None:
    llm.llm_engine.engine_core.shutdown()
    del llm
    gc.collect()


def hicache_tier(llm):
    """The scheduler side's ``HiCacheSecondaryTier`` (the engine core runs in-process)."""
    from hicache.integrations.vllm.tier import HiCacheSecondaryTier

    connector = llm.llm_engine.engine_core.engine_core.scheduler.connector
    (tier,) = connector.connector_scheduler.manager.secondary_tiers
    assert isinstance(tier, HiCacheSecondaryTier)
    return tier


def settle(llm, tier) -> None:
    """Let the tier finish its cascade stores, then forget everything but hicache: vLLM's
    prefix cache and (``reset_connector``) the primary tier."""
    tier.drain_jobs()
    assert llm.reset_prefix_cache(reset_connector=True)


@contextlib.contextmanager
def zeroed_loads():
    """The worker's loads into the engine's KV cache, each followed by zeroing what it
    wrote (stores untouched)."""
    from vllm.distributed.kv_transfer import get_kv_transfer_group

    handler = get_kv_transfer_group().connector_worker.worker._load_handler
    real = handler._swap_blocks_batch

    def zeroing(src, dst, sizes, **kw):
        real(src, dst, sizes, **kw)
        for d, n in zip(dst.tolist(), sizes.tolist()):
            ctypes.memset(d, 0, n)

    handler._swap_blocks_batch = zeroing
    try:
        yield
    finally:
        handler._swap_blocks_batch = real


@pytest.fixture(scope="module")
def engine_env(tmp_path_factory):
    model = make_tiny_llama(tmp_path_factory.mktemp("model") / "tiny-llama")
    rng = random.Random(11)
    prompts = [[rng.randrange(3, VOCAB) for _ in range(n)] for n in LENGTHS]
    llm = start(model, None)
    reference, _ = generate(llm, prompts)
    stop(llm)
    return model, prompts, reference


@pytest.fixture(scope="module")
def offloading_llm(engine_env):
    """One engine for both tests (engines are the slow part); pass 1 already run."""
    model, prompts, reference = engine_env
    llm = start(model, f"memory://vllm-offload-{uuid.uuid4().hex[:8]}")
    outs, cached = generate(llm, prompts)
    assert outs == reference and cached == [0, 0, 0]
    yield llm
    stop(llm)


def test_second_pass_is_served_from_hicache(engine_env, offloading_llm):
    _, prompts, reference = engine_env
    llm = offloading_llm
    tier = hicache_tier(llm)
    settle(llm, tier)
    stored = tier.stats()["stored_chunks"]
    assert stored >= sum(n // 128 for n in LENGTHS), tier.stats()
    outs, cached = generate(llm, prompts)
    assert outs == reference
    assert cached == [(n - 1) // 128 * 128 for n in LENGTHS], cached
    s = tier.stats()
    assert s["lookup_hits"] > 0 and s["loads"] > 0 and s["loaded_chunks"] >= sum(cached) // 128, s
    assert s["load_failures"] == 0 and s["store_failures"] == 0, s


def test_the_model_reads_what_was_loaded(engine_env, offloading_llm):
    _, prompts, reference = engine_env
    llm = offloading_llm
    tier = hicache_tier(llm)
    settle(llm, tier)
    loaded = tier.stats()["loaded_chunks"]
    with zeroed_loads():
        outs, cached = generate(llm, prompts)
    assert sum(cached) > 0 and tier.stats()["loaded_chunks"] > loaded, (cached, tier.stats())
    assert outs != reference, outs
