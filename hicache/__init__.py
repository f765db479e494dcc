"""hicache: a hierarchical KV cache (device L1, host L2, L3 store) for serving engines.

What an engine needs is exported here::

    from hicache import HiCache, Boundary, load_config

    cache = HiCache.from_config("configs/deepseek-v4-flash.yaml")
    m = cache.match(tokens); lease = cache.load(m); ...

Layers, bottom up (see docs/architecture.md): :mod:`hicache.layout` (what is cached),
:mod:`hicache.pools` (the bytes of L1 and L2), :mod:`hicache.tree` (who holds which
prefix), :mod:`hicache.transfer` (copies between L1 and L2), :mod:`hicache.storage` (L3),
:mod:`hicache.cache` (the facade that composes them).
"""

from hicache.cache import (Boundary, CacheStats, ConfiguredPolicy, HiCache, Lease, MatchResult, PlacementPolicy,
                           Prefetch, PublishResult, SnapshotOutcome)
from hicache.config import HiCacheConfig, load_config
from hicache.errors import ConfigError, HiCacheError, MisuseError, StorageError, TransferError
from hicache.layout import CacheLayout, FamilySpec
from hicache.pools import AllocResult, Allocation, NoRoom, Source, Tier

__version__ = "0.1.0"

__all__ = [
    "HiCache", "HiCacheConfig", "load_config", "Lease", "MatchResult", "PublishResult", "SnapshotOutcome",
    "Boundary", "CacheStats", "Prefetch", "PlacementPolicy", "ConfiguredPolicy",
    "Allocation", "NoRoom", "AllocResult", "Tier", "Source",
    "CacheLayout", "FamilySpec",
    "HiCacheError", "ConfigError", "MisuseError", "TransferError", "StorageError",
]
