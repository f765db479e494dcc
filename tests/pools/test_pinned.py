"""``build_pools`` on each device: where every tier's bytes live, pinned host memory on
CUDA (the Triton kernel reads it over UVA; unpinned it would refuse), and a round trip
through the controller's default backend for every budget mode and host layout -- the
``shared`` arena puts the device pools in page_first objects too, so the kernel copies
strided views on both sides."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from hicache.layout import CacheLayout
from hicache.pools import PoolConfig, build_pools
from hicache.transfer import TransferController
from tests.conftest import CONFIGS

MODES = [("split", "layer_first"), ("split", "page_first"), ("shared_host", "page_first"), ("shared", "page_first")]


@pytest.mark.parametrize("budget, host_layout", MODES, ids=[f"{b}-{h}" for b, h in MODES])
def test_pools_live_where_the_device_says_and_round_trip(budget, host_layout, device):
    layout = CacheLayout.from_yaml(CONFIGS / "tiny-hybrid.yaml")
    pools = build_pools(layout, PoolConfig(device=device.type, device_bytes=96 << 10, host_bytes=128 << 10,
                                           host_layout=host_layout, budget=budget, state_share=0.4))
    for sc in pools.device.sidecars.values():
        assert sc.data.device.type == device.type
    for sc in pools.host.sidecars.values():
        assert sc.data.device.type == "cpu"
        if sc.data.numel():   # an empty family (tiny-hybrid's c8_state: 0 bytes a row) holds nothing to pin
            assert sc.data.is_pinned() == (device.type == "cuda"), sc.name
    g = torch.Generator().manual_seed(3)
    with TransferController(pools) as ctl:
        assert ctl.backend in (("triton",) if device.type == "cuda" else ("native", "torch"))
        dev_pages, dev_snap = pools.device.alloc("page", 3).ids, pools.device.alloc("state", 1).ids
        for source, ids in (("page", dev_pages), ("state", dev_snap)):
            for fam in layout.families_on(source):
                v = pools.device.view(fam.name)
                idx = ids.to(v.device)
                v[:, idx] = torch.randint(0, 256, (v.shape[0], len(ids), v.shape[2]), dtype=torch.uint8,
                                          generator=g).to(v.device)
        backups = [ctl.backup(dev_pages[[2, 0, 1]]), ctl.backup(dev_snap, source="state")]
        ctl.step()
        assert all(b.wait(60) for b in backups)
        loads = [ctl.load(b.dst_ids, source=b.source) for b in backups]
        ctl.step()
        assert all(h.wait(60) for h in loads)
        assert all(a.ok for a in ctl.poll())
        for b, h in zip(backups, loads):
            for fam in layout.families_on(b.source):
                dv, hv = pools.device.view(fam.name), pools.host.view(fam.name)
                src = dv[:, b.src_ids.to(dv.device)].cpu()
                assert torch.equal(hv[:, b.dst_ids], src), fam.name
                assert torch.equal(dv[:, h.dst_ids.to(dv.device)].cpu(), src), fam.name
    assert np.all(pools.host.anchors["page"].is_used(backups[0].dst_ids.numpy()))
    pools.check_integrity()
