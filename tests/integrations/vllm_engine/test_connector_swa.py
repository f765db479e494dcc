"""``HiCacheConnector`` on a model with sliding-window layers: a tiny Llama whose even layers
attend to a 160-token window and odd layers to everything.

The connector declares ``SupportsHMA``, so vLLM keeps its hybrid KV cache manager: two KV
cache groups (full attention, sliding window), the window group's blocks below the window
freed as the request goes on. hicache keeps the full-attention group as history pages and
the window group as a state family: one snapshot per boundary holding the window's blocks
(``hicache.integrations.vllm.windows``). After ``reset_prefix_cache`` a resumed request gets
its pages and its window from hicache, and its outputs equal vLLM's own hybrid run without
a connector; zeroing the loaded window (the snapshot's copy into the window blocks) changes
them, so the model reads it.
"""

from __future__ import annotations

import contextlib
import random

import pytest

from .test_connector_engine import bridge, concurrent_resume, generate, start, stop
from .tiny_llama import VOCAB, make_tiny_llama

pytestmark = pytest.mark.filterwarnings("ignore")
WINDOW = 160
LENGTHS = (500, 900)


@contextlib.contextmanager
def zeroed_window_loads():
    """The worker's snapshot -> window-block copies, each followed by zeroing those blocks."""
    import torch
    from vllm.distributed.kv_transfer import get_kv_transfer_group

    conn = get_kv_transfer_group()
    (copier,) = [c for c, g in zip(conn._copiers, conn._copier_group) if conn._groups[g].kind == "sliding"]
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


def test_sliding_window_model_resumes_from_a_window_snapshot(tmp_path):
    model = make_tiny_llama(tmp_path / "tiny-swa", sliding_window=WINDOW, seed=1)
    rng = random.Random(11)
    prompts = [[rng.randrange(3, VOCAB) for _ in range(n)] for n in LENGTHS]
    ref = start(model, None)
    assert not ref.llm_engine.vllm_config.scheduler_config.disable_hybrid_kv_cache_manager  # two groups
    expected, _ = generate(ref, prompts)
    stop(ref)

    llm = start(model, tmp_path / "store")
    assert not llm.llm_engine.vllm_config.scheduler_config.disable_hybrid_kv_cache_manager, \
        "vLLM turned its hybrid manager off: the connector should declare SupportsHMA"
    b = bridge(llm)
    from vllm.distributed.kv_transfer import get_kv_transfer_group

    assert get_kv_transfer_group()._bulk == ()   # every layer copied through vLLM's per-layer hooks
    kinds = sorted(f.kind for f in b.cache.layout.families)
    assert kinds == ["history", "state"], b.cache.layout.summary()
    first, _ = generate(llm, prompts)
    assert first == expected
    assert b.counters["published_snapshots"] >= len(LENGTHS)
    assert llm.reset_prefix_cache()
    again, cached = generate(llm, prompts)
    assert again == expected
    assert cached == [(n - 1) // 128 * 128 for n in LENGTHS], cached
    s = b.stats()
    assert s["loaded_tokens"] == sum(cached) and s["loaded_snapshots"] == len(LENGTHS), s
    assert s["load_failed_tokens"] == 0 and s["save_failures"] == 0, s

    assert llm.reset_prefix_cache()
    with zeroed_window_loads():
        bad, cached = generate(llm, prompts)
    assert sum(cached) > 0 and bad != expected, (cached, bad)
    stop(llm)

    # A fresh engine on the same store: the pages and the window snapshots come from L3
    # (L3 -> host -> hicache's pool -> vLLM's blocks), same outputs.
    llm = start(model, tmp_path / "store")
    b = bridge(llm)
    outs, cached = generate(llm, prompts)
    assert outs == expected and cached == [(n - 1) // 128 * 128 for n in LENGTHS], cached
    s = b.stats()
    assert s["cache_l3_hit_tokens"] == sum(cached) and s["loaded_snapshots"] == len(LENGTHS), s
    stop(llm)


def test_sliding_window_concurrent_chunked_prefill_and_a_small_kv_budget(tmp_path):
    """Six requests sharing a 400-token prefix, at most four running, prefilled in 256-token
    chunks (a snapshot at each chunk's deepest boundary, published mid-prefill), 48 KV
    blocks shared by both groups (a block holds one group's two layers: the bytes of the
    full-attention model's 24; tight enough that requests wait for blocks -- whether vLLM
    also preempts here was not checked): after ``reset_prefix_cache`` each resumes
    from hicache (pages and window) and the outputs equal vLLM's own hybrid run with the
    same budget."""
    model = make_tiny_llama(tmp_path / "tiny-swa", sliding_window=WINDOW, seed=1)
    cached, s = concurrent_resume(model, blocks=48, url="memory://vllm-swa-concurrent")
    assert all(c >= 256 for c in cached), cached
    assert s["loaded_snapshots"] >= len(cached) and s["save_failures"] == 0 and s["load_failed_tokens"] == 0, s
