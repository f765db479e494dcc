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
from hicache.layout import CacheLayout, FamilySpec, read_config_file

DEFAULTS = {"host_layout": "page_first", "device_bytes": "256MiB", "device": "cpu"}


@dataclass(frozen=True)
class GroupGeometry:
    """One vLLM KV cache group, as hicache needs it: ``kind`` is ``full`` or ``sliding``;
    ``block_bytes`` is one layer's bytes of one block."""

    kind: str
    layers: tuple[str, ...]
    block_tokens: int
    block_bytes: int


def layout_for(groups: Sequence[GroupGeometry], model: str = "") -> CacheLayout:
    """One history family per full-attention group (every layer of it, a block's bytes per
    page and layer). A page is one vLLM block."""
    if not groups:
        raise ConfigError("kv_cache_groups", [], "vLLM reported no KV cache group")
    families = []
    for i, g in enumerate(groups):
        if g.kind != "full":
            raise ConfigError(f"kv_cache_groups[{i}]", g.kind,
                              "HiCacheConnector serves full-attention KV cache groups only in this version "
                              "(a sliding-window group would be a hicache state family)")
        if g.block_tokens != groups[0].block_tokens:
            raise ConfigError(f"kv_cache_groups[{i}].block_size", g.block_tokens,
                              f"differs from group 0's {groups[0].block_tokens}: one hicache page per vLLM block")
        if g.block_bytes % g.block_tokens:
            raise ConfigError(f"kv_cache_groups[{i}].page_size_bytes", g.block_bytes,
                              f"not a multiple of the block size {g.block_tokens}")
        families.append(FamilySpec(name=f"kv{i}" if i else "kv", kind="history",
                                   layer_ids=tuple(range(len(g.layers))), tokens_per_row=1,
                                   row_bytes=g.block_bytes // g.block_tokens))
    if len(families) > 1:
        raise ConfigError("kv_cache_groups", len(families),
                          "HiCacheConnector serves one KV cache group in this version")
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
