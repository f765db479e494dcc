"""``HiCacheConnector``: hicache as vLLM's host and L3 KV tiers, a ``KVConnectorBase_V1``.

vLLM loads it by module path, no fork or registration::

    LLM(model, kv_transfer_config=KVTransferConfig(
        kv_connector="HiCacheConnector", kv_connector_module_path="hicache.integrations.vllm.connector",
        kv_role="kv_both", kv_load_failure_policy="recompute",
        kv_connector_extra_config={"storage_url": "file:///mnt/kvcache", "host_bytes": "8GiB"}))

vLLM's paged blocks are L1; hicache's radix tree, host pool and L3 keep what vLLM computed
(:mod:`~hicache.integrations.vllm.bridge` has the per-request protocol). The scheduler side
answers ``get_num_new_matched_tokens`` from hicache's match past vLLM's own prefix hit,
leases the prefix in ``update_state_after_alloc`` and ships a :class:`StepPlan` in the
connector metadata; the worker side copies pages into the allocated blocks layer by layer
(``wait_for_layer_load`` waits only for that layer's host->pool copy) and copies the
blocks each step completes out after each layer's attention (``save_kv_layer``), one
batched copy per layer; ``wait_for_save`` acks them and the scheduler publishes.

It declares ``SupportsHMA``: vLLM keeps its hybrid KV cache manager, one KV cache group
per attention kind. Full-attention groups are hicache history families (pages, as above);
a sliding-window group is a hicache state family whose snapshot per boundary is the
window's blocks there (:mod:`~.windows`), saved from and loaded into the window blocks
vLLM holds for the request, one batched copy per layer like the pages. Groups may have
different block sizes (DeepSeek-V4: window KV 64 tokens, compressor states 4 and 8,
compressed KV and indexer 256): hicache's page is the full-attention groups' block, a
window group's blocks divide it. Group kinds that are neither (Mamba, chunked-local,
R-SWA, a bounded-replay sliding MLA) are refused at start.

Both sides share one :class:`~.bridge.Bridge` per engine (keyed by vLLM's engine id):
with one worker (tensor and pipeline parallel size 1) vLLM runs the scheduler and the
worker in one process, in-process or in its engine-core process alike. More workers are
refused at start (their pages would live in other processes).
"""

from __future__ import annotations

import logging
import threading
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Optional

try:
    from vllm.distributed.kv_transfer.kv_connector.v1.base import (KVConnectorBase_V1, KVConnectorMetadata,
                                                                   KVConnectorRole, SupportsHMA)
    from vllm.model_executor.models.utils import extract_layer_index
    from vllm.distributed.kv_transfer.kv_connector.v1.metrics import KVConnectorPromMetrics, KVConnectorStats
    from vllm.v1.kv_cache_interface import (FullAttentionSpec, MLAAttentionSpec, SlidingWindowMLASpec,
                                              SlidingWindowSpec)
except ImportError as exc:  # this module is what vLLM loads; hicache itself never imports it
    raise ImportError(f"hicache.integrations.vllm.connector needs vLLM with KVConnectorBase_V1 (vllm>=0.32): "
                      f"{exc}") from exc

from hicache.cache import HiCache
from hicache.errors import ConfigError
from hicache.integrations.vllm.blocks import BlockCopier
from hicache.integrations.vllm.bridge import Bridge
from hicache.integrations.vllm.plan import StepPlan
from hicache.integrations.vllm.config import GroupGeometry, connector_config, group_families, layout_for

if TYPE_CHECKING:
    import torch

log = logging.getLogger(__name__)
_LOCK = threading.Lock()
_BRIDGES: dict[str, list] = {}   # engine id -> [Bridge, sides holding it, its groups]


def bridge_for(engine_id: str) -> Optional[Bridge]:
    """The live bridge of an engine (tests and benchmarks read its counters)."""
    with _LOCK:
        entry = _BRIDGES.get(engine_id)
        return entry[0] if entry else None


def _kind(spec: Any) -> str:
    """``full``, ``sliding`` or the spec's class name (refused by ``layout_for``)."""
    # exact types: a subclass that keeps other blocks (RSWASpec a middle gap) is refused
    # by name rather than copied as if it did not. Sliding MLA (DeepSeek-V4's window KV
    # and compressor states) runs under vLLM's own SlidingWindowManager, so it keeps the
    # same window -- unless it replays a bounded prefix instead of caching one.
    if type(spec) is SlidingWindowSpec or (type(spec) is SlidingWindowMLASpec
                                           and not getattr(spec, "bounded_replay", False)):
        return "sliding"
    return "full" if type(spec) in (FullAttentionSpec, MLAAttentionSpec) else type(spec).__name__


def _geometry(kv_cache_config: Any) -> list[GroupGeometry]:
    out = []
    for i, g in enumerate(kv_cache_config.kv_cache_groups):
        spec = g.kv_cache_spec
        # a group of layers of one kind but different shapes (DeepSeek-V4's compressed KV
        # and indexer) comes as UniformTypeKVCacheSpecs: one spec per layer
        per_layer = getattr(spec, "kv_cache_specs", None) or {name: spec for name in g.layer_names}
        layer_specs = [per_layer.get(name, spec) for name in g.layer_names]
        kinds = {_kind(s) for s in layer_specs}
        if len(kinds) != 1 or len({s.block_size for s in layer_specs}) != 1:
            raise ConfigError(f"kv_cache_groups[{i}]", sorted(kinds),
                              "HiCacheConnector needs one attention kind and one block size per group")
        first = layer_specs[0]
        kind = kinds.pop()
        if kind == "sliding" and len({(s.sliding_window, getattr(s, "extra_retained_tokens", 0))
                                      for s in layer_specs}) != 1:
            raise ConfigError(f"kv_cache_groups[{i}].sliding_window", [s.sliding_window for s in layer_specs],
                              "HiCacheConnector needs one window per group")
        window = first.sliding_window + getattr(first, "extra_retained_tokens", 0) if kind == "sliding" else 0
        try:
            ids = tuple(extract_layer_index(name) for name in g.layer_names)
        except (AssertionError, ValueError):   # a name without one index: numbered in group order
            ids = ()
        # the bytes a block holds, not the padding vLLM aligns pages to (V4: 37,376 of 37,440)
        widths = tuple(getattr(s, "real_page_size_bytes", s.page_size_bytes) for s in layer_specs)
        out.append(GroupGeometry(kind, tuple(g.layer_names), spec.block_size, widths[0], window, ids,
                                 widths if len(set(widths)) > 1 else ()))
    return out


def _hooked_layers(vllm_config: Any, names: Any) -> set[str]:
    """The layers vLLM wraps with the connector's per-layer hooks: its ``Attention`` and
    ``MLAAttention`` modules, whose forward functions carry ``maybe_transfer_kv_layer``.
    DeepSeek-V4's caches (window, compressor, indexer) and its CPU attention are modules of
    their own that never call them; an unknown module counts as unhooked (copied at the
    step's ends: always right, only not overlapped with the forward)."""
    try:
        from vllm.model_executor.layers.attention.attention import Attention
        from vllm.model_executor.layers.attention.mla_attention import MLAAttention
    except ImportError:
        return set()
    ctx = getattr(vllm_config.compilation_config, "static_forward_context", {}) or {}
    return {name for name in names if isinstance(ctx.get(name), (Attention, MLAAttention))}


def _acquire(vllm_config: Any, kv_cache_config: Any) -> tuple[str, Bridge, list[GroupGeometry]]:
    """The engine's bridge and the groups it was built from, made by the first side to ask.
    Both sides use those groups: vLLM gives the worker's connector one spec per layer
    (``UniformTypeKVCacheSpecs``) but the scheduler's a merged spec per group, whose one
    block width is the first layer's (DeepSeek-V4's indexer keys for all three caches of
    its compressed group). The worker's side comes first in vLLM 0.32; were the scheduler's
    first, the worker's copiers would refuse the widths at start (one line), not copy."""
    engine_id = vllm_config.kv_transfer_config.engine_id
    with _LOCK:
        entry = _BRIDGES.get(engine_id)
        if entry is None:
            model = f"{vllm_config.model_config.model}|{vllm_config.model_config.dtype}"
            groups = _geometry(kv_cache_config)
            layout = layout_for(groups, model=str(vllm_config.model_config.model))
            cfg, opts = connector_config(vllm_config.kv_transfer_config.kv_connector_extra_config, model=model)
            entry = _BRIDGES[engine_id] = [Bridge(HiCache(layout, cfg), layout.page_tokens,
                                                  windows=[g.window for g in groups],
                                                  group_blocks=[g.block_tokens for g in groups], **opts), 0, groups]
        entry[1] += 1
        return engine_id, entry[0], entry[2]


def _drop(engine_id: str) -> None:
    with _LOCK:
        entry = _BRIDGES.get(engine_id)
        if entry is None:
            return
        entry[1] -= 1
        if entry[1] > 0:
            return
        del _BRIDGES[engine_id]
    entry[0].close()


@dataclass
class HiCacheConnectorMetadata(KVConnectorMetadata):
    plan: StepPlan = field(default_factory=StepPlan)


class HiCacheStats(KVConnectorStats):
    """The bridge's counters since the last report (lookups, tokens promised and loaded,
    pages saved and published, failures), summed over an interval by vLLM's logger."""

    def reset(self) -> None:
        self.data: dict[str, Any] = {}

    def aggregate(self, other: Any) -> "HiCacheStats":
        for k, v in other.data.items():
            self.data[k] = self.data.get(k, 0) + v
        return self

    def reduce(self) -> dict[str, int | float]:
        return dict(self.data)

    def is_empty(self) -> bool:
        return not any(self.data.values())


# What HiCacheStats carries (Bridge.stats(): the bridge's counters and the cache's), each a
# Prometheus counter ``vllm:hicache_<name>`` with vLLM's per-engine labels.
PROM_COUNTERS = {
    "lookups": "scheduler lookups answered by hicache",
    "lookups_deferred": "lookups answered 'ask again' while an L3 prefetch was in flight",
    "lookup_hit_tokens": "tokens hicache promised beyond vLLM's own prefix cache",
    "loaded_tokens": "tokens loaded into vLLM's blocks",
    "load_failed_tokens": "promised tokens whose load failed (vLLM recomputes them)",
    "saved_pages": "pages copied out of vLLM's blocks into hicache",
    "save_failures": "saves that failed",
    "published_pages": "pages published into hicache's tree",
    "finished": "requests finished",
    "loaded_snapshots": "sliding-window snapshots loaded into vLLM's window blocks",
    "saved_snapshots": "sliding-window snapshots copied out of vLLM's window blocks",
    "published_snapshots": "sliding-window snapshots published into hicache's tree",
    "cache_hit_tokens": "hicache's hit tokens (all tiers)",
    "cache_match_tokens": "tokens hicache was asked to match",
    "cache_loaded_pages": "pages hicache loaded host -> pool",
    "cache_l3_hit_tokens": "hit tokens served from L3",
    "cache_l3_prefetched_pages": "pages prefetched from L3",
    "cache_l3_put_objects": "objects written to L3",
}


class HiCachePromMetrics(KVConnectorPromMetrics):
    """hicache's counters in vLLM's Prometheus registry: ``observe`` adds each interval's
    deltas (:class:`HiCacheStats`) to ``vllm:hicache_<name>`` for the engine's labels."""

    def __init__(self, vllm_config: Any, metric_types: dict, labelnames: list[str],
                 per_engine_labelvalues: dict[int, list[object]]):
        super().__init__(vllm_config, metric_types, labelnames, per_engine_labelvalues)
        self.counters: dict[str, dict[int, Any]] = {}
        for name, doc in PROM_COUNTERS.items():
            metric = self._counter_cls(name=f"vllm:hicache_{name}", documentation=f"hicache: {doc}",
                                       labelnames=labelnames)
            self.counters[name] = {i: metric.labels(*values) for i, values in per_engine_labelvalues.items()}

    def observe(self, transfer_stats_data: dict[str, Any], engine_idx: int = 0) -> None:
        for name, value in transfer_stats_data.items():
            per_engine = self.counters.get(name)
            if per_engine is not None and engine_idx in per_engine and value > 0:
                per_engine[engine_idx].inc(value)


class HiCacheConnector(KVConnectorBase_V1, SupportsHMA):
    """hicache behind vLLM's paged KV (see module doc). ``SupportsHMA``: vLLM keeps its
    hybrid KV cache manager (one group per attention kind); full-attention groups are
    hicache history, sliding-window groups hicache state (:mod:`~.windows`)."""

    def __init__(self, vllm_config: Any, role: Any, kv_cache_config: Any = None):
        super().__init__(vllm_config=vllm_config, role=role, kv_cache_config=kv_cache_config)
        par = vllm_config.parallel_config
        if par.world_size > 1:
            raise ConfigError("parallel_config.world_size", par.world_size,
                              "HiCacheConnector serves one worker (tensor and pipeline parallel size 1)")
        self._engine_id, self.bridge, self._groups = _acquire(vllm_config, kv_cache_config)
        self._copiers: list[BlockCopier] = []          # one per hicache family
        self._copier_group: list[int] = []             # the KV cache group of each
        self._copier: Optional[BlockCopier] = None     # the first family's (tests patch it)
        self._where: dict[str, tuple[int, int, int, int]] = {}   # layer -> (group, copier, index in it, layer id)
        self._bulk: tuple[str, ...] = ()                # layers without vLLM's per-layer hooks
        self._failed: set[int] = set()
        self._failed_reqs: set[str] = set()
        self._saved_now: set[str] = set()               # layers saved this step
        self._save_units: dict[int, tuple[list[int], list[int]]] = {}   # this step's (pages, blocks) per group
        self._live: dict[str, Any] = {}   # scheduler: running requests (vLLM's objects, live)
        self._asked: dict[str, int] = {}  # scheduler: the local hit each lookup was asked past
        self._closed = False

    # -- worker side ------------------------------------------------------------------------
    def register_kv_caches(self, kv_caches: dict[str, "torch.Tensor"]) -> None:
        """One copier per hicache family over vLLM's caches (each checked: blocks first, one
        run of bytes per block, vLLM's block count). Layers vLLM does not wrap with the
        connector's per-layer hooks (:func:`_hooked_layers`) are copied at the step's start
        (loads) and end (saves) instead."""
        layout = self.bridge.cache.layout
        view = self.bridge.cache.pools.device.view
        num_blocks = getattr(self._kv_cache_config, "num_blocks", None)
        for g, (geom, fams) in enumerate(zip(self._groups, group_families(self._groups))):
            for name, idx in fams:
                layers = [geom.layers[i] for i in idx]
                fam = layout.family(name)
                for j, layer in enumerate(layers):
                    self._where[layer] = (g, len(self._copiers), j, fam.layer_ids[j])
                slots = fam.rows_kept or 1      # a snapshot's window blocks; a history page is one
                self._copiers.append(BlockCopier(kv_caches, layers, view(name), slots, num_blocks=num_blocks))
                self._copier_group.append(g)
        self._copier = self._copiers[0]
        hooked = _hooked_layers(self._vllm_config, self._where)
        self._bulk = tuple(name for name in self._where if name not in hooked)
        if self._bulk:
            log.info("hicache vLLM connector: %d of %d KV cache layers have no per-layer hooks in vLLM "
                     "(copied at each step's start and end)", len(self._bulk), len(self._where))

    def _plan(self) -> StepPlan:
        meta = self._get_connector_metadata()
        assert isinstance(meta, HiCacheConnectorMetadata), type(meta)
        return meta.plan

    def start_load_kv(self, forward_context: Any, **kwargs: Any) -> None:
        """The scheduler's lease already queued hicache's host->pool copies; each hooked
        layer is copied into vLLM's blocks when its attention asks for it
        (``wait_for_layer_load``), every other layer here, before the forward."""
        self._failed_reqs = set()
        self._saved_now, self._save_units = set(), {}
        self._failed.update(self._plan().failed)
        for name in self._bulk:
            self._load_layer(name)

    def wait_for_layer_load(self, layer_name: str) -> None:
        if layer_name not in self._bulk:
            self._load_layer(layer_name)

    def _load_layer(self, layer_name: str) -> None:
        plan = self._plan()
        where = self._where.get(layer_name)
        if not plan.loads or where is None:
            return
        g, c, layer, model_layer = where
        pages: list[int] = []
        blocks: list[int] = []
        for op in plan.loads:
            if op.req in self._failed_reqs or not self.bridge.wait_load(op.req, model_layer):
                self._failed_reqs.add(op.req)
                self._failed.update(b for ids in op.blocks for b in ids)
                continue
            pages.extend(op.pages[g])
            blocks.extend(op.blocks[g])
        self._copiers[c].load(layer, pages, blocks)

    def save_kv_layer(self, layer_name: str, kv_layer: "torch.Tensor", attn_metadata: Any, **kwargs: Any) -> None:
        self._save_layer(layer_name, kv_layer)

    def _save_layer(self, layer_name: str, kv_layer: Optional["torch.Tensor"]) -> None:
        plan = self._plan()
        where = self._where.get(layer_name)
        if not plan.saves or where is None or layer_name in self._saved_now:
            return
        g, c, layer, _ = where
        units = self._save_units.get(g)
        if units is None:                       # once per group and step, not per layer
            units = self._save_units[g] = ([p for op in plan.saves for p in op.pages[g]],
                                           [b for op in plan.saves for b in op.blocks[g]])
        self._copiers[c].save(layer, units[0], units[1], kv_layer)
        self._saved_now.add(layer_name)

    def wait_for_save(self) -> None:
        """Every layer not saved by ``save_kv_layer`` this step (no hooks, or attention
        skipped) is saved here from its registered cache: vLLM still holds the blocks.
        The copies are synchronous, so a save is good unless its request's loads failed."""
        if not self.has_connector_metadata():
            return
        for name in self._where:
            self._save_layer(name, None)
        self._saved_now, self._save_units = set(), {}
        self.bridge.report_saves([(op.key, op.req not in self._failed_reqs) for op in self._plan().saves])

    def get_block_ids_with_load_errors(self) -> set[int]:
        """Blocks whose load failed: vLLM recomputes them. With several KV cache groups vLLM
        cannot map block ids back to requests (it raises), so none are reported there: the
        lease is taken at lookup, so only a failed host->pool copy gets here, and that
        request computes on what its blocks hold (logged; its saves are dropped)."""
        out, self._failed = self._failed, set()
        if out and len(self._groups) > 1:
            log.error("hicache vLLM connector: %d blocks failed to load on a hybrid layout; "
                      "vLLM cannot recompute them (no per-block failures with several KV cache groups)", len(out))
            return set()
        return out

    # -- scheduler side ---------------------------------------------------------------------
    def get_num_new_matched_tokens(self, request: Any, num_computed_tokens: int) -> tuple[int | None, bool]:
        self._asked[request.request_id] = num_computed_tokens
        return self.bridge.lookup(request.all_token_ids, num_computed_tokens, request.request_id), False

    def update_state_after_alloc(self, request: Any, blocks: Any, num_external_tokens: int) -> None:
        # vLLM sets request.num_computed_tokens after this call: the external tokens start
        # at the block-aligned local hit it showed get_num_new_matched_tokens.
        local = self._asked.pop(request.request_id, 0) if num_external_tokens else 0
        self._live[request.request_id] = request
        self.bridge.open(request.request_id, request.all_token_ids, local, num_external_tokens,
                         blocks.get_block_ids(), prompt_tokens=request.num_prompt_tokens)

    def build_connector_meta(self, scheduler_output: Any) -> KVConnectorMetadata:
        assert self._kv_cache_manager is not None, "vLLM binds the KV cache manager before scheduling"
        steps = []
        for req_id, n in scheduler_output.num_scheduled_tokens.items():
            req = self._live.get(req_id)
            if req is not None:   # num_computed_tokens is still the count before this step
                steps.append((req_id, req.all_token_ids, req.num_computed_tokens + n,
                              self._kv_cache_manager.get_block_ids(req_id)))
        return HiCacheConnectorMetadata(self.bridge.plan(steps))

    def request_finished(self, request: Any, block_ids: list[int]) -> tuple[bool, dict[str, Any] | None]:
        """Publish and release. The blocks can go at once: every page hicache keeps was
        copied out of them during the forward that computed it."""
        self._live.pop(request.request_id, None)
        self._asked.pop(request.request_id, None)
        self.bridge.finish(request.request_id)
        return False, None

    def request_finished_all_groups(self, request: Any,
                                    block_ids: tuple[list[int], ...]) -> tuple[bool, dict[str, Any] | None]:
        """The hybrid manager's finish (every group's blocks): as :meth:`request_finished`;
        the window blocks a snapshot needed were copied out in the step that reached it."""
        return self.request_finished(request, block_ids[0] if block_ids else [])

    def get_kv_connector_stats(self) -> Optional[HiCacheStats]:
        return HiCacheStats(data=self.bridge.take_stats_delta())

    @classmethod
    def build_kv_connector_stats(cls, data: dict[str, Any] | None = None) -> Optional[HiCacheStats]:
        return HiCacheStats(data=dict(data or {}))

    @classmethod
    def build_prom_metrics(cls, vllm_config: Any, metric_types: dict, labelnames: list[str],
                           per_engine_labelvalues: dict[int, list[object]]) -> HiCachePromMetrics:
        return HiCachePromMetrics(vllm_config, metric_types, labelnames, per_engine_labelvalues)

    def shutdown(self) -> None:
        if not self._closed:
            self._closed = True
            _drop(self._engine_id)
