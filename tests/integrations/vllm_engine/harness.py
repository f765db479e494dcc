"""vLLM's real tiering stack on CPU: ``TieringOffloadingSpec`` -> ``TieringOffloadingManager``
with its CPU primary tier (a ``SharedOffloadRegion`` in /dev/shm) and our tier built by
vLLM's ``SecondaryTierFactory`` from a ``secondary_tiers`` entry. What a GPU worker would
copy into a primary row is written here by hand (:func:`fill`)."""

from __future__ import annotations

import os
import time
import uuid

import numpy as np
from vllm.v1.kv_offload.base import LookupResult, ReqContext, ScheduleEndContext, make_offload_key
from vllm.v1.kv_offload.config import (OffloadingCacheConfig, OffloadingConfig, OffloadingGroupConfig,
                                       OffloadingModelConfig, OffloadingParallelConfig)
from vllm.v1.kv_offload.tiering.spec import TieringOffloadingSpec

from hicache.integrations.vllm import tier_config

ROW = 4096          # bytes per primary chunk (page aligned, as vLLM requires)
ENGINE_PREFIX = f"hicache-test-{os.getpid()}-"   # /dev/shm/vllm_offload_{engine id}.mmap


def make_manager(url: str, *, chunks: int = 8, groups: int = 1, **tier_opts):
    """A fresh engine's offloading manager whose one secondary tier is hicache on ``url``."""
    cfg = OffloadingConfig(
        groups=tuple(OffloadingGroupConfig(tokens_per_block=16, layer_names=(f"g{g}.l0", f"g{g}.l1"), group_id=g)
                     for g in range(groups)),
        worker_kv_bytes_per_block=ROW, enable_kv_cache_events=False,
        extra_config={"cpu_bytes_to_use": chunks * ROW, "secondary_tiers": [tier_config(url, **tier_opts)]},
        engine_id=f"{ENGINE_PREFIX}{uuid.uuid4().hex[:12]}",
        model=OffloadingModelConfig(name="test/tiny-model", dtype="bfloat16"),
        cache=OffloadingCacheConfig(tokens_per_hash=16, blocks_per_chunk=1),
        parallel=OffloadingParallelConfig(rank=0, world_size=1, tp_size=1, pp_size=1, pcp_size=1, dcp_size=1,
                                          data_parallel_index=0, data_parallel_size=1,
                                          data_parallel_rank_local=None, is_parallelism_agnostic=False))
    spec = TieringOffloadingSpec(cfg)
    manager = spec.get_manager()
    assert spec.num_chunks == chunks and spec.kv_bytes_per_chunk == ROW
    return manager


def keys(ids, group: int = 0) -> list:
    return [make_offload_key(f"block-{i}".encode().ljust(32, b"."), group) for i in ids]


def payload(key) -> np.ndarray:
    """The bytes a block ``key`` holds in these tests (distinct per key and group)."""
    seed = int.from_bytes(key[:8], "little") ^ int.from_bytes(key[-4:], "big") * 7919
    return np.random.default_rng(seed).integers(0, 256, ROW, dtype=np.uint8)


def rows(manager) -> np.ndarray:
    view = manager.primary_tier.get_kv_memoryview()
    return np.frombuffer(view.cast("B"), dtype=np.uint8).reshape(len(view), ROW)


def fill(manager, ks, slots) -> None:
    """Stand in for the GPU worker's copy of each block into its primary slot."""
    r = rows(manager)
    for k, s in zip(ks, slots):
        r[int(s)] = payload(k)


def store(manager, ks, ctx: ReqContext):
    """The scheduler's store path: prepare (allocate primary slots), copy, complete (cascade)."""
    out = manager.prepare_store(ks, ctx)
    assert out is not None and list(out.keys_to_store) == list(ks)
    fill(manager, ks, out.store_spec.chunk_ids)
    manager.complete_store(ks, ctx, success=True)


def step(manager) -> None:
    manager.on_schedule_end(ScheduleEndContext(new_req_ids=[], preempted_req_ids=()))
    list(manager.take_events())


def settle(manager, timeout: float = 20.0) -> None:
    """Step the scheduler until no transfer is in flight (as the engine does while
    ``has_pending_work()``)."""
    deadline = time.monotonic() + timeout
    step(manager)  # promotions found by lookups are submitted at the end of a step
    while manager.has_pending_work():
        assert time.monotonic() < deadline, "transfers did not finish"
        time.sleep(0.005)
        step(manager)
    step(manager)


def lookup_until(manager, ks, ctx: ReqContext, timeout: float = 20.0) -> list[LookupResult]:
    """Look up every key, across scheduler steps, until none answers RETRY (the scheduler
    asks again on a later step while a tier is still finding out)."""
    deadline = time.monotonic() + timeout
    while True:
        results = [manager.lookup(k, ctx) for k in ks]
        if LookupResult.RETRY not in results:
            return results
        assert time.monotonic() < deadline, "lookups kept answering RETRY"
        step(manager)
        time.sleep(0.005)


def primary_bytes(manager, key) -> np.ndarray:
    """The bytes of ``key`` in the primary tier (via the primary's own load spec)."""
    ctx = ReqContext(req_id=f"read-{uuid.uuid4().hex[:6]}")
    spec = manager.primary_tier.prepare_load([key], ctx)
    slot = int(spec.chunk_ids[0])
    data = rows(manager)[slot].copy()
    manager.primary_tier.complete_load([key], ctx)
    return data
