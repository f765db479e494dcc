"""``HiCacheSecondaryTier``: an out-of-tree secondary tier for vLLM's ``TieringOffloadingSpec``.

vLLM builds it from one ``secondary_tiers`` entry of ``kv_connector_extra_config``::

    {"type": "HiCacheSecondaryTier", "module_path": "hicache.integrations.vllm.tier",
     "url": "redis://cache-host:6379/0", "salt": "my-model", "threads": 2,
     "l3": {"breaker_threshold": 3, "read_batch": 16}}

and calls it from the scheduler thread only, so every call here is short and
non-blocking (the contract of vLLM's ``SecondaryTierManager``):

* ``lookup(key)``: HIT / MISS / RETRY. A key whose store to this tier is still in flight
  is RETRY; a key this process stored is a HIT at once; any other key is asked of L3 by
  vLLM's own ``AsyncLookupManager`` (batched ``EXISTS`` on its thread, flushed at the end
  of each scheduler step), RETRY until the answer arrives.
* ``submit_store`` / ``submit_load``: queued to :class:`~.transfers.TransferRunner`
  threads, which write the primary tier's rows to L3 (skipping chunks L3 already holds)
  or read L3 objects straight into the primary rows, verified.
* ``get_finished_jobs`` / ``drain_jobs``: results as vLLM ``JobResult``\\ s; a load that
  fails part-way reports the keys that did load, and marks the rest as misses so the
  scheduler recomputes them instead of promoting them again.

Keys: a vLLM ``OffloadKey`` is a block hash plus a KV cache group index. Each group is
its own hicache namespace (fingerprint: model, dtype, row bytes, parallel layout, and the
group's tokens per block and layers; salt: ``salt``, default the model name), so groups
and models never read each other's chunks, and ``hicache l3 stats`` shows them apart.
An unreachable or misbehaving store turns into misses and failed jobs, never exceptions.
"""

from __future__ import annotations

import hashlib
import json
import time
from collections import OrderedDict
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any, ClassVar, Optional

try:
    from vllm.v1.kv_offload.base import (LookupResult, Medium, OffloadKey, ReqContext, RequestOffloadingContext,
                                         ScheduleEndContext, get_offload_block_hash, get_offload_group_idx)
    from vllm.v1.kv_offload.config import OffloadingConfig
    from vllm.v1.kv_offload.tiering.async_lookup import AsyncLookupManager
    from vllm.v1.kv_offload.tiering.base import JobResult, SecondaryTierManager, TransferJob
except ImportError as exc:  # this module is what vLLM loads; hicache itself never imports it
    raise ImportError(f"hicache.integrations.vllm.tier needs vLLM with the tiering offload API "
                      f"(vllm>=0.32): {exc}") from exc

from hicache.units import check_int
from hicache.errors import ConfigError
from hicache.integrations.vllm.transfers import GroupStores, JobKind, TransferJob as HcJob, TransferRunner
from hicache.storage import L3Config, mask_url, open_backend

if TYPE_CHECKING:  # imported where metrics are served: it needs prometheus_client
    from hicache.cache import PrometheusExporter

RECENT_KEYS = 1 << 16   # keys this process stored, answered HIT without asking L3


def layout_fields(spec: Any, row_bytes: int) -> dict:
    """What makes two engines' chunks interchangeable (no rank: a primary row holds every
    worker's part of the block; no parallel sizes when vLLM says the bytes are portable)."""
    fields: dict[str, Any] = {"engine": "vllm", "row_bytes": row_bytes}
    cfg = getattr(spec, "config", None)
    if isinstance(cfg, OffloadingConfig):
        fields.update(model=cfg.model.name, dtype=str(cfg.model.dtype),
                      tokens_per_hash=cfg.cache.tokens_per_hash, blocks_per_chunk=cfg.cache.blocks_per_chunk,
                      replicated=bool(cfg.replicated_layout), canonical=bool(cfg.canonical_layout),
                      kv_cache_layout=cfg.kv_cache_layout)
        p = cfg.parallel
        if not p.is_parallelism_agnostic:
            fields.update(world_size=p.world_size, tp=p.tp_size, pp=p.pp_size, pcp=p.pcp_size, dcp=p.dcp_size)
    return fields


def group_fingerprint(spec: Any, fields: dict, group: int) -> str:
    """``v`` + 15 hex digits of SHA-256 over the layout fields and the group's geometry."""
    cfg = getattr(spec, "config", None)
    g: dict[str, Any] = {"group": group}
    if isinstance(cfg, OffloadingConfig) and group < len(cfg.groups):
        grp = cfg.groups[group]
        g.update(tokens_per_block=grp.tokens_per_block, layers=list(grp.layer_names), group_id=grp.group_id)
    blob = json.dumps({**fields, **g}, sort_keys=True, separators=(",", ":"))
    return "v" + hashlib.sha256(blob.encode()).hexdigest()[:15]


def split_key(key: OffloadKey) -> tuple[bytes, int]:
    return get_offload_block_hash(key), get_offload_group_idx(key)


class _L3Lookups(AsyncLookupManager):
    """vLLM's batching lookup manager, asking the L3 stores (one ``EXISTS`` batch per group)."""

    def __init__(self, stores: GroupStores, tier_type: str):
        self._stores = stores
        super().__init__(tier_type=tier_type)

    def batch_lookup(self, keys: list[OffloadKey], req_context: ReqContext) -> Iterable[bool]:
        found = [False] * len(keys)
        by_group: dict[int, list[int]] = {}
        for i, key in enumerate(keys):
            by_group.setdefault(get_offload_group_idx(key), []).append(i)
        for group, idxs in by_group.items():
            flags = self._stores(group).exists([get_offload_block_hash(keys[i]) for i in idxs], "page")
            for i, f in zip(idxs, flags):
                found[i] = f
        return found


class HiCacheSecondaryTier(SecondaryTierManager):
    """A vLLM secondary tier over a hicache L3 store (see module doc)."""

    medium: ClassVar[Medium] = Medium.STORAGE

    def __init__(self, offloading_spec: Any, primary_kv_view: memoryview, tier_type: str,
                 url: str = "memory://", salt: Optional[str] = None, threads: int = 2,
                 l3: Optional[dict] = None, locality: Optional[str] = None, metrics_port: Optional[int] = None,
                 metrics_addr: str = "127.0.0.1", backpressure_detector: Any = None):
        super().__init__(offloading_spec=offloading_spec, primary_kv_view=primary_kv_view, tier_type=tier_type,
                         backpressure_detector=backpressure_detector)
        check_int("secondary_tiers.threads", threads, minimum=1)
        try:
            cfg = L3Config(**(l3 or {}))
        except TypeError as exc:
            raise ConfigError("secondary_tiers.l3", sorted(l3 or {}), f"unknown L3Config field ({exc})") from None
        if locality is not None:
            from vllm.v1.kv_offload.base import Locality

            self.locality = Locality(locality)
        spec_cfg = getattr(offloading_spec, "config", None)
        if salt is None:
            salt = spec_cfg.model.name if isinstance(spec_cfg, OffloadingConfig) else ""
        self.url = mask_url(url)
        fields = layout_fields(offloading_spec, self.block_size_bytes)
        self.stores = GroupStores(open_backend(url), lambda g: group_fingerprint(offloading_spec, fields, g),
                                  salt, cfg)
        self.runner = TransferRunner(self.stores, primary_kv_view, threads=threads)
        self._lookups = _L3Lookups(self.stores, tier_type)
        self._storing: dict[OffloadKey, int] = {}        # key -> store jobs in flight with it
        self._jobs: dict[int, TransferJob] = {}          # vLLM's job metadata by id
        self._recent: OrderedDict[OffloadKey, None] = OrderedDict()
        self.counters: dict[str, int] = {k: 0 for k in (
            "lookups", "lookup_hits", "lookup_misses", "lookup_retries", "stores", "store_failures",
            "stored_chunks", "skipped_chunks", "loads", "load_failures", "loaded_chunks", "failed_chunks")}
        self.exporter: PrometheusExporter | None = None
        self._exported_at = 0.0
        if metrics_port is not None:
            self._serve_metrics(metrics_port, metrics_addr, salt, spec_cfg)

    def _serve_metrics(self, port: int, addr: str, model: str, spec_cfg: Any) -> None:
        """The tier runs in vLLM's engine-core (scheduler) process, whose registry vLLM's
        ``/metrics`` does not serve: export ours on a port of its own."""
        from hicache.cache import PrometheusExporter

        check_int("secondary_tiers.metrics_port", port, minimum=0, maximum=65535, reason="must be a TCP port number")
        dp = spec_cfg.parallel.data_parallel_index if isinstance(spec_cfg, OffloadingConfig) else 0
        model = spec_cfg.model.name if isinstance(spec_cfg, OffloadingConfig) else model
        self.exporter = PrometheusExporter(self, labels={"model_name": model, "rank": dp})
        self.exporter.serve(port, addr)

    # -- lookups ------------------------------------------------------------------------
    def lookup(self, key: OffloadKey, req_context: ReqContext) -> LookupResult:
        self.counters["lookups"] += 1
        if key in self._storing:
            result = LookupResult.RETRY
        elif key in self._recent:
            self._recent.move_to_end(key)
            result = LookupResult.HIT
        else:
            found = self._lookups.lookup(key, req_context)
            result = LookupResult.RETRY if found is None else LookupResult.HIT if found else LookupResult.MISS
        self.counters[{LookupResult.HIT: "lookup_hits", LookupResult.MISS: "lookup_misses",
                       LookupResult.RETRY: "lookup_retries"}[result]] += 1
        return result

    def on_new_request(self, req_context: ReqContext) -> RequestOffloadingContext:
        return RequestOffloadingContext()

    def on_request_finished(self, req_context: ReqContext) -> None:
        self._lookups.cleanup(req_context.req_id)

    def on_schedule_end(self, context: ScheduleEndContext) -> None:
        self._lookups.flush()
        if self.exporter is not None and time.monotonic() - self._exported_at >= 1.0:
            self._exported_at = time.monotonic()
            self.exporter.update()   # at most once a second; a scrape reads this copy

    # -- transfers ----------------------------------------------------------------------
    def _submit(self, job: TransferJob, kind: JobKind) -> None:
        keys = tuple(job.keys)
        slots = tuple(int(c) for c in job.chunk_ids)
        assert len(keys) == len(slots), f"{len(keys)} keys but {len(slots)} chunk ids"
        self._jobs[job.job_id] = job
        self.runner.submit(HcJob(job.job_id, kind, keys, tuple(split_key(k) for k in keys), slots))

    def submit_store(self, job_metadata: TransferJob) -> None:
        for key in job_metadata.keys:
            self._storing[key] = self._storing.get(key, 0) + 1
        self.counters["stores"] += 1
        self._submit(job_metadata, "store")

    def submit_load(self, job_metadata: TransferJob) -> None:
        self.counters["loads"] += 1
        self._submit(job_metadata, "load")

    def get_finished_jobs(self) -> Iterable[JobResult]:
        results = []
        for done in self.runner.poll():
            job = self._jobs.pop(done.job_id)
            if done.kind == "store":
                for key in job.keys:
                    left = self._storing[key] - 1
                    if left:
                        self._storing[key] = left
                    else:
                        del self._storing[key]
                    if done.ok:
                        self._remember(key)
                if done.ok:
                    self.counters["stored_chunks"] += len(job.keys)
                else:
                    self.counters["store_failures"] += 1
                self.counters["skipped_chunks"] += done.skipped
            else:
                loaded = set(job.keys) if done.ok else set(done.loaded or ())
                failed = [k for k in job.keys if k not in loaded]
                if failed:
                    # The scheduler recomputes these; make sure it does not promote them again.
                    self._lookups.mark_miss(failed)
                    for key in failed:
                        self._recent.pop(key, None)
                    self.counters["load_failures"] += 1
                    self.counters["failed_chunks"] += len(failed)
                self.counters["loaded_chunks"] += len(loaded)
            results.append(JobResult(job_id=done.job_id, success=done.ok,
                                     successful_keys=done.loaded, transfer_time=done.seconds,
                                     transfer_bytes=done.nbytes))
        return results

    def _remember(self, key: OffloadKey) -> None:
        self._recent[key] = None
        self._recent.move_to_end(key)
        if len(self._recent) > RECENT_KEYS:
            self._recent.popitem(last=False)

    def has_pending_work(self) -> bool:
        return bool(self._jobs)

    def drain_jobs(self) -> None:
        """Block until every submitted job has finished; results stay for the next
        :meth:`get_finished_jobs` (a copy in progress is never cut short)."""
        self.runner.drain()

    def shutdown(self) -> None:
        self.runner.drain()
        self.runner.close()
        self._lookups.shutdown()
        self.stores.close()
        if self.exporter is not None:
            self.exporter.close()

    # -- stats --------------------------------------------------------------------------
    def stats(self) -> dict:
        """This tier's counters (lookups by result, jobs, chunks moved)."""
        return dict(self.counters)

    def l3_stats(self) -> list[dict]:
        """``L3Store.stats()`` of each group's store (``to_dict`` form)."""
        return [s.stats(backend=False).to_dict() for s in self.stores.all()]
