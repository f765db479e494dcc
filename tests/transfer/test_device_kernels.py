"""The Triton copy kernel on each device against a pure-torch oracle computed on the CPU.

CUDA half (``gpu``): the compiled kernel, device pools in GPU memory and host pools pinned,
read and written over unified virtual addressing. CPU half: the same kernel in Triton's
interpreter. Every family shape of every shipped config (its first two layers: the same
units at a size the interpreter copies in seconds), odd row sizes, both host layouts, both
directions, scattered ids (a repeated source) and consecutive runs. Each copy is checked
byte for byte over the whole destination tier, so a write to a wrong row fails too.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import numpy as np
import pytest
import torch

from hicache.errors import MisuseError
from hicache.layout import CacheLayout
from hicache.transfer import copy_batch, copy_rows
from tests.transfer.conftest import CONFIGS, make_pools, row_size_layout
from tests.transfer.test_kernels import batch_items, scattered_ids

SHIPPED = sorted(CONFIGS.glob("*.yaml"))


def first_layers(path: Path, keep: int = 2) -> CacheLayout:
    """``path``'s layout with each family cut to its first ``keep`` layers: the unit shapes
    (rows per page x row bytes) of the real model, a few MiB of pools."""
    lay = CacheLayout.from_yaml(path)
    return CacheLayout(tuple(dataclasses.replace(f, layer_ids=f.layer_ids[:keep]) for f in lay.families),
                       lay.page_tokens, model=lay.model)


# Two layers on CUDA (the layer stride too); one in the interpreter, where a Llama unit
# (1 MiB) costs seconds. The odd-rows layout has several layers on every device.
LAYOUTS = [pytest.param(lambda dev, p=p: first_layers(p, 2 if dev.type == "cuda" else 1), id=p.stem)
           for p in SHIPPED] + [pytest.param(lambda dev: row_size_layout(), id="odd-rows")]


def consecutive_ids(pools, direction: str) -> dict:
    """Runs of consecutive ids, shifted by one between the sides (never the identity)."""
    out = {}
    for source in ("page", "state"):
        n_dev, n_host = pools.device.capacity(source), pools.host.capacity(source)
        n_src, n_dst = (n_dev, n_host) if direction == "d2h" else (n_host, n_dev)
        k = min(n_src, n_dst) - 1
        out[source] = (np.arange(1, k + 1), np.arange(k))
    return out


def oracle(pools, direction: str, ids: dict) -> dict[str, torch.Tensor]:
    """The destination tier after the copy, on the CPU, by the obvious loop."""
    src_tier, dst_tier = (pools.device, pools.host) if direction == "d2h" else (pools.host, pools.device)
    want = {f.name: dst_tier.view(f.name).cpu().clone() for f in pools.layout.families}
    for fam in pools.layout.families:
        src = src_tier.view(fam.name).cpu()
        s, d = ids[fam.index_source]
        for layer in range(fam.num_layers):
            for j in range(len(s)):
                want[fam.name][layer, int(d[j])] = src[layer, int(s[j])]
    return want


@pytest.mark.parametrize("layout_fn", LAYOUTS)
@pytest.mark.parametrize("host_layout", ["layer_first", "page_first"])
def test_triton_kernel_matches_the_oracle_for_every_shipped_family_shape(layout_fn, host_layout, device):
    pools = make_pools(layout_fn(device), host_layout=host_layout, device=device, device_pages=5, host_pages=7,
                       device_snapshots=3, host_snapshots=4, seed=11)
    assert pools.device.view(pools.layout.families[0].name).device.type == device.type
    for direction in ("d2h", "h2d"):
        for kind, ids in (("scattered", scattered_ids(pools, direction, seed=5)),
                          ("consecutive", consecutive_ids(pools, direction))):
            want = oracle(pools, direction, ids)
            copy_batch(batch_items(pools, direction, ids), backend="triton")
            dst_tier = pools.host if direction == "d2h" else pools.device
            for name, tensor in want.items():
                assert torch.equal(dst_tier.view(name).cpu(), tensor), f"{direction} {kind}: {name} differs"
    if host_layout == "page_first":   # the host objects hold exactly the family views' bytes
        for source in ("page", "state"):
            if not pools.layout.families_on(source):
                continue
            obj = pools.host.object_view(source)
            parts = [pools.host.view(f.name).permute(1, 0, 2).reshape(obj.shape[0], -1)
                     for f in pools.layout.families_on(source)]
            assert torch.equal(torch.cat(parts, dim=1), obj)


@pytest.mark.parametrize("row_bytes", [1, 7, 68, 584, 8192])
def test_one_family_device_to_host_and_back(row_bytes, device):
    """A single view pair of each element width (1, 4 and 8 bytes) both ways."""
    pin = device.type == "cuda"
    g = torch.Generator().manual_seed(row_bytes)
    dev = torch.randint(0, 256, (3, 9, row_bytes), dtype=torch.uint8, generator=g).to(device)
    host = torch.randint(0, 256, (3, 6, row_bytes), dtype=torch.uint8, generator=g)
    host = host.pin_memory() if pin else host
    want = host.clone()
    want[:, [2, 5, 0, 3]] = dev.cpu()[:, [8, 0, 5, 5]]
    copy_rows(dev, host, [8, 0, 5, 5], [2, 5, 0, 3], backend="triton")
    assert torch.equal(host, want)
    back = dev.cpu().clone()
    back[:, [1, 7]] = host[:, [5, 2]]
    copy_rows(host, dev, [5, 2], [1, 7], backend="triton")
    assert torch.equal(dev.cpu(), back)


def test_host_memory_must_be_pinned_for_the_cuda_kernel(device):
    """CUDA reads host rows over UVA, which needs pinned memory: an unpinned host view is
    refused before anything is launched. On the CPU (interpreter) no pinning is needed."""
    dev = torch.zeros(2, 4, 16, dtype=torch.uint8, device=device)
    host = torch.arange(2 * 4 * 16, dtype=torch.int64).remainder(251).to(torch.uint8).view(2, 4, 16)
    if device.type == "cuda":
        with pytest.raises(MisuseError, match="must be pinned"):
            copy_rows(host, dev, [0, 3], [1, 2], backend="triton")
        assert int(dev.sum()) == 0
    else:
        copy_rows(host, dev, [0, 3], [1, 2], backend="triton")
        assert torch.equal(dev[:, [1, 2]], host[:, [0, 3]])
