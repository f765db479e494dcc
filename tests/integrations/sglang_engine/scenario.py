"""Producer / consumer steps on SGLang's own cache, shared by the engine tests.

A *producer* is a fresh ``UnifiedRadixCache`` whose HiCache controller writes a sequence's
pages to L3 (device -> host backup, then host -> storage through the configured backend);
a *consumer* is another fresh cache that prefetches the sequence from L3 and loads it
back to its device pool. The KV of every layer is filled with seeded random values, so
"byte for byte" compares every K and V row of every layer.
"""

from __future__ import annotations

from array import array
from dataclasses import dataclass

import torch
from sglang.srt.mem_cache.base_prefix_cache import CacheRequestHandle
from sglang.test.kits.unified_radix_cache.fixtures import build_fixture, match_prefix


@dataclass
class Side:
    kit: object
    cache: object
    alloc: object
    rtp: object

    @property
    def backend(self):
        return self.cache.cache_controller.storage_backend


def kv_pools(alloc):
    """(full pool, swa pool or None) of a fixture's device KV."""
    pool = alloc.get_kvcache()
    return getattr(pool, "full_kv_pool", pool), getattr(pool, "swa_kv_pool", None)


def fill_random(alloc, full_idx: torch.Tensor, seed: int, swa_tokens: int = 0) -> dict:
    """Write seeded random K/V into every layer at ``full_idx`` (and the SWA rows they map
    to); return a snapshot to compare with later."""
    g = torch.Generator().manual_seed(seed)
    full, swa = kv_pools(alloc)
    for bufs in (full.k_buffer, full.v_buffer):
        for buf in bufs:
            buf[full_idx] = torch.randn(buf[full_idx].shape, generator=g).to(buf.dtype)
    if swa is not None:
        swa_idx = alloc.full_to_swa_index_mapping[full_idx]
        for bufs in (swa.k_buffer, swa.v_buffer):
            for buf in bufs:
                buf[swa_idx] = torch.randn(buf[swa_idx].shape, generator=g).to(buf.dtype)
    return snapshot(alloc, full_idx, swa_tokens)


def snapshot(alloc, full_idx: torch.Tensor, swa_tokens: int = 0) -> dict:
    """Every layer's K and V at ``full_idx``; with ``swa_tokens``, also the SWA layers'
    rows of the last ``swa_tokens`` tokens (the window a resume needs)."""
    full, swa = kv_pools(alloc)
    out = {"full": [b[full_idx].clone() for b in (*full.k_buffer, *full.v_buffer)]}
    if swa is not None and swa_tokens:
        swa_idx = alloc.full_to_swa_index_mapping[full_idx[-swa_tokens:]]
        out["swa"] = [b[swa_idx].clone() for b in (*swa.k_buffer, *swa.v_buffer)]
    return out


def same(a: dict, b: dict) -> bool:
    return a.keys() == b.keys() and all(
        len(a[k]) == len(b[k]) and all(torch.equal(x.view(torch.uint8), y.view(torch.uint8))
                                       for x, y in zip(a[k], b[k])) for k in a)


def side(make_kit, cfg, backend: str, extra: dict, **attach) -> Side:
    kit = make_kit(cfg)
    cache, alloc, rtp = build_fixture(cfg)
    kit.attach(cache, backend, extra, **attach)
    return Side(kit, cache, alloc, rtp)


def produce(p: Side, seq: list[int], seed: int, swa_tokens: int = 0) -> dict:
    """Insert ``seq``, fill its KV, back it up to host and write the path to L3; returns
    the snapshot (with the SWA rows of the last ``swa_tokens`` tokens)."""
    p.kit._insert(p.cache, p.alloc, p.rtp, seq)
    leaf = match_prefix(p.cache, seq).last_device_node
    expected = fill_random(p.alloc, p.cache.path_device_indices(leaf), seed, swa_tokens)
    p.kit._backup_node(p.cache, leaf)
    p.kit._write_path_to_l3(p.cache, leaf)
    p.kit._flush_l3_backups(p.cache)
    return expected


def prefetch(c: Side, seq: list[int], rid: str) -> int:
    """Prefetch ``seq`` from L3 to completion; the host-resident prefix length after it."""
    c.cache.prefetch_from_storage(CacheRequestHandle(rid, 0), c.cache.root_node_handle(), array("q", seq),
                                  None, None)
    c.kit._run_prefetch_to_completion(c.cache, CacheRequestHandle(rid, 0))
    return match_prefix(c.cache, seq).host_hit_length


def load_back(c: Side, seq: list[int], swa_tokens: int = 0) -> dict:
    """Load the host-resident prefix to the device, as admission does; snapshot its KV."""
    m = match_prefix(c.cache, seq)
    if m.host_hit_length:
        c.kit._load_back_node(c.cache, m.last_host_node)
    m = match_prefix(c.cache, seq)
    assert m.device_prefix_len == len(seq), (m.device_prefix_len, len(seq))
    return snapshot(c.alloc, c.cache.path_device_indices(m.last_device_node), swa_tokens)
