"""A cache, pools and workload sized for the tiny model, so every tier is exercised.

The tiny model's pages are about 2 KiB and its snapshots about 8 KiB, so pools are given
as counts, not byte budgets. The defaults are small on purpose: a handful of conversations
fill the device (pages are demoted to the host, then loaded back) and the host (pages are
dropped there and prefetched back from L3), while one request always fits on the device.

L3 keys are namespaced by layout fingerprint and salt; two tiny models with the same
shapes but other weights have the same layout, so the salt names the model config.
"""

from __future__ import annotations

import dataclasses
import hashlib
from dataclasses import dataclass
from typing import TYPE_CHECKING

from hicache.cache import HiCache
from hicache.config import HiCacheConfig, StorageConfig, TreeConfig, WriteConfig
from hicache.engine import workloads
from hicache.engine.tiny_model import TinyV4Config, layout_for
from hicache.units import check_int
from hicache.pools import PoolConfig

if TYPE_CHECKING:
    from typing import Unpack

# Conversations short enough to decode token by token on one CPU core (at most 25 pages of
# 16 tokens), long enough to span many pages; two shared system prompts so conversations
# reuse each other's prefix. A conversation starts every ~10 steps (one step = one second
# of simulated time) and thinks ~100 steps between turns -- about three turns' worth of
# other traffic -- so a returning turn finds its prefix on the device, demoted to the
# host, or dropped to L3, depending on what ran meanwhile.
TINY_WORKLOAD: workloads.SyntheticOverrides = dict(
    turns=(2, 4), system_prompts=2, system_len=60, user_len=(8, 40), output_len=(8, 40), arrival_rate=0.1,
    think_time_s=100.0)


@dataclass(frozen=True)
class TinyPools:
    """Page and snapshot counts of the device (L1) and host (L2) tiers."""

    device_pages: int = 28
    device_snapshots: int = 12
    host_pages: int = 40
    host_snapshots: int = 24

    def __post_init__(self) -> None:
        for f in dataclasses.fields(self):
            check_int(f.name, getattr(self, f.name), minimum=1)


def model_salt(cfg: TinyV4Config) -> str:
    """L3 salt naming the weights too (the layout fingerprint covers only the shapes)."""
    return "tiny-v4-" + hashlib.blake2b(repr(cfg).encode(), digest_size=8).hexdigest()


def tiny_cache_config(model_cfg: TinyV4Config, *, pools: TinyPools = TinyPools(),
                      storage_url: str = "memory://", retention: int | None = None,
                      write_policy: str = "write_through",
                      prefetch_policy: str = "wait_complete", device: str = "cpu") -> HiCacheConfig:
    """A :class:`HiCacheConfig` for ``layout_for(model_cfg)``, its device pools on ``device``
    (the CPU by default; ``cuda`` pins the host pools and copies with the Triton kernel, while
    the model itself computes on the CPU, so the same logits are expected everywhere).

    ``write_through``: every published page gets a host copy at once, so device eviction
    demotes (host hits later) instead of dropping. ``wait_complete`` prefetch and a
    one-page prefetch threshold: an L3 hit of any length is used, deterministically.
    """
    P = model_cfg.page_tokens
    return HiCacheConfig(
        pools=PoolConfig(device=device, device_bytes=1 << 20, host_bytes=1 << 20,
                         device_pages=pools.device_pages, device_snapshots=pools.device_snapshots,
                         host_pages=pools.host_pages, host_snapshots=pools.host_snapshots),
        tree=TreeConfig(retention_interval=retention),
        write=WriteConfig(write_policy=write_policy),
        storage=StorageConfig(url=storage_url, salt=model_salt(model_cfg), prefetch_policy=prefetch_policy,
                              prefetch_threshold_tokens=P))


def tiny_cache(model_cfg: TinyV4Config, **kwargs) -> HiCache:
    """``HiCache(layout_for(model_cfg), tiny_cache_config(model_cfg, **kwargs))``."""
    return HiCache(layout_for(model_cfg), tiny_cache_config(model_cfg, **kwargs))


def tiny_workload(conversations: int = 6, seed: int = 0, *, vocab: int = TinyV4Config.vocab,
                  **overrides: Unpack[workloads.SyntheticOverrides]) -> list[workloads.Request]:
    """Synthetic multi-turn chat with token ids in ``[0, vocab)`` (see ``TINY_WORKLOAD``)."""
    shape: workloads.SyntheticOverrides = {**TINY_WORKLOAD, "vocab_size": vocab, **overrides}
    return workloads.synthetic(conversations, seed, **shape)


__all__ = ["TinyPools", "tiny_cache_config", "tiny_cache", "tiny_workload", "model_salt", "TINY_WORKLOAD"]
