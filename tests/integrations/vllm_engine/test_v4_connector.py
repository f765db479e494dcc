"""``HiCacheConnector`` on DeepSeek-V4's KV cache groups in vLLM's CPU engine.

vLLM 0.32 makes six KV cache groups of the tiny V4 of ``test_v4_cpu.py`` under a connector:
one window-KV group per layer (``SlidingWindowMLASpec``, 64-token blocks), the compressed KV
of both ratios with the indexer keys (``MLAAttentionSpec``, 256-token blocks, three block
widths) and two compressor-state groups (``SlidingWindowMLASpec``, 4- and 8-token blocks,
windows 8 and 128). The connector makes the compressed KV and indexer hicache history and
every window group state at the resume point.

* Here (an AVX2 CPU): V4's caches are modules vLLM never calls the connector's per-layer
  hooks for, so the connector copies them at each step's start and end; that path serves
  the tiny sliding-window Llama with every layer treated so, identical outputs.
* Here: the engine starts with the connector once V4's one load-time op
  missing from vLLM's AVX2 build (``convert_weight_packed``, a weight repacking) has a
  pure-torch stand-in; the groups vLLM makes are exactly the geometry the no-vLLM tests
  use (``tests/integrations/test_vllm_v4_groups.py``), and the worker's copiers move each
  family's bytes on vLLM's real, strided V4 caches without touching other layers'.
* Kept ready (skips here, as ``test_v4_cpu.py``, naming what is missing): greedy outputs
  with every V4 family offloaded equal vLLM's own run, after ``reset_prefix_cache`` and
  from a fresh engine on the same store; zeroing what hicache loaded changes the logprobs
  of the same schedule, so the model reads it.
"""

from __future__ import annotations

import contextlib
import random

import pytest

from .test_connector_engine import bridge, start, stop
from .test_v4_cpu import make_tiny_v4

pytestmark = pytest.mark.filterwarnings("ignore")
V4_ATTENTION_OPS = ("flash_mla_with_kvcache_cpu", "fp8_paged_mqa_logits_cpu")
LENGTHS = (600, 1000)
ENGINE = {"load_format": "dummy", "skip_tokenizer_init": True, "max_num_seqs": 4, "max_num_batched_tokens": 1024}


def _stand_in_weight_packing() -> None:
    """``convert_weight_packed`` as the identity where vLLM's AVX2 build lacks it: enough
    for the engine to load V4 and size its caches (its forward needs the rest)."""
    import torch
    import vllm._custom_ops  # noqa: F401  (loads the _C build this CPU can run)

    if hasattr(torch.ops._C, "convert_weight_packed"):
        return
    lib = torch.library.Library("_C", "FRAGMENT")
    lib.define("convert_weight_packed(Tensor weight) -> Tensor")
    lib.impl("convert_weight_packed", lambda w: w.clone(), "CPU")
    _stand_in_weight_packing.lib = lib      # the registration lives as long as the library object


def _why_v4_cannot_run() -> str | None:
    import torch
    import vllm._custom_ops  # noqa: F401
    from vllm.triton_utils import HAS_TRITON

    missing = [op for op in V4_ATTENTION_OPS if not hasattr(torch.ops._C, op)]
    if missing:
        return f"vLLM's CPU build here lacks DeepSeek-V4's ops {missing} (AVX-512 BF16 build only)"
    if not torch.cpu._is_amx_tile_supported():
        # vllm/platforms/cpu.py: without AMX, V4 runs with prefix caching and chunked
        # prefill off, whole prompts only -- no prefill past a loaded prefix
        return "vLLM resumes DeepSeek-V4 from a cached prefix on CPU only with AMX"
    if not HAS_TRITON:
        return "V4's attention metadata needs Triton with a CPU backend (triton-cpu)"
    return None


def test_v4_groups_are_the_geometry_hicache_maps_and_copies_touch_only_their_bytes(tmp_path):
    import torch
    from vllm.distributed.kv_transfer import get_kv_transfer_group

    from hicache.integrations.vllm.connector import _geometry
    from tests.integrations.test_vllm_v4_groups import V4

    _stand_in_weight_packing()
    llm = start(make_tiny_v4(tmp_path / "tiny-v4"), "memory://vllm-v4-groups", engine=ENGINE)
    conn = get_kv_transfer_group()                           # the worker's side
    assert conn._groups == V4
    # the scheduler's own config merges each group's specs (one width: the first layer's)
    # but agrees on everything else; both sides use the worker's groups
    scheduler = llm.llm_engine.engine_core.engine_core.scheduler
    shape = [(g.kind, g.layers, g.block_tokens, g.window, g.layer_ids) for g in _geometry(scheduler.kv_cache_config)]
    assert shape == [(g.kind, g.layers, g.block_tokens, g.window, g.layer_ids) for g in V4]
    assert scheduler.connector._groups is conn._groups
    assert set(conn._bulk) == set(conn._where)   # V4's caches are modules without vLLM's per-layer hooks
    b = bridge(llm)
    assert [f.name for f in b.cache.layout.families] == ["swa0", "swa1", "swa2", "kv", "kv_1", "kv_2",
                                                         "swa4", "swa4_1", "swa5"]
    assert len(conn._copiers) == 9 and len(conn._where) == 9      # one family per cache here
    # vLLM packs several caches into one block stride (and caches of different groups share
    # bytes: a block id belongs to one group at a time). A copy writes that cache's bytes
    # of the block and nothing else in the block's stride.
    gen = torch.Generator().manual_seed(0)
    src, dst = 5, 9
    for copier in conn._copiers:
        for layer, r in enumerate(copier.rows):
            stride, off = r.stride(0), r.storage_offset() % r.stride(0)
            storage = torch.empty(0, dtype=torch.uint8).set_(r.untyped_storage())
            r[src] = torch.randint(0, 256, (r.shape[1],), dtype=torch.uint8, generator=gen)
            base = r.storage_offset() - off
            block = storage[base + dst * stride:base + (dst + 1) * stride]
            before = block.clone()
            unit = copier.slots - 1                # a history page, or a snapshot's last slot
            copier.save(layer, [unit], [src])
            copier.load(layer, [unit], [dst])
            assert torch.equal(r[dst], r[src])
            changed = (block != before).nonzero().flatten()
            assert len(changed) and off <= int(changed.min()) and int(changed.max()) < off + r.shape[1], \
                (off, r.shape, changed.min(), changed.max())
    stop(llm)


@contextlib.contextmanager
def zeroed_loads():
    """Every worker copy into vLLM's blocks (pages and windows, all families), each
    followed by zeroing those blocks."""
    import torch
    from vllm.distributed.kv_transfer import get_kv_transfer_group

    conn = get_kv_transfer_group()
    real = [c.load for c in conn._copiers]

    def zeroing(copier, load):
        def run(layer, pages, blocks):
            load(layer, pages, blocks)
            if blocks:
                copier.rows[layer].index_fill_(0, torch.tensor(list(blocks)), 0)
        return run

    for c, load in zip(conn._copiers, real):
        c.load = zeroing(c, load)
    try:
        yield
    finally:
        for c, load in zip(conn._copiers, real):
            c.load = load


def generate(llm, prompts):
    """Greedy tokens, the logprob of each, and ``num_cached_tokens`` per prompt."""
    from vllm import SamplingParams

    out = llm.generate([{"prompt_token_ids": p} for p in prompts],
                       SamplingParams(temperature=0, max_tokens=8, logprobs=1), use_tqdm=False)
    tokens = [list(o.outputs[0].token_ids) for o in out]
    logprobs = [[lp[t].logprob for t, lp in zip(o.outputs[0].token_ids, o.outputs[0].logprobs)] for o in out]
    return tokens, logprobs, [o.num_cached_tokens for o in out]


def test_v4_identical_outputs_with_every_family_offloaded(tmp_path):
    reason = _why_v4_cannot_run()
    if reason:
        pytest.skip(f"{reason}; docs/integrations.md")
    model = make_tiny_v4(tmp_path / "tiny-v4")
    rng = random.Random(5)
    prompts = [[rng.randrange(3, 1024) for _ in range(n)] for n in LENGTHS]
    resumed = [(n - 1) // 256 * 256 for n in LENGTHS]
    ref = start(model, None, engine=ENGINE)
    expected, _, _ = generate(ref, prompts)
    stop(ref)

    llm = start(model, tmp_path / "store", engine=ENGINE)
    b = bridge(llm)
    assert {f.kind for f in b.cache.layout.families} == {"history", "state"}
    first, _, _ = generate(llm, prompts)
    assert first == expected
    llm.reset_prefix_cache()         # (vLLM keeps no prefix cache for V4 on a CPU without AMX)
    again, logprobs, cached = generate(llm, prompts)
    assert again == expected and cached == resumed, (again, cached)
    s = b.stats()
    assert s["loaded_tokens"] == sum(cached) and s["loaded_snapshots"] == len(LENGTHS), s
    assert s["load_failed_tokens"] == 0 and s["save_failures"] == 0, s
    llm.reset_prefix_cache()
    same, same_logprobs, _ = generate(llm, prompts)          # the same schedule again: bit for bit
    assert same == again and same_logprobs == logprobs
    llm.reset_prefix_cache()
    with zeroed_loads():
        _, bad_logprobs, cached = generate(llm, prompts)
    assert cached == resumed and bad_logprobs != logprobs
    stop(llm)

    llm = start(model, tmp_path / "store", engine=ENGINE)   # a fresh engine: everything from L3
    b = bridge(llm)
    outs, _, cached = generate(llm, prompts)
    assert outs == expected and cached == resumed, cached
    s = b.stats()
    assert s["cache_l3_hit_tokens"] == sum(cached) and s["loaded_snapshots"] == len(LENGTHS), s
    stop(llm)


def test_layers_without_per_layer_hooks_are_copied_at_each_steps_ends(tmp_path, monkeypatch):
    """The path V4's layers take (no ``wait_for_layer_load`` / ``save_kv_layer`` from vLLM:
    loads in ``start_load_kv``, saves in ``wait_for_save``), forced for every layer of the
    tiny sliding-window Llama: pages and windows resume from hicache, same outputs, and
    zeroing what was loaded changes them."""
    import hicache.integrations.vllm.connector as connector

    from .test_connector_engine import generate as generate_tokens
    from .test_connector_swa import LENGTHS as SWA_LENGTHS, WINDOW, zeroed_window_loads
    from .tiny_llama import VOCAB, make_tiny_llama

    model = make_tiny_llama(tmp_path / "tiny-swa", sliding_window=WINDOW, seed=1)
    rng = random.Random(11)
    prompts = [[rng.randrange(3, VOCAB) for _ in range(n)] for n in SWA_LENGTHS]
    ref = start(model, None)
    expected, _ = generate_tokens(ref, prompts)
    stop(ref)
    monkeypatch.setattr(connector, "_hooked_layers", lambda *a: set())
    llm = start(model, "memory://vllm-unhooked")
    from vllm.distributed.kv_transfer import get_kv_transfer_group

    assert set(get_kv_transfer_group()._bulk) == set(get_kv_transfer_group()._where)
    b = bridge(llm)
    assert generate_tokens(llm, prompts)[0] == expected
    assert llm.reset_prefix_cache()
    outs, cached = generate_tokens(llm, prompts)
    assert outs == expected and cached == [(n - 1) // 128 * 128 for n in SWA_LENGTHS], cached
    s = b.stats()
    assert s["loaded_tokens"] == sum(cached) and s["loaded_snapshots"] == len(SWA_LENGTHS), s
    assert s["save_failures"] == 0 and s["published_snapshots"] >= len(SWA_LENGTHS), s
    assert llm.reset_prefix_cache()
    with zeroed_window_loads():
        bad, cached = generate_tokens(llm, prompts)
    assert sum(cached) > 0 and bad != expected, (cached, bad)
    stop(llm)
