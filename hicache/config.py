"""The ``cache:`` section of a config file: one frozen config per layer, parsed at the edge.

A config file has three top-level keys::

    model: deepseek-v4-flash      # a name; the default L3 salt
    layout: {...}                 # hicache.layout: families and page size
    cache: {...}                  # this module: budgets and policies per layer

Like :mod:`hicache.cache`, this module wires layers together (it knows every layer's
config); layers themselves never import it.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Any, Mapping

from hicache.units import check_bool, check_int, check_number
from hicache.errors import ConfigError
from hicache.layout import CacheLayout, layout_from_mapping, load_hf_config, read_config_file
from hicache.pools import PoolConfig
from hicache.storage import check_key_source, mask_url
from hicache.units import parse_bytes

WRITE_POLICIES = ("write_through", "write_through_selective", "write_back")
HOST_TIERS = ("inclusive", "exclusive")
EVICTION_POLICIES = ("lru", "lfu", "value", "reuse", "reuse-prompt", "reuse-prompt-late", "probation", "adaptive")
# What ``adaptive`` may follow (each also an ``eviction`` of its own; docs/policy.md).
ADAPTIVE_CANDIDATES = ("lru", "lfu", "value", "reuse", "reuse-prompt", "reuse-prompt-late", "probation")
DEFAULT_CANDIDATES = ("lru", "value", "reuse", "reuse-prompt", "reuse-prompt-late", "probation")
PREFETCH_POLICIES = ("best_effort", "wait_complete", "timeout")
NO_L3 = "none://"   # the storage URL of a cache without L3
L3_ADMIT_MODES = ("off", "published", "reused")


def check_adaptive_z(field: str, value: object) -> float:
    """``adaptive_z`` (config key or flag): standard deviations a switch's lead must clear."""
    return check_number(field, value, positive=False, minimum=0.0, maximum=100.0,
                        reason="must be a number of standard deviations, 0 (off) to 100")


def check_lookups(field: str, value: object) -> int:
    """A count of lookups, 0 (off) or more (config key or flag): ``adaptive_trial``, the
    lookups a switch is tried for first; ``adaptive_dead_outputs``, the prompts seen to go
    past a decode's start, none into one, before the floor drops idle tails first."""
    return check_int(field, value, minimum=0, reason="must be a number of lookups, 0 (off) or more")


@dataclass(frozen=True)
class TreeConfig:
    """Radix tree policies: eviction order and state-snapshot retention.

    ``retention_interval``: None keeps a snapshot at every published boundary; 0 keeps only
    the latest prompt boundary and the finish boundary of each request; N > 0 also keeps
    every N-th token boundary (N a multiple of ``page_tokens``).

    ``eviction``: ``lru``, ``lfu``, ``value`` (intermediate snapshots first, branch points
    last), ``reuse`` / ``reuse-prompt`` (snapshots ranked by what requests were seen to
    resume from), or ``adaptive``: the cache follows whichever of ``adaptive_candidates``
    hit most in its ghost over the last ``adaptive_window`` lookups, switching only for a
    lead of more than ``adaptive_margin`` of the pages looked up in the window, or of
    ``adaptive_margin_hits`` of the followed candidate's hits in it where that is less (low
    hit rates; never under a tenth of the page margin; 0 turns it off). With
    ``adaptive_floor`` (and ``lru`` among the candidates) a followed candidate whose ghost
    hit less than LRU's over the window is left at once, for the candidate that hit most
    in it, and only a candidate whose ghost hit at least as much as LRU's over the last
    ``adaptive_record`` windows is taken at all. A switch's lead must also exceed
    ``adaptive_z`` standard deviations of the per-lookup hit differences it sums (hits come
    in lumps of whole chains; 0 turns the test off). With ``adaptive_trial`` N > 0 a switch
    the cache could decline is first tried for N lookups in a copy of the followed
    candidate's ghost ranking by the new order, and taken only if that copy beat the
    followed ghost by such a lead (what a switch costs from where the cache stands, which
    a ghost that followed the new order all along does not show), and the floor's exit
    goes to ``lru`` itself, other candidates being tried from there. With
    ``adaptive_dead_outputs`` N > 0 (and the floor on) the floor drops a decode's idle tail
    first (``lru-tails``) once N prompts were seen to go on past where a decode began
    without entering its output and none ever entered one (page keys, apart from any
    tree: :mod:`hicache.tree.outputs`); the first prompt that enters one sends it back to
    plain LRU for good. No switch before ``adaptive_window``
    lookups: the first candidate (``lru`` in the defaults) is followed until the ghosts'
    scores cover a whole window
    (:mod:`hicache.tree.selector`, docs/policy.md).
    """

    eviction: str = "lru"
    retention_interval: int | None = None
    adaptive_candidates: tuple[str, ...] = DEFAULT_CANDIDATES
    adaptive_window: int = 300
    adaptive_margin: float = 0.03
    adaptive_margin_hits: float = 0.1
    adaptive_floor: bool = True
    adaptive_record: int = 4
    adaptive_z: float = 2.0
    adaptive_trial: int = 300
    adaptive_dead_outputs: int = 32

    def __post_init__(self) -> None:
        if self.eviction not in EVICTION_POLICIES:
            raise ConfigError("eviction", self.eviction, f"must be one of {list(EVICTION_POLICIES)}")
        r = self.retention_interval
        check_int("retention_interval", r, optional=True, reason="must be null, 0 or a positive token count")
        c = self.adaptive_candidates
        if (not isinstance(c, (list, tuple)) or not c or any(x not in ADAPTIVE_CANDIDATES for x in c)
                or len(set(c)) != len(c)):
            raise ConfigError("adaptive_candidates", list(c) if isinstance(c, (list, tuple)) else c,
                              f"must be a list of distinct names from {list(ADAPTIVE_CANDIDATES)}")
        object.__setattr__(self, "adaptive_candidates", tuple(c))
        check_int("adaptive_window", self.adaptive_window, minimum=1, reason="must be a positive number of lookups")
        check_number("adaptive_margin", self.adaptive_margin, positive=False, minimum=0.0, maximum=1.0,
                     reason="must be a fraction of the window's looked-up pages, 0 to 1")
        check_number("adaptive_margin_hits", self.adaptive_margin_hits, positive=False, minimum=0.0, maximum=1.0,
                     reason="must be a fraction of the followed candidate's hits, 0 to 1")
        check_bool("adaptive_floor", self.adaptive_floor)
        check_int("adaptive_record", self.adaptive_record, minimum=1, reason="must be a positive number of windows")
        check_adaptive_z("adaptive_z", self.adaptive_z)
        check_lookups("adaptive_trial", self.adaptive_trial)
        check_lookups("adaptive_dead_outputs", self.adaptive_dead_outputs)


@dataclass(frozen=True)
class WriteConfig:
    """When device pages are backed up to the host tier, and whether host keeps them.

    ``host_tier``: ``inclusive`` (default) keeps a host copy after it is loaded back to the
    device, so evicting that page again costs no copy; ``exclusive`` frees the host copy
    once the load lands, so the device and host budgets hold *different* pages (about
    device + host pages of distinct prefixes instead of about host pages), at the price of
    one more device-to-host copy when the page is evicted again. Exclusive needs
    ``write_back``: with write-through the host copy is the backup made at publish, and
    dropping it would lose the page on eviction.
    """

    write_policy: str = "write_through_selective"
    write_through_threshold: int = 2
    host_tier: str = "inclusive"

    def __post_init__(self) -> None:
        if self.write_policy not in WRITE_POLICIES:
            raise ConfigError("write_policy", self.write_policy, f"must be one of {list(WRITE_POLICIES)}")
        if self.host_tier not in HOST_TIERS:
            raise ConfigError("host_tier", self.host_tier, f"must be one of {list(HOST_TIERS)}")
        if self.host_tier == "exclusive" and self.write_policy != "write_back":
            raise ConfigError("host_tier", self.host_tier,
                              f"needs write_policy write_back (got {self.write_policy}): an exclusive "
                              "host tier takes pages only when the device evicts them")
        t = self.write_through_threshold
        check_int("write_through_threshold", t, minimum=1)


@dataclass(frozen=True, repr=False)
class StorageConfig:
    """The L3 tier: backend URL, key salt and prefetch policy.

    The URL may carry a password: ``repr()`` and every error show it masked.
    """

    url: str = "memory://"
    salt: str = ""
    prefetch_policy: str = "best_effort"
    prefetch_timeout_s: float = 0.5
    prefetch_threshold_tokens: int = 256
    auth_key: str = ""   # where the L3 MAC keys are (env:NAME, file:/path); "": off (storage/auth.py)

    def __post_init__(self) -> None:
        if self.auth_key != "":
            check_key_source(self.auth_key, "storage_auth_key")
        if not isinstance(self.url, str) or "://" not in self.url:
            raise ConfigError("storage_url", mask_url(self.url) if isinstance(self.url, str) else self.url,
                              "must be a URL like memory://, file:///dir or redis://host:port/0")
        if not isinstance(self.salt, str):
            raise ConfigError("storage_salt", self.salt, "must be text")
        if self.prefetch_policy not in PREFETCH_POLICIES:
            raise ConfigError("prefetch_policy", self.prefetch_policy,
                              f"must be one of {list(PREFETCH_POLICIES)}")
        t = self.prefetch_timeout_s
        check_number("prefetch_timeout_s", t, reason="must be a finite number of seconds > 0")
        t = self.prefetch_threshold_tokens
        check_int("prefetch_threshold_tokens", t)

    def __repr__(self) -> str:
        return (f"StorageConfig(url={mask_url(self.url)!r}, salt={self.salt!r}, "
                f"prefetch_policy={self.prefetch_policy!r}, prefetch_timeout_s={self.prefetch_timeout_s!r}, "
                f"prefetch_threshold_tokens={self.prefetch_threshold_tokens!r}, auth_key={self.auth_key!r})")


@dataclass(frozen=True)
class AdmitConfig:
    """L3 admission: which chains go to L3 on their own, whatever the host tier does.

    Without it L3 receives only what the host evicts (docs/storage.md), so at budgets where
    the host never fills a second engine finds nothing. A *chain* is the history pages from
    the root to a boundary plus the snapshot kept there: what another process needs to
    resume (issue 26). ``mode``: ``published`` -- every kept snapshot at least
    ``min_tokens`` deep becomes a candidate when it is published; ``reused`` -- only once a
    request resumed from or through it; ``off`` -- none (L3 only behind host eviction, as
    before). Candidates are written behind the step (shared prefixes first, then reused
    ones, then shallow ones) at no more than ``gbps`` GB/s on average (a token bucket of
    ``burst_bytes``; the caller's clock: a replay's virtual seconds), so admission never
    competes with the fetches of L3 hits; objects the store already holds are not written
    again. ``max_pending`` bounds the candidates waiting for the budget (the lowest ranked
    are dropped, counted). ``memo_keys`` bounds the record of page and snapshot keys known
    to be in the store (least recently seen forgotten first, counted; about 150 bytes a
    key): a forgotten chain offered again is gathered and offered to the store once more,
    which finds it and writes nothing (bytes read and a budget charge, refunded; never a
    second write). Defaults:
    docs/policy.md, "L3 admission".
    """

    mode: str = "published"
    min_tokens: int = 1024
    gbps: float = 0.5
    burst_bytes: int = 256 << 20
    max_pending: int = 1024
    memo_keys: int = 1 << 18

    def __post_init__(self) -> None:
        if self.mode not in L3_ADMIT_MODES:
            raise ConfigError("l3_admit", self.mode, f"must be one of {list(L3_ADMIT_MODES)}")
        check_int("l3_admit_min_tokens", self.min_tokens)
        check_number("l3_admit_gbps", self.gbps, reason="must be a finite number of GB/s > 0")
        check_int("l3_admit_burst_bytes", self.burst_bytes, minimum=1)
        check_int("l3_admit_max_pending", self.max_pending, minimum=1)
        check_int("l3_admit_memo_keys", self.memo_keys, minimum=1)


@dataclass(frozen=True)
class HiCacheConfig:
    """Everything a :class:`hicache.HiCache` needs besides the layout.

    Pools without bytes (``pools.bytes_mode == "none"``, a policy-only replay) take no L3
    store: an L3 object is the bytes of a host row, and a store's capacity, eviction and
    checked headers are about those bytes, so ``storage.url`` must be ``none://``.
    """

    pools: PoolConfig = field(default_factory=PoolConfig)
    tree: TreeConfig = field(default_factory=TreeConfig)
    write: WriteConfig = field(default_factory=WriteConfig)
    storage: StorageConfig = field(default_factory=StorageConfig)
    admit: AdmitConfig = field(default_factory=AdmitConfig)

    def __post_init__(self) -> None:
        if self.pools.bytes_mode == "none" and self.storage.url != NO_L3:
            raise ConfigError("storage_url", mask_url(self.storage.url),
                              f"pools without bytes (bytes_mode none) take no L3 store: an L3 object is a "
                              f"host row's bytes; use {NO_L3}")


# YAML key -> (layer, field, parser)
_BYTES = "bytes"
_FIELDS: dict[str, tuple[str, str, Any]] = {
    "device": ("pools", "device", None),
    "device_bytes": ("pools", "device_bytes", _BYTES),
    "host_bytes": ("pools", "host_bytes", _BYTES),
    "host_ratio": ("pools", "host_ratio", None),
    "host_layout": ("pools", "host_layout", None),
    "state_share": ("pools", "state_share", None),
    "budget": ("pools", "budget", None),
    "host_reserve_bytes": ("pools", "host_reserve_bytes", _BYTES),
    "device_pages": ("pools", "device_pages", None),
    "device_snapshots": ("pools", "device_snapshots", None),
    "host_pages": ("pools", "host_pages", None),
    "host_snapshots": ("pools", "host_snapshots", None),
    "bytes_mode": ("pools", "bytes_mode", None),
    "eviction": ("tree", "eviction", None),
    "retention_interval": ("tree", "retention_interval", None),
    "adaptive_candidates": ("tree", "adaptive_candidates", None),
    "adaptive_window": ("tree", "adaptive_window", None),
    "adaptive_margin": ("tree", "adaptive_margin", None),
    "adaptive_margin_hits": ("tree", "adaptive_margin_hits", None),
    "adaptive_floor": ("tree", "adaptive_floor", None),
    "adaptive_record": ("tree", "adaptive_record", None),
    "adaptive_z": ("tree", "adaptive_z", None),
    "adaptive_dead_outputs": ("tree", "adaptive_dead_outputs", None),
    "adaptive_trial": ("tree", "adaptive_trial", None),
    "write_policy": ("write", "write_policy", None),
    "write_through_threshold": ("write", "write_through_threshold", None),
    "host_tier": ("write", "host_tier", None),
    "storage_url": ("storage", "url", None),
    "storage_salt": ("storage", "salt", None),
    "storage_auth_key": ("storage", "auth_key", None),
    "prefetch_policy": ("storage", "prefetch_policy", None),
    "prefetch_timeout_s": ("storage", "prefetch_timeout_s", None),
    "prefetch_threshold_tokens": ("storage", "prefetch_threshold_tokens", None),
    "l3_admit": ("admit", "mode", None),
    "l3_admit_min_tokens": ("admit", "min_tokens", None),
    "l3_admit_gbps": ("admit", "gbps", None),
    "l3_admit_burst_bytes": ("admit", "burst_bytes", _BYTES),
    "l3_admit_max_pending": ("admit", "max_pending", None),
    "l3_admit_memo_keys": ("admit", "memo_keys", None),
}
# Keys of earlier revisions, with what replaced them.
_REPLACED = {k: "no longer a setting: the depth weight's ghost tuner was replaced by eviction: adaptive, which "
                "chooses between whole policies online (adaptive_candidates, adaptive_window; docs/policy.md)"
             for k in ("depth_weights", "depth_window")}
_LAYERS = {"pools": PoolConfig, "tree": TreeConfig, "write": WriteConfig, "storage": StorageConfig,
           "admit": AdmitConfig}


def cache_config_from_mapping(section: Mapping | None, *, model: str = "",
                              source: str | None = None, **overrides: Any) -> HiCacheConfig:
    """Parse a ``cache:`` mapping (plus command-line overrides) into a :class:`HiCacheConfig`.

    Unknown keys are errors, naming the key and the valid ones.
    """
    if section is None:
        section = {}
    if not isinstance(section, Mapping):
        raise ConfigError("cache", section, "must be a mapping of cache settings (or absent)", source=source)
    section = dict(section)
    section.update({k: v for k, v in overrides.items() if v is not None})
    per_layer: dict[str, dict[str, Any]] = {name: {} for name in _LAYERS}
    for key, value in section.items():
        if key in _REPLACED:
            raise ConfigError(f"cache.{key}", value, _REPLACED[key], source=source)
        if key not in _FIELDS:  # a mistyped storage_url may hold a password: mask it
            raise ConfigError(f"cache.{key}", mask_url(value) if isinstance(value, str) else value,
                              f"unknown field; expected one of {sorted(_FIELDS)}", source=source)
        layer, name, parser = _FIELDS[key]
        if parser == _BYTES and value is not None:
            try:
                value = parse_bytes(value, f"cache.{key}")
            except ConfigError as exc:
                raise ConfigError(exc.field, exc.value, exc.reason, source=source) from None
        per_layer[layer][name] = value
    if model and "salt" not in per_layer["storage"]:
        per_layer["storage"]["salt"] = model
    try:
        built = {name: cls(**per_layer[name]) for name, cls in _LAYERS.items()}
        return HiCacheConfig(**built)
    except ConfigError as exc:
        raise ConfigError(f"cache.{exc.field}", exc.value, exc.reason, source=source) from None


def load_config(path: str | os.PathLike, *, hf_config: str | None = None,
                **overrides: Any) -> tuple[CacheLayout, HiCacheConfig]:
    """Read a config file: its layout (or the one ``hf_config`` describes) and cache config."""
    data = read_config_file(path)
    model = str(data.get("model", ""))
    if hf_config is not None:
        section = dict(data.get("layout") or {})
        options = {k: section[k] for k in ("page_tokens", "kv_format", "indexer_format", "include_mtp")
                   if k in section}
        layout = layout_from_mapping({"hf_config": load_hf_config(hf_config), **options}, model=model,
                                     source=str(hf_config))
    else:
        layout = layout_from_mapping(data.get("layout"), model=model, source=str(path))
    cfg = cache_config_from_mapping(data.get("cache"), model=model, source=str(path), **overrides)
    return layout, cfg

