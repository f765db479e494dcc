"""hicache's L3 store as the storage tier of SGLang's HiCache (``--hicache-storage-backend dynamic``).

SGLang's ``HiCacheController`` calls this class from three threads (prefetch query,
prefetch IO, backup) with page keys (chained SHA-256 hex digests) and host-pool indices.
Each registered host pool gets its own namespace in one shared store::

    SGLang call                         here                              hicache.storage
    ---------------------------------   -------------------------------   ---------------------
    batch_exists(keys)                  KV pool slot                      lookup (leading run)
    batch_get_v1 / batch_set_v1         page views inside the host pool   get / put (scatter/gather)
    batch_get / batch_set (legacy)      the flat page tensors SGLang made get / put
    batch_exists_v2(keys, transfers)    one verdict per pool              exists per pool
    batch_get_v2 / batch_set_v2         ALL_PAGES -> page objects,        get / put per pool
                                        TRAILING_PAGES -> state objects

A page is written from, and read straight into, the host pool's own memory: a
``page_first`` MHA page is its K and V regions, ``layer_first`` one region per layer and
K/V (:func:`~hicache.integrations.sglang.pages.byte_pieces`); a pool whose pages are not
views (Mamba's concatenated state) goes through one staging page. The object is always the
bytes of the pool's flat page, so the legacy and v1 paths read each other's writes.

Faults never raise: every call goes through :class:`~hicache.storage.L3Store` (short
timeouts, one circuit breaker shared by all pools), so a dead store is a miss or a refused
write and SGLang keeps serving from device and host memory.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from typing import Any, Optional

import torch
from sglang.srt.mem_cache.hicache_storage import (HiCacheStorage, HiCacheStorageConfig, PoolHitPolicy, PoolName,
                                                  PoolTransfer, PoolTransferResult)
from sglang.srt.observability.metrics_collector import StorageMetrics

from hicache.errors import MisuseError
from hicache.integrations.sglang.config import SGLangL3Config
from hicache.integrations.sglang.pages import (PoolSlot, key_hash, kind_of, pool_descriptor, pool_fingerprint,
                                              tensor_bytes)
from hicache.storage import CircuitBreaker, L3Store, ObjectKind, leading_true, mask_url, open_backend

logger = logging.getLogger(__name__)

KV = "kv"
_METRIC_SAMPLES = 4096  # per list, between two get_stats() calls


def _pool_name(name: Any) -> str:
    return str(getattr(name, "value", name))


class HiCacheStorageBackend(HiCacheStorage):
    """A ``HiCacheStorage`` over hicache's checked L3 objects (see module doc).

    Built by SGLang as ``cls(storage_config, kwargs)``; every setting comes from
    ``storage_config.extra_config`` (:class:`~hicache.integrations.sglang.config.SGLangL3Config`).
    """

    def __init__(self, storage_config: HiCacheStorageConfig, kwargs: Optional[dict] = None):
        self.storage_config = storage_config
        self.cfg = SGLangL3Config.from_extra_config(storage_config.extra_config)
        self.backend = open_backend(self.cfg.url, **self.cfg.backend_options)
        c = self.cfg.store
        self.breaker = CircuitBreaker(c.breaker_threshold, c.breaker_cooldown_s, c.breaker_max_cooldown_s)
        sc = storage_config
        self._ranks: dict[str, Any] = {"tp": [sc.tp_rank, sc.tp_size], "pp": [sc.pp_rank, sc.pp_size]}
        if sc.attn_cp_size > 1:
            self._ranks["cp"] = [sc.attn_cp_rank, sc.attn_cp_size]
        if sc.dcp_size > 1:
            self._ranks["dcp"] = [sc.dcp_rank, sc.dcp_size, sc.logical_page_size]
        self._lock = threading.Lock()
        self._slots: dict[str, PoolSlot] = {}
        self._metrics_on = bool(sc.enable_storage_metrics)
        self._metrics: dict[str, deque[float]] = {k: deque(maxlen=_METRIC_SAMPLES) for k in
                         ("prefetch_pgs", "backup_pgs", "prefetch_bandwidth", "backup_bandwidth")}
        self.mem_pool_host = None
        logger.info("hicache L3 backend for SGLang: %s (model %s, tp %d/%d, pp %d/%d%s)",
                    mask_url(self.cfg.url), sc.model_name, sc.tp_rank, sc.tp_size, sc.pp_rank, sc.pp_size,
                    ", replicated KV" if sc.is_mla_model else "")

    # -- pools --------------------------------------------------------------------------
    def register_mem_pool_host(self, mem_pool_host) -> None:
        super().register_mem_pool_host(mem_pool_host)
        self._register(KV, mem_pool_host)

    def register_mem_host_pool_v2(self, host_pool, host_pool_name) -> None:
        super().register_mem_host_pool_v2(host_pool, host_pool_name)
        self._register(_pool_name(host_pool_name), host_pool)

    def _register(self, name: str, pool) -> PoolSlot:
        with self._lock:
            slot = self._slots.get(name)
            if slot is not None and slot.pool is pool:
                return slot
        logical = getattr(pool, "kv_buffer", True) is None  # DeepSeek-V4's KV anchor holds no bytes
        page_bytes = 0
        if not logical:
            dummy = pool.get_dummy_flat_data_page()
            page_bytes = dummy.numel() * dummy.element_size()
        replicated = bool(self.storage_config.is_mla_model) and name != "mamba"
        desc = pool_descriptor(name, pool, page_bytes, model=self.storage_config.model_name or "",
                               ranks=self._ranks, replicated=replicated)
        store = L3Store(self.backend, pool_fingerprint(desc), self.cfg.salt, self.cfg.store,
                        breaker=self.breaker)
        slot = PoolSlot(name, pool, int(getattr(pool, "page_size", 1) or 1), page_bytes, replicated, store,
                        logical=logical)
        with self._lock:
            self._slots[name] = slot
        logger.info("hicache L3: pool %s -> namespace %s (%d B pages%s)", name, store.namespace, page_bytes,
                    ", logical" if logical else "")
        return slot

    def _slot(self, name: Any) -> PoolSlot:
        name = _pool_name(name)
        with self._lock:
            slot = self._slots.get(name)
        if slot is None:
            raise MisuseError(f"hicache L3: host pool {name!r} was never registered with this backend")
        return slot

    def namespaces(self) -> dict[str, str]:
        """Pool name -> L3 namespace (what ``hicache l3`` commands take)."""
        with self._lock:
            return {n: s.store.namespace for n, s in self._slots.items()}

    # -- data movement --------------------------------------------------------------------
    def _read(self, slot: PoolSlot, kind: ObjectKind, keys: list[str], rows: list[int]) -> int:
        """Read ``keys`` into host pages ``rows``; returns how many leading pages hit."""
        dsts: list = []
        staged: list[tuple[int, int, torch.Tensor]] = []  # (position, host row, staging page)
        for i, row in enumerate(rows):
            pieces = slot.pieces(row)
            if pieces is None:
                page = slot.staging_page()
                staged.append((i, row, page))
                dsts.append(tensor_bytes(page))
            else:
                dsts.append(pieces)
        t0 = time.perf_counter()
        res = slot.store.get([key_hash(k) for k in keys], kind, dsts)
        self._record("prefetch", res.hits, res.nbytes, time.perf_counter() - t0)
        for i, row, page in staged:
            if i < res.hits:
                slot.pool.set_from_flat_data_page(row, page)
        return res.hits

    def _write(self, slot: PoolSlot, kind: ObjectKind, keys: list[str], rows: list[int]) -> list[bool]:
        """Write host pages ``rows`` under ``keys`` (skipping stored ones); per-key success."""
        return self._put(slot, kind, keys, lambda i: slot.pieces(rows[i]) or [tensor_bytes(slot.flat_page(rows[i]))])

    def _put(self, slot: PoolSlot, kind: ObjectKind, keys: list[str], source) -> list[bool]:
        if not keys:
            return []
        if slot.replicated and not self.storage_config.is_storage_writer:
            return [True] * len(keys)  # every rank holds these bytes; the writer rank stores them
        hashes = [key_hash(k) for k in keys]
        have = slot.store.exists(hashes, kind) if self.cfg.skip_existing else [False] * len(keys)
        todo = [i for i, h in enumerate(have) if not h]
        out = list(have)
        if todo:
            srcs = [source(i) for i in todo]
            t0 = time.perf_counter()
            stored = slot.store.put([hashes[i] for i in todo], kind, srcs)
            nbytes = sum(sum(p.numel() for p in s) for s, ok in zip(srcs, stored) if ok)
            self._record("backup", sum(stored), nbytes, time.perf_counter() - t0)
            for i, ok in zip(todo, stored):
                out[i] = ok
        return out

    def _record(self, op: str, pages: int, nbytes: int, seconds: float) -> None:
        if not self._metrics_on or not pages:
            return
        with self._lock:
            self._metrics[f"{op}_pgs"].append(pages)
            self._metrics[f"{op}_bandwidth"].append(nbytes / max(seconds, 1e-9) / 1e9)

    # -- legacy interface -------------------------------------------------------------------
    def get(self, key: str, target_location: Optional[Any] = None, target_sizes: Optional[Any] = None):
        return self.batch_get([key], None if target_location is None else [target_location])[0]

    def batch_get(self, keys: list[str], target_locations: Optional[Any] = None,
                  target_sizes: Optional[Any] = None) -> list:
        """Read flat pages into ``target_locations`` (or new staging pages); None past the hits."""
        slot = self._slot(KV)
        targets = list(target_locations) if target_locations is not None else \
            [slot.staging_page() for _ in keys]
        t0 = time.perf_counter()
        res = slot.store.get([key_hash(k) for k in keys], ObjectKind.PAGE, [tensor_bytes(t) for t in targets])
        self._record("prefetch", res.hits, res.nbytes, time.perf_counter() - t0)
        return [t if i < res.hits else None for i, t in enumerate(targets)]

    def set(self, key: str, value: Optional[Any] = None, target_location: Optional[Any] = None,
            target_sizes: Optional[Any] = None) -> bool:
        return self.batch_set([key], None if value is None else [value])

    def batch_set(self, keys: list[str], values: Optional[Any] = None, target_locations: Optional[Any] = None,
                  target_sizes: Optional[Any] = None) -> bool:
        """Store flat page tensors; True when every key is now stored."""
        if values is None or len(values) != len(keys):
            return False
        flat = [v.contiguous() for v in values]
        return all(self._put(self._slot(KV), ObjectKind.PAGE, list(keys), lambda i: [tensor_bytes(flat[i])]))

    def exists(self, key: str) -> bool:
        return self._slot(KV).store.exists([key_hash(key)], ObjectKind.PAGE)[0]

    def batch_exists(self, keys: list[str], extra_info=None) -> int:
        """Leading keys stored (0 when the store is unreachable)."""
        slot = self._slot(KV)
        if slot.logical:
            return 0
        return slot.store.lookup([key_hash(k) for k in keys], ObjectKind.PAGE)

    # -- zero-copy v1 (``"interface_v1": 1``) -------------------------------------------------
    def batch_get_v1(self, keys: list[str], host_indices: torch.Tensor, extra_info=None) -> list[bool]:
        return self._get_pool(self._slot(KV), ObjectKind.PAGE, keys, host_indices)

    def batch_set_v1(self, keys: list[str], host_indices: torch.Tensor, extra_info=None) -> list[bool]:
        return self._set_pool(self._slot(KV), ObjectKind.PAGE, keys, host_indices)

    def _get_pool(self, slot: PoolSlot, kind: ObjectKind, keys: list[str], host_indices) -> list[bool]:
        rows = self._rows(slot, keys, host_indices)
        if not isinstance(rows, list):
            return [rows] * len(keys)
        hits = self._read(slot, kind, keys, rows) if keys else 0
        return [i < hits for i in range(len(keys))]

    def _set_pool(self, slot: PoolSlot, kind: ObjectKind, keys: list[str], host_indices) -> list[bool]:
        rows = self._rows(slot, keys, host_indices)
        return [rows] * len(keys) if not isinstance(rows, list) else self._write(slot, kind, keys, rows)

    @staticmethod
    def _rows(slot: PoolSlot, keys: list[str], host_indices) -> "list[int] | bool":
        """The first host row of each key's page, or the answer for every key: True for a
        logical anchor (nothing is stored; v2 pools carry the data), False for a mismatch."""
        if slot.logical:
            return True
        rows = slot.host_rows(host_indices, len(keys))
        if rows is None:
            logger.error("hicache L3: %d keys but %s host indices for pool %s", len(keys),
                         None if host_indices is None else host_indices.numel(), slot.name)
            return False
        return rows

    # -- v2: hybrid pools ------------------------------------------------------------------
    def batch_exists_v2(self, keys: list[str], pool_transfers: Optional[list[PoolTransfer]] = None,
                        extra_info=None) -> PoolTransferResult:
        """The usable prefix: every page of it has KV, every ALL_PAGES pool has all its pages
        up to there, and every TRAILING_PAGES pool has the window ending there."""
        anchor = self._slot(KV)
        kv_pages = len(keys) if anchor.logical else self.batch_exists(keys, extra_info)
        hit_pages: dict = {PoolName.KV: kv_pages} if kv_pages else {}
        restorable = set(range(1, kv_pages + 1))
        hashes = [key_hash(k) for k in keys[:kv_pages]]
        for t in pool_transfers or []:
            if not restorable:
                break
            slot = self._slot(t.name)
            flags = slot.store.exists(hashes, kind_of(t.hit_policy)) if hashes else []
            if t.hit_policy == PoolHitPolicy.TRAILING_PAGES:
                window = max(1, len(t.keys) if t.keys else 1)
                ok = {p for p in range(1, kv_pages + 1) if all(flags[max(0, p - window):p])}
                boundary = max(ok, default=0)
            elif t.hit_policy == PoolHitPolicy.BLOCK_GROUPS:
                group = max(1, t.group_pages or 1)
                verdict = leading_true(flags) // group * group
                if verdict:
                    hit_pages[t.name] = verdict
                continue  # a second form of the history: reported, never gates the KV hit
            else:
                boundary = leading_true(flags)
                ok = set(range(1, boundary + 1))
            if boundary:
                hit_pages[t.name] = boundary
            restorable &= ok
        ordered = sorted(restorable)
        return PoolTransferResult(ordered[-1] if ordered else 0, hit_pages, ordered)

    def batch_get_v2(self, transfers: list[PoolTransfer], extra_info=None) -> dict:
        return {t.name: self._get_pool(self._slot(t.name), kind_of(t.hit_policy), list(t.keys or []),
                                       t.host_indices) for t in transfers}

    def batch_set_v2(self, transfers: list[PoolTransfer], extra_info=None) -> dict:
        return {t.name: self._set_pool(self._slot(t.name), kind_of(t.hit_policy), list(t.keys or []),
                                       t.host_indices) for t in transfers}

    # -- stats and lifetime ------------------------------------------------------------------
    def get_stats(self) -> StorageMetrics:
        """Per-op samples since the last call, in SGLang's ``StorageMetrics`` shape (pages
        per batch and GB/s of payload), recorded when SGLang enables storage metrics."""
        out = StorageMetrics()
        with self._lock:
            for name, samples in self._metrics.items():
                getattr(out, name).extend(samples)
                samples.clear()
        return out

    def hicache_stats(self) -> dict[str, dict]:
        """Pool name -> the L3 store's counters (hits, rejections by reason, faults by type,
        breaker state): what an operator reads next to SGLang's own metrics."""
        with self._lock:
            slots = dict(self._slots)
        return {n: s.store.stats(backend=False).to_dict() for n, s in slots.items()}

    def clear(self) -> None:
        """Not done from one engine: the store is shared by every engine using the URL.
        Pages of a retired model age out (LRU), or an operator purges its namespaces with
        ``hicache l3 purge --url URL --namespace NS``."""
        logger.warning("hicache L3: clear() ignored; the store %s may be shared. Purge this engine's "
                       "namespaces with `hicache l3 purge`: %s", mask_url(self.cfg.url), self.namespaces())

    def close(self) -> None:
        with self._lock:
            slots = list(self._slots.values())
        for s in slots:
            s.store.close()
        self.backend.close()

    def __repr__(self) -> str:
        return f"HiCacheStorageBackend({mask_url(self.cfg.url)}, pools={sorted(self._slots)})"
