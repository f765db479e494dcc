"""Reference serving loop pieces that embed :class:`hicache.HiCache` the way an engine would.

Interface:

* :class:`ReferenceEngine` / :class:`EngineConfig` / :class:`EngineReport` /
  :class:`RequestRecord` / :class:`EngineRequest` (what it reads of a request): the serving
  loop ``hicache replay`` runs (continuous batching, chunked prefill, mid-flight publish, L3
  prefetch, a virtual clock: :class:`ClockConfig`, :func:`clock_from_mapping`).
* :func:`run_fleet` / :func:`run_fleet_processes` / :data:`ROUTINGS`: several engines (in this
  process, or each in its own) behind a router on one virtual
  clock, sharing one L3 store (``hicache fleet``).
* :class:`StressRunner` / :class:`StressConfig` / :class:`StressReport`: random traffic with
  byte checks (``hicache stress``).
* :mod:`contents` (synthetic page bytes and their checks), :mod:`kvsim` (kvcache-simulator's
  policies at our budgets), :mod:`hybrid_ref` (the same LRU resumed only at snapshots).

Subpackages: :mod:`hicache.engine.workloads`, :mod:`hicache.engine.tiny_model`,
:mod:`hicache.engine.tiny_serving`.
"""

from hicache.engine import contents, hybrid_ref, kvsim
from hicache.engine.clock import ClockConfig, clock_from_mapping
from hicache.engine.fleet import ROUTINGS, FleetRun, run_fleet
from hicache.engine.fleet_proc import check_shareable, run_fleet_processes
from hicache.engine.loop import ReferenceEngine, request_slots
from hicache.engine.records import (ADMISSION_POLICIES, EngineConfig, EngineReport, EngineRequest,
                                    RequestRecord)
from hicache.engine.stress import StressConfig, StressReport, StressRunner

__all__ = ["ReferenceEngine", "request_slots", "EngineConfig", "EngineReport", "EngineRequest", "RequestRecord",
           "ADMISSION_POLICIES",
           "ClockConfig", "clock_from_mapping", "StressConfig", "StressReport", "StressRunner",
           "contents", "hybrid_ref", "kvsim", "run_fleet", "run_fleet_processes", "check_shareable", "FleetRun", "ROUTINGS"]
