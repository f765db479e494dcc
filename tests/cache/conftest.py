"""A small hybrid layout and helpers that act like an engine, verifying every byte."""

from __future__ import annotations

import numpy as np
import pytest

from hicache.cache import Boundary, HiCache
from hicache.config import AdmitConfig, HiCacheConfig, StorageConfig, TreeConfig, WriteConfig
from hicache.engine import contents
from hicache.layout import CacheLayout, FamilySpec
from hicache.pools import PoolConfig

P = 4


def hybrid_layout() -> CacheLayout:
    return CacheLayout((
        FamilySpec("swa_kv", "state", (0, 1, 2), 1, 8, rows_kept=3),
        FamilySpec("c4_kv", "history", (1, 2), 4, 16),
        FamilySpec("kv", "history", (0,), 1, 8),
        FamilySpec("c4_state", "state", (1, 2), 1, 8, rows_kept=4),
    ), P)


def mha_layout() -> CacheLayout:
    return CacheLayout((FamilySpec("kv", "history", (0, 1), 1, 8),), P)


def make_cache(layout=None, *, device_pages=16, device_snaps=8, host_pages=32, host_snaps=16,
               write_policy="write_through", retention=None, eviction="lru", threshold=2,
               storage="memory://", prefetch_policy="wait_complete", salt="t",
               host_tier="inclusive", transfer=None, budget="split", state_cap=None,
               candidates=None, window=300, margin=0.01, z=0.0, trial=0, admit: AdmitConfig | None = None,
               auth_key="") -> HiCache:
    """A cache with these counts (``budget="split"``), or (``"shared"``) one arena per tier
    of the same bytes: ``pages x page bytes + snaps x snapshot bytes`` (``state_cap``: a
    state_share cap), or (``"shared_host"``) the device's counts and such a host arena."""
    layout = layout or hybrid_layout()
    page, snap = layout.object_bytes("page"), layout.object_bytes("state")
    if budget == "shared":
        pools = PoolConfig(device="cpu", budget="shared", state_share=state_cap,
                           device_bytes=device_pages * page + device_snaps * snap,
                           host_bytes=host_pages * page + host_snaps * snap)
    elif budget == "shared_host":
        pools = PoolConfig(device="cpu", budget="shared_host", device_bytes=1 << 20,
                           device_pages=device_pages, device_snapshots=device_snaps,
                           host_bytes=host_pages * page + host_snaps * snap)
    else:
        pools = PoolConfig(device="cpu", device_bytes=1 << 20, host_bytes=1 << 20,
                           device_pages=device_pages, device_snapshots=device_snaps,
                           host_pages=host_pages, host_snapshots=host_snaps)
    cfg = HiCacheConfig(
        pools=pools,
        tree=TreeConfig(eviction=eviction, retention_interval=retention,
                        adaptive_candidates=candidates or TreeConfig.adaptive_candidates,
                        adaptive_window=window, adaptive_margin=margin, adaptive_z=z,
                        adaptive_trial=trial),
        write=WriteConfig(write_policy=write_policy, write_through_threshold=threshold, host_tier=host_tier),
        storage=StorageConfig(url=storage, salt=salt, prefetch_policy=prefetch_policy,
                              prefetch_threshold_tokens=P, auth_key=auth_key),
        admit=admit or AdmitConfig())
    return HiCache(layout, cfg, transfer=transfer)


def toks(*pages: int, extra: int = 0) -> np.ndarray:
    """Whole pages of value v (distinct, readable) plus ``extra`` trailing tokens."""
    out = np.repeat(np.asarray(pages, np.int32), P)
    return np.concatenate([out, np.full(extra, 999, np.int32)])


def node_of(cache, tokens):
    """The node whose end is the last whole page of ``tokens``."""
    path = cache._tree.walk(np.asarray(tokens, np.int32), len(tokens) // P)
    node, used = path.segments[-1]
    assert used == node.num_pages, "tokens end inside a node"
    return node


class Engine:
    """Drives one cache like a serving engine and checks every byte it reads back."""

    def __init__(self, cache: HiCache):
        self.cache = cache
        self.verified = 0

    def hashes(self, tokens):
        return self.cache.page_hashes(tokens)

    def start(self, tokens):
        m = self.cache.match(tokens)
        lease = self.cache.load(m)
        assert lease.wait(), "load failed"
        self.verify(lease, tokens)
        return m, lease

    def verify(self, lease, tokens):
        n = lease.resume_pages
        h = self.hashes(tokens)
        ok = contents.check(self.cache.pools.device, "page", lease.page_table[:n], contents.page_seeds(h[:n]))
        assert ok.all(), f"page bytes differ at {np.flatnonzero(~ok).tolist()}"
        if lease.snapshot_id is not None and n:
            assert contents.check(self.cache.pools.device, "state", [lease.snapshot_id],
                                  [contents.snapshot_seed(h[n - 1])]).all(), "snapshot bytes differ"
        self.verified += n

    def compute(self, lease, tokens, upto_pages):
        have = len(lease.page_table)
        if upto_pages > have:
            assert self.cache.alloc_pages(lease, upto_pages - have).ok
        h = self.hashes(tokens)
        lo = lease.published_pages
        contents.fill(self.cache.pools.device, "page", lease.page_table[lo:upto_pages],
                      contents.page_seeds(h[lo:upto_pages]))

    def publish(self, lease, tokens, pages, why=Boundary.PREFILL, snapshot=True):
        self.compute(lease, tokens, pages)
        sid = None
        if snapshot and self.cache.layout.object_bytes("state") and pages:
            alloc = self.cache.alloc_snapshot(lease)
            assert alloc.ok
            sid = int(alloc.ids[0])
            contents.fill(self.cache.pools.device, "state", [sid],
                          [contents.snapshot_seed(self.hashes(tokens)[pages - 1])])
        return self.cache.publish(lease, tokens, pages, snapshot_id=sid, why=why)

    def run(self, tokens, *, chunk_pages=None, why_last=Boundary.FINISH, release=True):
        """A whole request: start, prefill in chunks (publishing each), finish, release."""
        m, lease = self.start(tokens)
        total = len(tokens) // P
        step = chunk_pages or max(total, 1)
        pages = lease.resume_pages
        while pages < total:
            pages = min(pages + step, total)
            self.publish(lease, tokens, pages, why_last if pages == total else Boundary.PREFILL)
        if release:
            self.cache.release(lease)
            self.cache.drain()
        self.cache.check_integrity()
        return m, lease


@pytest.fixture
def engine():
    cache = make_cache()
    yield Engine(cache)
    cache.close()
