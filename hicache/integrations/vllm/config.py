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

DEFAULTS = {"host_layout": "page_first", "device_bytes": "256MiB", "device": "cpu"}


@dataclass(frozen=True)
class GroupGeometry:
    """One vLLM KV cache group, as hicache needs it: ``kind`` is ``full`` or ``sliding``;
    ``block_bytes`` is one layer's bytes of one block; ``window``: a sliding group's window
    in tokens (vLLM's ``sliding_window`` plus any ``extra_retained_tokens``); ``layer_ids``:
    the model's layer index of each layer (empty: numbered in group order), which orders
    hicache's per-layer loads the way the forward runs."""

    kind: str
    layers: tuple[str, ...]
    block_tokens: int
    block_bytes: int
    window: int = 0
    layer_ids: tuple[int, ...] = ()


def family_names(groups: Sequence[GroupGeometry]) -> tuple[str, ...]:
    """The hicache family of each group: ``kv`` for the first full-attention group (the
    only one of a model without sliding windows), ``kv<i>`` for other full ones and
    ``swa<i>`` for sliding-window ones (``i``: the group's index in vLLM's config)."""
    first_full = next((i for i, g in enumerate(groups) if g.kind == "full"), -1)
    return tuple("kv" if i == first_full else f"swa{i}" if g.kind == "sliding" else f"kv{i}"
                 for i, g in enumerate(groups))


def layout_for(groups: Sequence[GroupGeometry], model: str = "") -> CacheLayout:
    """One family per vLLM KV cache group; a page is one vLLM block. A full-attention group
    is a history family (every layer of it, a block's bytes per page and layer); a
    sliding-window group a state family whose snapshot keeps, per layer, the blocks of the
    window at the boundary (:func:`~.windows.window_slots` of them). Anything else (Mamba,
    chunked-local, MLA-specific kinds) is refused."""
    if not groups:
        raise ConfigError("kv_cache_groups", [], "vLLM reported no KV cache group")
    families = []
    names = family_names(groups)
    next_id = 0
    for i, g in enumerate(groups):
        if g.kind not in ("full", "sliding"):
            raise ConfigError(f"kv_cache_groups[{i}]", g.kind,
                              "HiCacheConnector serves full-attention and sliding-window KV cache groups only")
        if g.block_tokens != groups[0].block_tokens:
            raise ConfigError(f"kv_cache_groups[{i}].block_size", g.block_tokens,
                              f"differs from group 0's {groups[0].block_tokens}: one hicache page per vLLM block")
        if g.block_bytes % g.block_tokens:
            raise ConfigError(f"kv_cache_groups[{i}].page_size_bytes", g.block_bytes,
                              f"not a multiple of the block size {g.block_tokens}")
        layer_ids = g.layer_ids or tuple(range(next_id, next_id + len(g.layers)))
        if len(layer_ids) != len(g.layers):
            raise ConfigError(f"kv_cache_groups[{i}].layer_ids", list(layer_ids), f"one per layer of {len(g.layers)}")
        next_id += len(g.layers)
        row_bytes = g.block_bytes // g.block_tokens
        if g.kind == "full":
            families.append(FamilySpec(name=names[i], kind="history", layer_ids=layer_ids, tokens_per_row=1,
                                       row_bytes=row_bytes))
        else:
            slots = window_slots(g.window, g.block_tokens)
            families.append(FamilySpec(name=names[i], kind="state", layer_ids=layer_ids, tokens_per_row=1,
                                       row_bytes=row_bytes, rows_kept=slots * g.block_tokens))
    if not any(g.kind == "full" for g in groups):
        raise ConfigError("kv_cache_groups", [g.kind for g in groups],
                          "HiCacheConnector needs at least one full-attention group (hicache's history)")
    return CacheLayout(families=tuple(families), page_tokens=groups[0].block_tokens, model=model)


def connector_config(extra: Mapping[str, Any] | None, *, model: str) -> tuple[HiCacheConfig, dict[str, Any]]:
    """The cache config (defaults, then the file's ``cache:`` section, then inline keys) and
    the connector's own options. Unknown keys fail in one line naming the key
    (``cache_config_from_mapping``)."""
    extra = dict(extra or {})
    async_lookup = extra.pop("async_lookup", False)
    if not isinstance(async_lookup, bool):
        raise ConfigError("kv_connector_extra_config.async_lookup", async_lookup, "must be true or false")
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
