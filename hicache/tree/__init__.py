"""Layer 2: the radix tree that knows which prefix exists in which tier.

Interface: :class:`RadixTree` (walk / resume points / insert / split / locks / subtree
removal / eviction order / evictable totals), :class:`TreeNode`, :class:`Snapshot`, the chained page hash
(:func:`page_hash`, :func:`chain_hashes`), eviction (:func:`device_victims`,
:func:`host_victims`, :func:`snapshot_victims`, :func:`get_strategy`, the
:class:`EvictionStrategy` protocol) and retention (:class:`RetentionPolicy`), ghost caches and the online choice between whole policies (:class:`GhostCache`, :class:`PolicySelector`). Pure
bookkeeping over ids: it never frees or copies bytes. Imports only :mod:`hicache.layout`
(and errors).
"""

from hicache.tree.eviction import (CANDIDATES, LFU, LRU, STRATEGIES, AccessStrategy, EvictionStrategy, Ranked, Value,
                                   device_victims, get_strategy, host_victims, snapshot_victims)
from hicache.tree.ghost import GhostCache
from hicache.tree.ghost_nodes import page_keys
from hicache.tree.selector import PolicySelector, SelectorStats
from hicache.tree.insert import InsertResult
from hicache.tree.node import (HASH_BYTES, ROOT_HASH, LoadTicket, RootNode, Snapshot, TreeNode, chain_hashes,
                               page_hash, tenant_root_hash, token_bytes)
from hicache.tree.order import EvictionOrder
from hicache.tree.paths import PathMatch, ResumePoint
from hicache.tree.radix import RadixTree, Removed
from hicache.tree.retention import Boundary, Decision, RetentionPolicy, chunk_end, grain_end

__all__ = [
    "CANDIDATES", "LFU", "LRU", "STRATEGIES", "Ranked", "Value", "PolicySelector", "SelectorStats", "AccessStrategy", "EvictionStrategy", "device_victims", "get_strategy",
    "host_victims", "snapshot_victims", "HASH_BYTES", "ROOT_HASH", "LoadTicket", "Snapshot", "TreeNode",
    "chain_hashes", "page_hash", "token_bytes", "InsertResult", "EvictionOrder", "PathMatch", "RadixTree",
    "Removed", "ResumePoint", "Boundary", "Decision", "RetentionPolicy", "chunk_end", "grain_end", "GhostCache",
    "page_keys", "RootNode", "tenant_root_hash",
]
