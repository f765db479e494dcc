"""The ``HiCache`` facade: wires layout, pools, transfer and tree (and later storage).

Interface: :class:`HiCache`, :class:`MatchResult`, :class:`Lease`, :class:`PublishResult`,
:class:`Boundary` (why a snapshot is offered), :class:`CacheStats`.
"""

from hicache.cache.facade import HiCache
from hicache.cache.lease import Lease
from hicache.cache.results import CacheStats, MatchResult, PublishResult
from hicache.tree import Boundary

__all__ = ["HiCache", "Lease", "MatchResult", "PublishResult", "CacheStats", "Boundary"]
