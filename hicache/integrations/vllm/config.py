"""``kv_connector_extra_config`` of :class:`~hicache.integrations.vllm.connector.HiCacheConnector`
-> a hicache layout and config (no vLLM import: vLLM's KV cache groups arrive as
:class:`GroupGeometry`).

The extra config is the ``cache:`` section of a hicache config file, inline, plus keys of
its own::

    {"config": "/etc/hicache/vllm.yaml",          # optional: a config file's cache: section
     "async_lookup": false,                       # true: L3 lookups never block the scheduler
     "storage_url": "file:///mnt/kvcache", "host_bytes": "8GiB"}   # inline keys win

The layout never comes from the file: vLLM decides it (its groups, block size, dtype), so
a file written for another model's layout still serves its budgets and policies. Defaults
that differ from a plain ``HiCacheConfig`` because of where the connector sits:
``host_layout: page_first`` (L3 fetches land in host objects) and a 256 MiB staging pool
(``device_bytes``; a page lives there from the step vLLM computes it until hicache moves it
to host, so it holds the running requests' pages, not the cache).

``async_lookup`` is off by default: a request whose pages L3 may hold then waits in the
scheduler for the existence round trip (bounded by the store's timeout and breaker), and
vLLM schedules exactly as it would without L3. On, vLLM is told "ask again" until the
answer is back, so the request waits a step or more while others run; the batches then
differ from a run without hicache, and so (bf16 rounding of other chunkings) may greedy
tokens.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping, Sequence

from hicache.config import HiCacheConfig, cache_config_from_mapping
from hicache.errors import ConfigError
from hicache.integrations.vllm.windows import window_slots
from hicache.layout import CacheLayout, FamilySpec, read_config_file
from hicache.units import check_bool

DEFAULTS = {"host_layout": "page_first", "device_bytes": "256MiB", "device": "cpu"}


@dataclass(frozen=True)
class GroupGeometry:
    """One vLLM KV cache group, as hicache needs it: ``kind`` is ``full`` or ``sliding``;
    ``block_bytes`` is one layer's bytes of one block (``layer_bytes``: per layer, where
    they differ -- DeepSeek-V4 groups its indexer keys with compressed KV of two ratios); ``window``: a sliding group's window
    in tokens (vLLM's ``sliding_window`` plus any ``extra_retained_tokens``); ``layer_ids``:
    the model's layer index of each layer (empty, or repeated within one family: numbered
    in group order), which orders hicache's per-layer loads the way the forward runs."""

    kind: str
    layers: tuple[str, ...]
    block_tokens: int
    block_bytes: int
    window: int = 0
    layer_ids: tuple[int, ...] = ()
    layer_bytes: tuple[int, ...] = ()

    def widths(self) -> tuple[int, ...]:
        """Each layer's bytes of one block (``layer_bytes``, or ``block_bytes`` for all)."""
        return self.layer_bytes or (self.block_bytes,) * len(self.layers)


def family_names(groups: Sequence[GroupGeometry]) -> tuple[str, ...]:
    """The hicache family of each group: ``kv`` for the first full-attention group (the
    only one of a model without sliding windows), ``kv<i>`` for other full ones and
    ``swa<i>`` for sliding-window ones (``i``: the group's index in vLLM's config)."""
    first_full = next((i for i, g in enumerate(groups) if g.kind == "full"), -1)
    return tuple("kv" if i == first_full else f"swa{i}" if g.kind == "sliding" else f"kv{i}"
                 for i, g in enumerate(groups))


def group_families(groups: Sequence[GroupGeometry]) -> tuple[tuple[tuple[str, tuple[int, ...]], ...], ...]:
    """Per group, its hicache families as (name, indices of the group's layers): one per
    distinct block width, in the order the widths first appear; the first keeps the
    group's name (:func:`family_names`), the next ones add ``_1``, ``_2``, ...::

        group 3 (DeepSeek-V4, block 256): indexer keys 8,448 B, layer 1's c4 KV 37,376 B,
        layer 2's c128 KV 1,168 B  ->  (kv, (0,)), (kv_1, (1,)), (kv_2, (2,))

    Every family of a group moves the same units (pages, or snapshot slots) in each copy."""
    out = []
    for name, g in zip(family_names(groups), groups):
        widths = g.widths()
        order = list(dict.fromkeys(widths))
        out.append(tuple((name if k == 0 else f"{name}_{k}", tuple(i for i, w in enumerate(widths) if w == width))
                         for k, width in enumerate(order)))
    return tuple(out)


def layout_for(groups: Sequence[GroupGeometry], model: str = "") -> CacheLayout:
    """One family per vLLM KV cache group (per block width in it, :func:`group_families`);
    a row is one vLLM block of one layer, a page one block of the full-attention groups
    (their block size is hicache's page size). A full-attention group is history (one
    block per page and layer); a sliding-window group is state, its snapshot keeping, per
    layer, the blocks of the window at the boundary (:func:`~.windows.window_slots` of them, in the
    group's own block size, which must divide the page: DeepSeek-V4's window KV has
    64-token blocks, its compressor states 4 and 8, its compressed KV and indexer 256).
    Compressed history (vLLM's ``tokens_per_state`` > 1) needs nothing more: a block's
    bytes are what vLLM keeps for its tokens. Anything else (Mamba, chunked-local, a
    bounded-replay window) is refused."""
    if not groups:
        raise ConfigError("kv_cache_groups", [], "vLLM reported no KV cache group")
    full = [g for g in groups if g.kind == "full"]
    if not full:
        raise ConfigError("kv_cache_groups", [g.kind for g in groups],
                          "HiCacheConnector needs at least one full-attention group (hicache's history)")
    page = full[0].block_tokens
    families = []
    fams = group_families(groups)
    next_id = 0
    for i, g in enumerate(groups):
        if g.kind not in ("full", "sliding"):
            raise ConfigError(f"kv_cache_groups[{i}]", g.kind,
                              "HiCacheConnector serves full-attention and sliding-window KV cache groups only")
        if g.kind == "full" and g.block_tokens != page:
            raise ConfigError(f"kv_cache_groups[{i}].block_size", g.block_tokens,
                              f"differs from the first full-attention group's {page}: one hicache page per block")
        if g.block_tokens < 1 or page % g.block_tokens:
            raise ConfigError(f"kv_cache_groups[{i}].block_size", g.block_tokens,
                              f"does not divide the full-attention block size {page}")
        layer_ids = g.layer_ids or tuple(range(next_id, next_id + len(g.layers)))
        if len(layer_ids) != len(g.layers):
            raise ConfigError(f"kv_cache_groups[{i}].layer_ids", list(layer_ids), f"one per layer of {len(g.layers)}")
        next_id += len(g.layers)
        if len(g.widths()) != len(g.layers):
            raise ConfigError(f"kv_cache_groups[{i}].layer_bytes", list(g.layer_bytes), f"one per layer of {len(g.layers)}")
        for name, idx in fams[i]:
            width = g.widths()[idx[0]]
            ids = tuple(layer_ids[j] for j in idx)
            if len(set(ids)) != len(ids):        # two caches of one model layer in one family
                ids = tuple(next_id - len(g.layers) + j for j in idx)
            families.append(FamilySpec(name=name, kind="history" if g.kind == "full" else "state", layer_ids=ids,
                                       tokens_per_row=g.block_tokens, row_bytes=width,
                                       rows_kept=window_slots(g.window, g.block_tokens) if g.kind == "sliding" else 0))
    return CacheLayout(families=tuple(families), page_tokens=page, model=model)


def connector_config(extra: Mapping[str, Any] | None, *, model: str) -> tuple[HiCacheConfig, dict[str, Any]]:
    """The cache config (defaults, then the file's ``cache:`` section, then inline keys) and
    the connector's own options. Unknown keys fail in one line naming the key
    (``cache_config_from_mapping``)."""
    extra = dict(extra or {})
    async_lookup = extra.pop("async_lookup", False)
    check_bool("kv_connector_extra_config.async_lookup", async_lookup)
    section: dict[str, Any] = dict(DEFAULTS)
    path = extra.pop("config", None)
    if path is not None:
        if not isinstance(path, str):
            raise ConfigError("kv_connector_extra_config.config", path, "must be a path to a hicache config file")
        data = read_config_file(path)
        file_section = data.get("cache") or {}
        if not isinstance(file_section, Mapping):
            raise ConfigError("cache", file_section, "must be a mapping of cache settings", source=path)
        section.update(file_section)
        model = str(data.get("model") or model)
    section.update(extra)
    cfg = cache_config_from_mapping(section, model=model, source="kv_connector_extra_config")
    return cfg, {"async_lookup": async_lookup}
