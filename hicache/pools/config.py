"""Pool sizing: from byte budgets to page and snapshot counts per tier.

Three budget modes (``budget``), built from two per-tier ones:

``split`` (the default): each tier's budget is split between history pages and state
snapshots by ``state_share`` (0.2 when not given; layouts without state put everything
into pages)::

    device_bytes = 8 GiB, state_share 0.2, page 0.94 MiB, snapshot 4.07 MB
      -> pages     = floor(8 GiB * 0.8 / 0.94 MiB)
      -> snapshots = floor(8 GiB * 0.2 / 4.07 MB)

``shared``: each tier's budget is one arena both kinds draw from
(:mod:`hicache.pools.arena`); how many pages and snapshots it holds changes as the cache
runs, and eviction weighs a page run against a snapshot on one scale. ``state_share``,
when given, is then a *cap* on the bytes snapshots may take (``share x budget``), not a
reservation; without it there is none. The plan's page and snapshot counts are each kind's
most (the whole arena, or the cap)::

    device_bytes = 8 GiB, shared, no cap
      -> arena 8 GiB: up to floor(8 GiB / 0.94 MiB) pages, or floor(8 GiB / 4.07 MB)
         snapshots, or any mix whose bytes fit

``shared_host``: the device tier is split as in ``split`` (by ``state_share``) and the host
tier is one arena without a cap. The device holds mostly running requests, whose pinned
pages and snapshots no compaction can move, so a device arena fragments: a snapshot ask
finds the page frontier pinned and evicts pages into holes only pages can use. The host
holds cached chains, which move freely, so there the arena lets the traffic choose the mix
(more pages on chat, more snapshots on branching traffic) with no share to tune.

The host budget is ``host_bytes`` or ``host_ratio`` x the device budget; a host budget
over the available memory minus ``host_reserve_bytes`` is refused, because an oversized
pinned pool takes the machine down rather than failing cleanly.

``bytes_mode``: ``real`` (default) allocates the budgets; ``none`` builds the same pools
with no bytes (``meta`` tensors: ids, geometry and every allocation decision, no memory),
for a policy-only replay (``hicache replay --bytes none``). Only the ids' bookkeeping is then
checked against the available memory, and the device is nominal (no GPU is needed).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Literal

import psutil
import torch

from hicache.units import check_int, check_number
from hicache.errors import ConfigError
from hicache.layout import CacheLayout
from hicache.pools.tier import HOST_LAYOUTS, HostLayout

GiB = 1024**3
_DEVICE = re.compile(r"cpu|auto|cuda(:\d+)?")
# Host memory each page or snapshot id costs its tier's index allocator (free list, used
# flags) and sidecars, whatever the id's own bytes: counted so a huge count is refused.
ID_BOOKKEEPING_BYTES = 16

ARENA_ALIGN = 8   # an arena's bytes are a multiple of this: the widest view of its objects (see _aligned)
BytesMode = Literal["real", "none"]
BYTES_MODES = ("real", "none")
PoolBudget = Literal["split", "shared_host", "shared"]
POOL_BUDGETS = ("split", "shared_host", "shared")
# the tiers each budget makes one arena (the rest are split)
ARENA_TIERS: dict[str, tuple[str, ...]] = {"split": (), "shared_host": ("host",), "shared": ("device", "host")}


@dataclass(frozen=True)
class PoolConfig:
    """Budgets and layouts of the device (L1) and host (L2) pools.

    Counts (``device_pages`` ...) override the byte budgets of split tiers when given (tests
    use them); with shared_host the host counts size its arena instead: ``host_pages x page
    bytes + host_snapshots x snapshot bytes`` (host_snapshots only with host_pages); with
    shared they are refused. ``budget`` picks split, shared_host or shared (see the module
    docstring); ``state_share`` is the state split of a split tier (default 0.2) or the cap
    of a shared arena's snapshots (``shared`` only, default none). ``bytes_mode``: ``real``
    pools hold their bytes; ``none`` pools hold none (see the module docstring).
    """

    device: str = "cpu"
    device_bytes: int = 1 * GiB
    host_bytes: int | None = None
    host_ratio: float = 2.0
    host_layout: HostLayout = "page_first"
    state_share: float | None = None
    budget: PoolBudget = "split"
    host_reserve_bytes: int = 2 * GiB
    device_pages: int | None = None
    device_snapshots: int | None = None
    host_pages: int | None = None
    host_snapshots: int | None = None
    bytes_mode: BytesMode = "real"

    def __post_init__(self) -> None:
        if self.bytes_mode not in BYTES_MODES:
            raise ConfigError("bytes_mode", self.bytes_mode, f"must be one of {list(BYTES_MODES)}")
        if self.host_layout not in HOST_LAYOUTS:
            raise ConfigError("host_layout", self.host_layout, f"must be one of {list(HOST_LAYOUTS)}")
        for name in ("device_bytes", "host_reserve_bytes"):
            v = getattr(self, name)
            check_int(name, v, minimum=1, reason="must be a positive number of bytes")
        hb = self.host_bytes
        check_int("host_bytes", hb, minimum=1, optional=True, reason="must be a positive number of bytes")
        r = self.host_ratio
        check_number("host_ratio", r)
        share = self.state_share
        if share is not None and (isinstance(share, bool) or not isinstance(share, (int, float))
                                  or not 0 < share < 1):
            raise ConfigError("state_share", share, "must be between 0 and 1 (exclusive)")
        if self.budget not in POOL_BUDGETS:
            raise ConfigError("budget", self.budget, f"must be one of {list(POOL_BUDGETS)}")
        if self.budget != "split" and self.host_layout != "page_first":
            raise ConfigError("host_layout", self.host_layout, f"budget {self.budget!r} needs page_first objects")
        for name in ("device_pages", "device_snapshots", "host_pages", "host_snapshots"):
            v = getattr(self, name)
            check_int(name, v, optional=True)
            if v is not None and self.budget == "shared":
                raise ConfigError(name, v, "counts need budget 'split' or 'shared_host' (a shared arena is "
                                           "sized in bytes)")
        if not isinstance(self.device, str) or not _DEVICE.fullmatch(self.device):
            raise ConfigError("device", self.device, "must be 'cpu', 'cuda', 'cuda:N' or 'auto'")


@dataclass(frozen=True)
class PoolPlan:
    """How many pages and snapshots each tier holds, and what that costs."""

    device_pages: int
    device_snapshots: int
    host_pages: int
    host_snapshots: int
    page_bytes: int
    snapshot_bytes: int
    budget: PoolBudget = "split"
    device_arena: int | None = None       # shared: the device arena's bytes
    host_arena: int | None = None         # shared, shared_host: the host arena's bytes
    device_state_cap: int | None = None   # shared: most bytes snapshots may take (None: no cap)
    host_state_cap: int | None = None

    @property
    def device_bytes(self) -> int:
        if self.device_arena is not None:
            return self.device_arena
        return self.device_pages * self.page_bytes + self.device_snapshots * self.snapshot_bytes

    @property
    def host_bytes(self) -> int:
        if self.host_arena is not None:
            return self.host_arena
        return self.host_pages * self.page_bytes + self.host_snapshots * self.snapshot_bytes

    def page_units(self) -> tuple[float, float]:
        """(the cache in history pages, a snapshot in history pages): the device's bytes
        (its page and snapshot rows, or its arena) plus the host's bytes, over the page's
        bytes. What a ghost cache (:mod:`hicache.tree.ghost`) is sized by: a ghost is one
        pool where pages and snapshots compete, so the device's snapshot rows count too
        (without them the ghosts under-counted the cache by its device state share and
        misjudged orders that keep more snapshots)."""
        device = (self.device_pages * self.page_bytes + self.device_snapshots * self.snapshot_bytes
                  if self.device_arena is None else self.device_arena)
        return (device + self.host_bytes) / self.page_bytes, self.snapshot_bytes / self.page_bytes


def resolve_device(name: str) -> "torch.device":
    """``auto`` -> ``cuda`` when a GPU is present, else ``cpu``."""
    if not isinstance(name, str) or not _DEVICE.fullmatch(name):
        raise ConfigError("device", name, "must be 'cpu', 'cuda', 'cuda:N' or 'auto'")
    if name == "auto":
        name = "cuda" if torch.cuda.is_available() else "cpu"
    if name.startswith("cuda") and not torch.cuda.is_available():
        raise ConfigError("device", name, "no CUDA device is available; use 'cpu' or 'auto'")
    return torch.device(name)


def _split(budget: int, field: str, page_bytes: int, snap_bytes: int, share: float) -> tuple[int, int]:
    if snap_bytes == 0:
        pages, snaps = budget // page_bytes, 0
    else:
        pages = int(budget * (1 - share)) // page_bytes
        snaps = int(budget * share) // snap_bytes
    if pages < 1:
        raise ConfigError(field, budget, f"is smaller than one history page ({page_bytes} bytes)")
    if snap_bytes and snaps < 1:
        raise ConfigError(field, budget,
                          f"leaves no room for one state snapshot ({snap_bytes} bytes) at "
                          f"state_share={share}")
    return pages, snaps


def _aligned(budget: int) -> int:
    """An arena's bytes rounded down to :data:`ARENA_ALIGN`: snapshots are laid from its high
    end, so an odd size would misalign every snapshot object (and the 8-byte views of it)."""
    return budget - budget % ARENA_ALIGN if budget >= ARENA_ALIGN else budget


def _arena(budget: int, field: str, page_bytes: int, snap_bytes: int,
           share: float | None) -> tuple[int, int, int | None]:
    """A shared arena's most pages, most snapshots and state cap in bytes."""
    cap = None if share is None or not snap_bytes else int(budget * share)
    pages = budget // page_bytes
    snaps = (budget if cap is None else cap) // snap_bytes if snap_bytes else 0
    if pages < 1:
        raise ConfigError(field, budget, f"is smaller than one history page ({page_bytes} bytes)")
    if snap_bytes and snaps < 1:
        raise ConfigError(field, budget, f"leaves no room for one state snapshot ({snap_bytes} bytes)"
                          + (f" under state_share={share}" if share is not None else ""))
    return pages, snaps, cap


def plan_pools(layout: CacheLayout, cfg: PoolConfig, *, available_bytes: int | None = None) -> PoolPlan:
    """Turn budgets into counts, refusing a host pool the machine cannot hold."""
    page_bytes = layout.object_bytes("page")
    snap_bytes = layout.object_bytes("state")
    assert page_bytes > 0, "a layout has at least one history family with bytes"
    host_budget = cfg.host_bytes if cfg.host_bytes is not None else int(cfg.device_bytes * cfg.host_ratio)
    host_field = "host_bytes" if cfg.host_bytes is not None else "host_ratio"
    if cfg.budget == "shared":
        dev_arena, host_budget = _aligned(cfg.device_bytes), _aligned(host_budget)
        dev_pages, dev_snaps, dev_cap = _arena(dev_arena, "device_bytes", page_bytes, snap_bytes,
                                               cfg.state_share)
        host_pages, host_snaps, host_cap = _arena(host_budget, host_field, page_bytes, snap_bytes, cfg.state_share)
        plan = PoolPlan(dev_pages, dev_snaps, host_pages, host_snaps, page_bytes, snap_bytes, "shared",
                        dev_arena, host_budget, dev_cap, host_cap)
    else:
        share = 0.2 if cfg.state_share is None else cfg.state_share
        dev_pages, dev_snaps = _split(cfg.device_bytes, "device_bytes", page_bytes, snap_bytes, share)
        dev_pages = cfg.device_pages if cfg.device_pages is not None else dev_pages
        dev_snaps = cfg.device_snapshots if cfg.device_snapshots is not None else dev_snaps
        if cfg.budget == "shared_host":
            if cfg.host_snapshots is not None and cfg.host_pages is None:
                raise ConfigError("host_snapshots", cfg.host_snapshots, "under budget 'shared_host' give "
                                  "host_pages too: the two counts size the host arena in bytes")
            if cfg.host_pages is not None:   # counts: an arena of the same bytes
                host_budget = cfg.host_pages * page_bytes + (cfg.host_snapshots or 0) * snap_bytes
                host_budget += -host_budget % ARENA_ALIGN   # up: room for at least the counts
                host_field = "host_pages"
                if host_budget < max(page_bytes, snap_bytes):
                    raise ConfigError("host_pages", cfg.host_pages,
                                      f"with host_snapshots={cfg.host_snapshots or 0} sizes a {host_budget}-byte "
                                      f"host arena, smaller than one state snapshot ({snap_bytes} bytes)")
            host_budget = _aligned(host_budget)
            host_pages, host_snaps, _ = _arena(host_budget, host_field, page_bytes, snap_bytes, None)
            plan = PoolPlan(dev_pages, dev_snaps, host_pages, host_snaps, page_bytes, snap_bytes, "shared_host",
                            host_arena=host_budget)
        else:
            host_pages, host_snaps = _split(host_budget, host_field, page_bytes, snap_bytes, share)
            host_pages = cfg.host_pages if cfg.host_pages is not None else host_pages
            host_snaps = cfg.host_snapshots if cfg.host_snapshots is not None else host_snaps
            plan = PoolPlan(dev_pages, dev_snaps, host_pages, host_snaps, page_bytes, snap_bytes)
    avail = psutil.virtual_memory().available if available_bytes is None else available_bytes
    limit = avail - cfg.host_reserve_bytes
    counts = {"device_pages": dev_pages, "device_snapshots": dev_snaps, "host_pages": host_pages,
              "host_snapshots": host_snaps}
    book = sum(counts.values()) * ID_BOOKKEEPING_BYTES
    if book > limit:  # e.g. a snapshot count on a layout whose snapshots hold no bytes
        name = max(counts, key=counts.__getitem__)
        raise ConfigError(name, counts[name],
                          f"{sum(counts.values()):,} page and snapshot ids need {book / GiB:.2f} GiB of host "
                          f"memory for their allocators but only {max(limit, 0) / GiB:.2f} GiB is available")
    if cfg.bytes_mode == "none":   # no bytes: the ids' bookkeeping is all the memory it costs
        return plan
    if plan.host_bytes > limit:
        value = {"host_bytes": cfg.host_bytes, "host_ratio": cfg.host_ratio, "host_pages": cfg.host_pages}[host_field]
        raise ConfigError(host_field, value,
                          f"asks for a {plan.host_bytes / GiB:.2f} GiB host pool but only "
                          f"{max(limit, 0) / GiB:.2f} GiB is available ({avail / GiB:.2f} GiB free "
                          f"minus a {cfg.host_reserve_bytes / GiB:.2f} GiB reserve)")
    if resolve_device(cfg.device).type == "cpu" and plan.device_bytes + plan.host_bytes + book > limit:
        raise ConfigError("device_bytes", cfg.device_bytes,
                          f"with the device tier on the CPU, device + host pools need "
                          f"{(plan.device_bytes + plan.host_bytes) / GiB:.2f} GiB but only "
                          f"{max(limit, 0) / GiB:.2f} GiB is available ({avail / GiB:.2f} GiB free "
                          f"minus a {cfg.host_reserve_bytes / GiB:.2f} GiB reserve)")
    return plan
