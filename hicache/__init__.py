"""hicache: a hierarchical KV cache (device L1, host L2, L3 store) for serving engines.

Layers, bottom up (see docs/architecture.md): :mod:`hicache.layout` (what is cached),
:mod:`hicache.pools` (the bytes of L1 and L2).
"""

from hicache.errors import ConfigError, HiCacheError, MisuseError, StorageError, TransferError
from hicache.layout import CacheLayout, FamilySpec

__version__ = "0.1.0"

__all__ = [
    "CacheLayout", "FamilySpec",
    "HiCacheError", "ConfigError", "MisuseError", "TransferError", "StorageError",
]
