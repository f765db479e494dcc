"""Layer 1: the bytes of the device (L1) and host (L2) tiers.

Interface of the layer (everything else in the package is internal):

* :class:`PoolConfig` / :func:`plan_pools`: budgets -> page and snapshot counts.
* :class:`TieredPools` (built by :func:`build_pools`): a device :class:`TierPools` and a host
  :class:`TierPools`, each with a page anchor, a state anchor and one sidecar per family.
* :class:`Allocation` / :class:`NoRoom`: the typed result of ``alloc``.
* :class:`Tier` / :class:`Source`: the typed names of tiers and anchors.

Imports only :mod:`hicache.layout`.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from hicache.layout import CacheLayout
from hicache.pools.anchor import AllocResult, Allocation, IndexAllocator, NoRoom, as_id_array
from hicache.pools.config import ARENA_TIERS, BYTES_MODES, POOL_BUDGETS, BytesMode, PoolBudget, PoolConfig, PoolPlan, plan_pools, resolve_device
from hicache.pools.tier import BUDGET_MODES, HOST_LAYOUTS, SOURCES, ObjectSlot, SidecarPool, Source, Tier, TierPools, object_slots


@dataclass
class TieredPools:
    """The L1 and L2 pools of one cache, sized by one :class:`PoolPlan`."""

    layout: CacheLayout
    plan: PoolPlan
    device: TierPools
    host: TierPools

    def tier(self, tier: Tier | str) -> TierPools:
        """The pools of one tier (``Tier.DEVICE`` or ``Tier.HOST``)."""
        return self.device if Tier(tier) is Tier.DEVICE else self.host

    @property
    def holds_bytes(self) -> bool:
        """False for pools built with ``bytes_mode="none"``: ids and geometry, no bytes."""
        return self.device.holds_bytes

    def check_integrity(self) -> None:
        self.device.check_integrity()
        self.host.check_integrity()


def build_pools(layout: CacheLayout, cfg: PoolConfig, *, plan: PoolPlan | None = None) -> TieredPools:
    """Allocate the device pools (layer_first) and host pools (``cfg.host_layout``); a tier
    the plan sizes as an arena (``budget: shared`` both, ``shared_host`` the host) is one
    page_first arena.

    Host memory is pinned when the device is CUDA, so copies run as true async DMA. With
    ``cfg.bytes_mode == "none"`` both tiers are built on the ``meta`` device: the same ids
    and geometry, no bytes (:class:`TierPools`).
    """
    plan = plan or plan_pools(layout, cfg)
    real = cfg.bytes_mode == "real"
    device = resolve_device(cfg.device) if real else torch.device("meta")
    host_device = "cpu" if real else device
    pin = device.type == "cuda"
    if plan.device_arena is not None:
        dev = TierPools(layout, "device", arena_bytes=plan.device_arena, state_cap_bytes=plan.device_state_cap,
                        device=device)
    else:
        dev = TierPools(layout, "device", num_pages=plan.device_pages, num_snapshots=plan.device_snapshots,
                        device=device)
    if plan.host_arena is not None:
        host = TierPools(layout, "host", arena_bytes=plan.host_arena, state_cap_bytes=plan.host_state_cap,
                         device=host_device, pin_memory=pin)
    else:
        host = TierPools(layout, "host", num_pages=plan.host_pages, num_snapshots=plan.host_snapshots,
                         device=host_device, host_layout=cfg.host_layout, pin_memory=pin)
    return TieredPools(layout, plan, dev, host)

__all__ = [
    "AllocResult", "Allocation", "IndexAllocator", "NoRoom", "as_id_array",
    "ARENA_TIERS", "BYTES_MODES", "BytesMode", "POOL_BUDGETS", "PoolBudget", "PoolConfig", "PoolPlan", "plan_pools", "resolve_device",
    "BUDGET_MODES", "HOST_LAYOUTS", "SOURCES", "ObjectSlot", "SidecarPool", "Source", "Tier", "TierPools", "object_slots",
    "TieredPools", "build_pools",
]
