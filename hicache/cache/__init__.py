"""The ``HiCache`` facade and the parts it composes.

Interface: :class:`HiCache`, :class:`MatchResult`, :class:`Lease`, :class:`PublishResult`,
:class:`SnapshotOutcome`, :class:`Boundary` (why a snapshot is offered), :class:`CacheStats`,
:class:`Prefetch` (an L3 prefetch in flight), :class:`PlacementPolicy` (the replaceable
placement and eviction decisions) and :class:`ConfiguredPolicy` (the config's policy);
:func:`admission_active` (whether a config and L3 URL admit chains to L3 on their own).
"""

from hicache.cache.admission import admission_active
from hicache.cache.facade import HiCache
from hicache.cache.l3tier import Prefetch
from hicache.cache.lease import Lease
from hicache.cache.metrics import PrometheusExporter
from hicache.cache.policy import ConfiguredPolicy, PlacementPolicy
from hicache.cache.results import CacheStats, MatchResult, PublishResult, SnapshotOutcome, resumable_pages
from hicache.cache.tokens import as_tokens
from hicache.tree import Boundary, chunk_end, grain_end

__all__ = ["HiCache", "Lease", "MatchResult", "PublishResult", "SnapshotOutcome", "CacheStats", "Boundary", "chunk_end", "grain_end",
           "Prefetch", "PlacementPolicy", "ConfiguredPolicy", "PrometheusExporter", "as_tokens",
           "admission_active", "resumable_pages"]
