"""Frozen configs of the storage layer: the L3 store and the prefetcher.

``hicache.config.StorageConfig`` (the ``cache:`` section of a config file) carries the URL,
salt and prefetch policy; the facade maps it onto these.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

from hicache.units import check_int, check_number
from hicache.errors import ConfigError
from hicache.storage.auth import check_source

PREFETCH_POLICIES = ("best_effort", "wait_complete", "timeout")


def _pos_int(name: str, v: object, minimum: int = 1) -> None:
    check_int(name, v, minimum=minimum)


def _pos_float(name: str, v: object) -> None:
    check_number(name, v, reason="must be > 0")


@dataclass(frozen=True)
class L3Config:
    """How the L3 store batches, retries, trips its breaker and bounds its backup queue.

    * ``lookup_batch``: keys per existence round trip (a lookup stops at the first miss).
    * ``read_batch``: objects per backend read; a prefetch reports progress per batch.
    * ``read_retries``: extra attempts for a read after a transport fault (writes: none).
    * ``breaker_*``: consecutive faults to open the breaker, first and longest cooldown.
    * ``backup_queue_objects`` / ``backup_queue_bytes``: the bound of pending backups;
      beyond it a backup is dropped (counted), never waited for.
    * ``backup_batch``: objects per backend write.
    * ``backup_skip_existing``: ask L3 first and skip objects already there (a fleet
      sharing one store writes each shared page once).
    * ``auth_key``: authenticated objects (:mod:`hicache.storage.auth`): where the MAC
      keys are, ``env:NAME`` or ``file:/abs/path`` (never a key itself); None: off.
    """

    lookup_batch: int = 64
    read_batch: int = 16
    read_retries: int = 1
    breaker_threshold: int = 3
    breaker_cooldown_s: float = 1.0
    breaker_max_cooldown_s: float = 30.0
    backup_queue_objects: int = 1024
    backup_queue_bytes: int = 256 << 20
    backup_batch: int = 16
    backup_skip_existing: bool = True
    auth_key: Optional[str] = None

    def __post_init__(self) -> None:
        if self.auth_key is not None:
            check_source(self.auth_key, "auth_key")
        for name in ("lookup_batch", "read_batch", "breaker_threshold", "backup_queue_objects",
                     "backup_queue_bytes", "backup_batch"):
            _pos_int(name, getattr(self, name))
        _pos_int("read_retries", self.read_retries, minimum=0)
        _pos_float("breaker_cooldown_s", self.breaker_cooldown_s)
        _pos_float("breaker_max_cooldown_s", self.breaker_max_cooldown_s)
        if self.breaker_max_cooldown_s < self.breaker_cooldown_s:
            raise ConfigError("breaker_max_cooldown_s", self.breaker_max_cooldown_s,
                              f"must be >= breaker_cooldown_s={self.breaker_cooldown_s}")


@dataclass(frozen=True)
class PrefetchConfig:
    """How a prefetch from L3 into host memory behaves.

    * ``policy``: when the caller takes the result, ``best_effort`` uses what is complete
      now, ``wait_complete`` waits for the whole fetch, ``timeout`` waits up to
      ``timeout_s`` from the start of the prefetch and then uses what is complete.
    * ``threshold_pages``: an L3 hit shorter than this is not fetched (SGLang's default is
      256 tokens: one page).
    * ``max_host_bytes``: host memory that prefetches may hold at once (None: unbounded);
      a plan is shortened to fit, or skipped.
    * ``state_probe_limit``: how many boundaries back from the deepest page hit to look for a
      state snapshot (hybrid layouts).
    """

    policy: str = "best_effort"
    timeout_s: float = 0.5
    threshold_pages: int = 1
    max_host_bytes: Optional[int] = None
    state_probe_limit: int = 64

    def __post_init__(self) -> None:
        if self.policy not in PREFETCH_POLICIES:
            raise ConfigError("prefetch_policy", self.policy, f"must be one of {list(PREFETCH_POLICIES)}")
        _pos_float("prefetch_timeout_s", self.timeout_s)
        _pos_int("prefetch_threshold_pages", self.threshold_pages, minimum=0)
        if self.max_host_bytes is not None:
            _pos_int("prefetch_max_host_bytes", self.max_host_bytes)
        _pos_int("state_probe_limit", self.state_probe_limit)
