"""Pieces the copy benchmarks share (``bench transfer``, ``bench overlap``): pools of a
layout filled with random bytes, every row allocated; a clock that times GPU work with
CUDA events; and the byte checks that make a benchmark's figures count only when every
byte landed where it should and nowhere else.
"""

from __future__ import annotations

import argparse
import time
from typing import Callable, Literal

import numpy as np
import psutil
import torch

from hicache.errors import ConfigError
from hicache.layout import CacheLayout
from hicache.pools import PoolPlan, TieredPools, TierPools

GiB = 1024**3


def add_copy_arguments(p: argparse.ArgumentParser, *, pages: int, what: str, reps: int) -> None:
    """The flags every copy benchmark takes: what to copy, where, how often, with what."""
    p.add_argument("--config", default="deepseek-v4-flash",
                   help="config YAML or a name from configs/ (default: deepseek-v4-flash)")
    p.add_argument("--pages", type=int, default=pages, help=f"history pages {what} (default {pages})")
    p.add_argument("--reps", type=int, default=reps, help=f"timed rounds; the best is reported (default {reps})")
    p.add_argument("--device", default=None, help="cpu, cuda or auto (default: the config's device)")
    p.add_argument("--host-layout", choices=["layer_first", "page_first"], default=None,
                   help="host pool layout (default: the config's host_layout)")
    p.add_argument("--backend", default="auto", help="copy backend (default auto)")
    p.add_argument("--json", action="store_true", help="print one JSON object")


class Clock:
    """Wall time on CPU; CUDA events around the work on GPU (the host returns before the
    GPU finishes, so wall time would measure the launch)."""

    def __init__(self, device: torch.device):
        self.cuda = device.type == "cuda"

    def time(self, fn: Callable[[], object]) -> float:
        if self.cuda:
            torch.cuda.synchronize()
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            fn()
            end.record()
            end.synchronize()
            return start.elapsed_time(end) / 1000.0
        t0 = time.perf_counter()
        fn()
        return time.perf_counter() - t0


def progress_printer(name: str) -> Callable[[str], None]:
    """``[bench NAME 12.3s] message`` lines on stderr (stdout stays the table or JSON)."""
    t0 = time.monotonic()

    def say(msg: str) -> None:
        import sys

        print(f"[bench {name} {time.monotonic() - t0:6.1f}s] {msg}", file=sys.stderr, flush=True)
    return say


def check_host_memory(flag: str, value: int, need: int, reserve: int) -> None:
    """Refuse a size whose host buffers would not fit, before allocating any (one line)."""
    avail = psutil.virtual_memory().available - reserve
    if need > avail:
        raise ConfigError(flag, value, f"needs about {need / GiB:.1f} GiB of host memory but "
                                       f"{max(avail, 0) / GiB:.1f} GiB is available; use fewer pages")


def full_pools(layout: CacheLayout, device: torch.device, host_layout: Literal["layer_first", "page_first"],
               pages: int, snapshots: int) -> TieredPools:
    """Device and host pools of ``pages`` / ``snapshots`` rows each, every row allocated
    (ids are then chosen freely), host pinned on CUDA (what ``build_pools`` does)."""
    pin = device.type == "cuda"
    dev = TierPools(layout, "device", num_pages=pages, num_snapshots=snapshots, device=device)
    host = TierPools(layout, "host", num_pages=pages, num_snapshots=snapshots, host_layout=host_layout,
                     pin_memory=pin)
    page_b, snap_b = layout.object_bytes("page"), layout.object_bytes("state")
    pools = TieredPools(layout, PoolPlan(pages, snapshots, pages, snapshots, page_b, snap_b), dev, host)
    for tier in (dev, host):
        for source, cap in (("page", pages), ("state", snapshots)):
            assert tier.alloc(source, cap).ok, "fresh pools hold their own capacity"
    return pools


def fill(tier: TierPools, seed: int) -> None:
    """Random bytes in every row: device rows by the GPU's generator, host rows 64 MiB at a
    time from numpy's (about 5x torch's CPU ``randint``, which took a minute for the GiBs
    of pinned host pools of a GPU run)."""
    rng = np.random.default_rng(seed)
    chunk = 64 << 20
    for sc in tier.sidecars.values():
        if sc.data.is_cuda and sc.data.is_contiguous():
            sc.data.view(-1).random_(0, 256, generator=torch.Generator(sc.data.device).manual_seed(seed))
            continue
        for l in range(sc.data.shape[0]):
            layer = sc.data[l]
            rows = max(1, chunk // max(1, layer.shape[1]))
            for lo in range(0, layer.shape[0], rows):
                part = layer[lo: lo + rows]
                part.copy_(torch.from_numpy(rng.integers(0, 256, tuple(part.shape), dtype=np.uint8)))


def bump(tier: TierPools) -> None:
    """Add 1 to every byte (mod 256), at memory speed: afterwards no row holds what was
    copied from or into it before, so a copy that moves nothing cannot pass a check."""
    for sc in tier.sidecars.values():
        sc.data.add_(1)


def pairs(rng: np.random.Generator, n: int, cap: int) -> np.ndarray:
    """``n`` distinct scattered ids out of ``cap``."""
    return rng.permutation(cap)[:n].astype(np.int64)


class Check:
    """Remembers a destination tier's rows outside the destination ids, to prove later that
    the copy touched nothing else, and compares destination rows with their sources."""

    def __init__(self, dst: TierPools, ids: dict[str, np.ndarray]):
        self.dst, self.kept = dst, {}
        for fam in dst.layout.families:
            cap = dst.capacity(fam.source)
            others = np.setdiff1d(np.arange(cap), ids[fam.source])
            self.kept[fam.name] = (torch.from_numpy(others), dst.view(fam.name)[:, torch.from_numpy(others)
                                   .to(dst.device)].cpu())

    @staticmethod
    def agree(dev: TierPools, host: TierPools, dev_ids: dict, host_ids: dict) -> bool:
        """True when device rows ``dev_ids`` hold the bytes of host rows ``host_ids`` (per
        anchor; families on an anchor not in ``dev_ids`` are not compared)."""
        ok = True
        for fam in dev.layout.families:
            if fam.source not in dev_ids:
                continue
            d = torch.from_numpy(dev_ids[fam.source]).to(dev.device)
            h = torch.from_numpy(host_ids[fam.source])
            dv, hv = dev.view(fam.name), host.view(fam.name)
            for l in range(dv.shape[0]):
                ok &= torch.equal(dv[l, d].cpu(), hv[l, h])
        return bool(ok)

    def verify(self, src: TierPools, src_ids: dict, dst_ids: dict) -> bool:
        ok = True
        for fam in self.dst.layout.families:
            s = torch.from_numpy(src_ids[fam.source])
            d = torch.from_numpy(dst_ids[fam.source])
            sv, dv = src.view(fam.name), self.dst.view(fam.name)
            for l in range(sv.shape[0]):
                ok &= torch.equal(sv[l, s.to(sv.device)].cpu(), dv[l, d.to(dv.device)].cpu())
            others, old = self.kept[fam.name]
            ok &= torch.equal(dv[:, others.to(dv.device)].cpu(), old)
        return bool(ok)


def device_name(device: torch.device) -> str:
    return "cpu" if device.type == "cpu" else torch.cuda.get_device_name(device)
