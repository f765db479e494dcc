"""Shared helpers: small tiered pools filled with random bytes."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from hicache.layout import CacheLayout, FamilySpec
from hicache.pools import PoolPlan, TieredPools, TierPools

CONFIGS = Path(__file__).resolve().parents[2] / "configs"


def tiny_layout() -> CacheLayout:
    return CacheLayout.from_yaml(CONFIGS / "tiny-hybrid.yaml")


def row_size_layout() -> CacheLayout:
    """Every row size of the real layouts (584, 132, 68, 8192, 2048 B) plus an odd one
    (7 B, so no element wider than a byte fits) and a zero-byte state family."""
    return CacheLayout((
        FamilySpec("kv584", "history", (0, 2, 3), 4, 584),        # 4 rows/page: 2336 B units
        FamilySpec("idx132", "history", (0, 2), 4, 132),          # 528 B
        FamilySpec("idx68", "history", (1,), 16, 68),             # one row: 68 B (int32)
        FamilySpec("c16_kv", "history", (1, 3), 16, 584),         # one row: 584 B
        FamilySpec("odd7", "history", (2,), 8, 7),                # 14 B (bytes only)
        FamilySpec("st8192", "state", (0, 2), 1, 8192, rows_kept=1),
        FamilySpec("st2048", "state", (1,), 1, 2048, rows_kept=2),
        FamilySpec("swa584", "state", (0, 1, 2, 3), 1, 584, rows_kept=3),
        FamilySpec("empty", "state", (3,), 1, 4096, rows_kept=0),
    ), 16)


def make_pools(layout: CacheLayout, *, host_layout: str = "page_first", device_pages: int = 8,
               host_pages: int = 10, device_snapshots: int = 5, host_snapshots: int = 6,
               host_sidecar_rows: dict | None = None, seed: int = 0,
               device: torch.device | str = "cpu") -> TieredPools:
    """Pools filled with random bytes; the device tier on ``device``, the host pinned when
    that is CUDA (as ``build_pools`` does: the Triton kernel reads host memory over UVA)."""
    device = torch.device(device)
    dev = TierPools(layout, "device", num_pages=device_pages, num_snapshots=device_snapshots, device=device)
    host = TierPools(layout, "host", num_pages=host_pages, num_snapshots=host_snapshots,
                     host_layout=host_layout, sidecar_rows=host_sidecar_rows,
                     pin_memory=device.type == "cuda")
    plan = PoolPlan(device_pages, device_snapshots, host_pages, host_snapshots,
                    layout.object_bytes("page"), layout.object_bytes("state"))
    pools = TieredPools(layout, plan, dev, host)
    fill_random(pools, seed)
    return pools


def fill_random(pools: TieredPools, seed: int) -> None:
    g = torch.Generator().manual_seed(seed)
    for tier in (pools.device, pools.host):
        for sc in tier.sidecars.values():
            sc.data.copy_(torch.randint(0, 256, tuple(sc.data.shape), dtype=torch.uint8, generator=g))


def snapshot(tier: TierPools) -> dict[str, torch.Tensor]:
    return {name: sc.data.clone() for name, sc in tier.sidecars.items()}


@pytest.fixture
def interpret(monkeypatch):
    """Run Triton kernels on the CPU through Triton's interpreter."""
    monkeypatch.setenv("TRITON_INTERPRET", "1")
