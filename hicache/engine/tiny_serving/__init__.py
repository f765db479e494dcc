"""Serving the tiny DeepSeek-V4-style model through ``HiCache``, every logit checked.

Interface:

* :class:`TinyEngine`, :class:`TinyEngineConfig`: a small continuous-batching loop in which
  the model computes through the cache's device pools (``PagedSequenceCache`` on the
  lease's page table, state from ``lease.snapshot_id``) and compares every logit it
  computes with a no-cache recompute. ``TinyEngine.resume_sequence`` is the seam negative
  controls override.
* :class:`TinyRecord`, :class:`TinyReport`: per-request tiers, byte checks, exactness.
* :func:`tiny_cache`, :func:`tiny_cache_config`, :class:`TinyPools`, :func:`tiny_workload`:
  a cache and a workload sized so that device, host and L3 hits all occur.
* :class:`Reference`, :class:`PageCheck`: the no-cache truth of one request.

See ``docs/tiny_model.md`` (section "Serving it through HiCache").
"""

from hicache.engine.tiny_serving.build import (TINY_WORKLOAD, TinyPools, model_salt, tiny_cache,
                                               tiny_cache_config, tiny_workload)
from hicache.engine.tiny_serving.engine import TinyEngine, TinyEngineConfig
from hicache.engine.tiny_serving.records import TinyRecord, TinyReport
from hicache.engine.tiny_serving.reference import PageCheck, Reference, snapshot_rows

__all__ = [
    "TinyEngine", "TinyEngineConfig", "TinyRecord", "TinyReport",
    "TinyPools", "tiny_cache", "tiny_cache_config", "tiny_workload", "model_salt", "TINY_WORKLOAD",
    "Reference", "PageCheck", "snapshot_rows",
]
