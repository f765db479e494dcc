"""Reference serving loop pieces that embed :class:`hicache.HiCache` the way an engine would.

Interface: :class:`StressRunner` / :class:`StressConfig` / :class:`StressReport` (random
traffic with byte checks, ``hicache stress``). Subpackages: :mod:`hicache.engine.workloads`,
:mod:`hicache.engine.tiny_model`, :mod:`hicache.engine.tiny_serving`.
"""

from hicache.engine.stress import StressConfig, StressReport, StressRunner

__all__ = ["StressConfig", "StressReport", "StressRunner"]
