"""The L3 tier: backends behind one protocol, objects with checked headers, async backup,
prefetch primitives and a circuit breaker. Imports only :mod:`hicache.layout` (and
``errors``/``units``).

Interface:

* :func:`open_backend` (``memory://``, ``file:///dir``, ``redis://``, ``rediss://``,
  ``unix:///sock``, ``redis+cluster://h1:p1,h2:p2``) -> a :class:`StorageBackend`
  (protocol :data:`STORAGE_PROTOCOL_VERSION`).
* :class:`L3Store` (one layout fingerprint + salt in one backend): ``lookup``, ``exists``,
  ``get`` (into pool rows, verified), ``put``, ``put_async`` / ``poll_backups`` / ``flush``,
  ``stats``, ``close``.
* :class:`Prefetcher` / :class:`PrefetchOp`: lookup -> plan -> fetch -> take.
* Configs :class:`L3Config`, :class:`PrefetchConfig`; results :class:`GetResult`,
  :class:`PutTicket`, :class:`PrefetchPlan`, :class:`PrefetchResult`, :class:`StoreStats`,
  :class:`BackendStats`; faults in :mod:`hicache.storage.faults`.

See ``docs/storage.md``.
"""

from hicache.storage.backend import STORAGE_PROTOCOL_VERSION, BackendStats, StorageBackend, leading_true
from hicache.storage.backup import BackupQueue, PutTicket
from hicache.storage.config import PREFETCH_POLICIES, L3Config, PrefetchConfig
from hicache.storage.faults import (CircuitBreaker, StorageConnectionError, StorageProtocolError,
                                    StorageServerError, StorageTimeout)
from hicache.storage.auth import ObjectKeys, check_source as check_key_source
from hicache.storage.objects import (FORMAT_VERSION, HEADER_BYTES, ObjectCodec, ObjectKind, Reject,
                                     make_namespace)
from hicache.storage.prefetch import PrefetchOp, PrefetchPlan, Prefetcher, PrefetchResult, PrefetchStatus
from hicache.storage.store import GetResult, L3Store, StoreStats
from hicache.storage.survey import MAC_UNCHECKED, check_namespace, purge, survey, verify
from hicache.storage.url import SCHEMES, mask_url, memory_store_name, open_backend, with_memory_store_name

__all__ = [
    "STORAGE_PROTOCOL_VERSION", "StorageBackend", "BackendStats", "leading_true",
    "survey", "verify", "MAC_UNCHECKED", "purge", "check_namespace", "open_backend", "SCHEMES", "mask_url",
    "L3Store", "L3Config", "GetResult", "StoreStats", "PutTicket", "BackupQueue",
    "Prefetcher", "PrefetchConfig", "PrefetchOp", "PrefetchPlan", "PrefetchResult", "PrefetchStatus",
    "PREFETCH_POLICIES", "ObjectKind", "ObjectCodec", "Reject", "make_namespace", "memory_store_name", "with_memory_store_name", "FORMAT_VERSION",
    "HEADER_BYTES", "CircuitBreaker", "StorageTimeout", "StorageConnectionError", "StorageProtocolError",
    "StorageServerError", "ObjectKeys", "check_key_source",
]
