"""Shared pieces of the tiny-model tests: configs, token streams, pools, a paged runner."""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from hicache.engine.tiny_model import (PagedSequenceCache, TinyV4Config, TinyV4Model,
                                       layout_for)
from hicache.pools import TierPools

# Shapes that matter for a resume: W < P and W > P, HCA with m < P and m == P, CSA, no
# SWA-only layers (V4-Pro style), a single-layer model.
CONFIGS = {
    "default": TinyV4Config(),
    "wide-window": TinyV4Config(window=24, compress_ratios=(4, 16, 0), index_topk=2, seed=1),
    "pro-like": TinyV4Config(compress_ratios=(8, 8, 4, 8), window=5, seed=2, page_tokens=8),
    "one-csa-layer": TinyV4Config(compress_ratios=(4,), window=3, index_topk=3, seed=3,
                                  page_tokens=4),
}

_MODELS: dict[TinyV4Config, TinyV4Model] = {}


def model_for(cfg: TinyV4Config) -> TinyV4Model:
    """Weights are a pure function of the config; build each model once per session."""
    if cfg not in _MODELS:
        _MODELS[cfg] = TinyV4Model(cfg)
    return _MODELS[cfg]


def tokens(cfg: TinyV4Config, n: int, seed: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, cfg.vocab, (n,), generator=g)


def device_pools(cfg: TinyV4Config, pages: int = 128, snapshots: int = 32) -> TierPools:
    return TierPools(layout_for(cfg), "device", num_pages=pages, num_snapshots=snapshots)


@dataclass
class Published:
    """What a request has published: its page table and one snapshot per boundary."""

    pages: list[int] = field(default_factory=list)
    snapshots: dict[int, int] = field(default_factory=dict)


def run_publishing(model: TinyV4Model, pools: TierPools, toks: torch.Tensor, *,
                   chunks=None, cache: PagedSequenceCache | None = None,
                   published: Published | None = None) -> tuple[torch.Tensor, PagedSequenceCache, Published]:
    """Run ``toks`` on a paged cache, publishing pages and a snapshot at every page
    boundary (as an engine with retention 'every page' would)."""
    cache = cache or PagedSequenceCache(model.cfg, pools)
    published = published or Published()
    assert cache.reserve(cache.length + len(toks)).ok, "test pools too small"

    def on_boundary(b: int) -> None:
        sid = pools.alloc("state", 1)
        assert sid.ok, "test pools too small"
        cache.save_snapshot(b, int(sid.ids[0]))
        published.snapshots[b] = int(sid.ids[0])
        published.pages = cache.publish_pages(b)

    logits = model.run(toks, cache, chunks=chunks, on_boundary=on_boundary)
    return logits, cache, published


def f64_rows(pools: TierPools, family: str) -> torch.Tensor:
    """A family's pool as float64 ``[layers, ids, rows, dim]`` (rows per page or snapshot)."""
    fam = pools.layout.family(family)
    rows = fam.rows_per_id(pools.layout.page_tokens)
    view = pools.view(family).view(torch.float64)
    return view.view(view.shape[0], view.shape[1], rows, view.shape[2] // rows)
