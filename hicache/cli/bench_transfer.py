"""``hicache bench transfer``: batched D2H / H2D copies against memcpy and a naive loop.

In one run, for the same total bytes (``--pages`` history pages plus ``--snapshots`` state
snapshots, every family of the layout, random scattered ids on both sides):

(a) ``memcpy``: one contiguous copy (torch ``copy_``; on CUDA a pinned ``cudaMemcpy``);
(b) ``naive``: a per-page, per-family, per-layer ``copy_`` loop, what one writes first;
(c) ``d2h`` / ``h2d``: the TransferController (submit, ``step()``, wait), one merged batch.

Every figure is the best of ``--reps`` rounds, each round timing memcpy next to the batch
so machine noise hits both. After the batch runs, every destination row is compared with
its source and every other row of the destination pools with its old bytes.
"""

from __future__ import annotations

import argparse
import sys
import time
from dataclasses import replace
from functools import partial
from typing import Callable

import numpy as np
import psutil
import torch

from hicache.cli.common import at_least, print_json, resolve_config
from hicache.cli.table import render_table
from hicache.config import load_config
from hicache.errors import ConfigError
from hicache.pools import PoolPlan, TieredPools, TierPools, resolve_device
from hicache.transfer import CopyHandle, QueueFull, TransferConfig, TransferController, native, native_status
from hicache.units import format_bytes

GiB = 1024**3


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--config", default="deepseek-v4-flash",
                   help="config YAML or a name from configs/ (default: deepseek-v4-flash)")
    p.add_argument("--pages", type=int, default=1024, help="history pages per batch (default 1024)")
    p.add_argument("--snapshots", type=int, default=None,
                   help="state snapshots per batch (default pages/16, at least 1 if the layout has state)")
    p.add_argument("--reps", type=int, default=8, help="timed rounds; the best is reported (default 8)")
    p.add_argument("--device", default=None, help="cpu, cuda or auto (default: the config's device)")
    p.add_argument("--host-layout", choices=["layer_first", "page_first"], default=None,
                   help="host pool layout (default: the config's host_layout)")
    p.add_argument("--backend", default="auto", help="copy backend (default auto)")
    p.add_argument("--json", action="store_true", help="print one JSON object")


_T0 = time.monotonic()


def _progress(msg: str) -> None:
    print(f"[bench transfer {time.monotonic() - _T0:6.1f}s] {msg}", file=sys.stderr, flush=True)


class _Clock:
    """Wall time on CPU; CUDA events around the work on GPU."""

    def __init__(self, device: torch.device):
        self.cuda = device.type == "cuda"

    def time(self, fn) -> float:
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


def _fill(tier: TierPools, seed: int) -> None:
    g = torch.Generator().manual_seed(seed)
    chunk = 64 << 20
    for sc in tier.sidecars.values():
        flat = sc.data if sc.data.is_contiguous() else None
        if flat is not None and sc.data.is_cuda:
            flat.view(-1).random_(0, 256)
            continue
        for l in range(sc.data.shape[0]):
            layer = sc.data[l]
            rows = max(1, chunk // max(1, layer.shape[1]))
            for lo in range(0, layer.shape[0], rows):
                part = layer[lo: lo + rows]
                part.copy_(torch.randint(0, 256, tuple(part.shape), dtype=torch.uint8, generator=g))


def _pairs(rng: np.random.Generator, n: int, cap: int) -> np.ndarray:
    return rng.permutation(cap)[:n].astype(np.int64)


class _Check:
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
        ok = True
        for fam in dev.layout.families:
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


def _memcpy_candidates(device: torch.device, flat_dev: torch.Tensor,
                       flat_host: torch.Tensor) -> dict[str, dict[str, Callable[[], object]]]:
    """Contiguous copies of the same bytes; the fastest one is the limit we compare with.

    On CPU: torch ``copy_`` (its own threads) and the native library copying the buffer as
    a few large pieces with streaming stores (the best plain copy this machine has). On
    CUDA: a pinned ``cudaMemcpyAsync`` through ``copy_``.
    """
    out: dict[str, dict[str, Callable[[], object]]] = {
        "d2h": {"torch_copy": lambda: flat_host.copy_(flat_dev, non_blocking=True)},
        "h2d": {"torch_copy": lambda: flat_dev.copy_(flat_host, non_blocking=True)}}
    if device.type == "cpu" and native.load() is not None:
        n = flat_dev.numel()
        parts = 64
        cuts = np.linspace(0, n, parts + 1).astype(np.int64)
        lens = np.diff(cuts)
        threads = torch.get_num_threads()
        for direction, (a, b) in (("d2h", (flat_dev, flat_host)), ("h2d", (flat_host, flat_dev))):
            src, dst = a.data_ptr() + cuts[:-1], b.data_ptr() + cuts[:-1]
            out[direction]["native_stream"] = partial(native.copy_pieces, src, dst, lens, threads, stream=True)
    return out


def _naive(src: TierPools, dst: TierPools, src_ids: dict, dst_ids: dict) -> None:
    """The loop one writes first: every page, every family, every layer, one copy_.

    Run with one torch thread: with intra-op threads each ~37 KB ``copy_`` pays an OpenMP
    fork/join, which on a shared 2-core machine made the loop 10-100x slower and its
    timing noise. One thread is the faster (so the stricter) baseline here.
    """
    non_blocking = src.device.type == "cuda" or dst.device.type == "cuda"
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        _naive_loop(src, dst, src_ids, dst_ids, non_blocking)
    finally:
        torch.set_num_threads(threads)


def _naive_loop(src: TierPools, dst: TierPools, src_ids: dict, dst_ids: dict, non_blocking: bool) -> None:
    for fam in src.layout.families:
        sv, dv = src.view(fam.name), dst.view(fam.name)
        if sv.shape[2] == 0:
            continue
        for s, d in zip(src_ids[fam.source].tolist(), dst_ids[fam.source].tolist()):
            for l in range(sv.shape[0]):
                dv[l, d].copy_(sv[l, s], non_blocking=non_blocking)


def run(args: argparse.Namespace) -> int:
    layout, cfg = load_config(resolve_config(args.config))
    pcfg = cfg.pools
    device = resolve_device(args.device or pcfg.device)
    host_layout = args.host_layout or pcfg.host_layout
    at_least("--pages", args.pages, 1)
    at_least("--reps", args.reps, 1)
    has_state = layout.object_bytes("state") > 0
    snaps = args.snapshots if args.snapshots is not None else (max(1, args.pages // 16) if has_state else 0)
    at_least("--snapshots", snaps, 0)
    tcfg = TransferConfig(backend=args.backend)  # validates the backend name
    # Room to scatter into: 25% more rows than are copied.
    cap_p, cap_s = args.pages + max(1, args.pages // 4), snaps + max(1, snaps // 4)
    page_b, snap_b = layout.object_bytes("page"), layout.object_bytes("state")
    total = args.pages * page_b + snaps * snap_b
    pool_b = cap_p * page_b + cap_s * snap_b
    host_need = pool_b + 2 * total + pool_b // 4 + (pool_b if device.type == "cpu" else 0)
    avail = psutil.virtual_memory().available - pcfg.host_reserve_bytes
    if host_need > avail:
        raise ConfigError("--pages", args.pages,
                          f"needs about {host_need / GiB:.1f} GiB of host memory but "
                          f"{max(avail, 0) / GiB:.1f} GiB is available; use fewer pages")
    _progress(f"{layout.model or args.config}: {args.pages} pages + {snaps} snapshots = "
              f"{format_bytes(total)} per direction on {device}, host {host_layout}")
    pin = device.type == "cuda"
    dev = TierPools(layout, "device", num_pages=cap_p, num_snapshots=cap_s, device=device)
    host = TierPools(layout, "host", num_pages=cap_p, num_snapshots=cap_s, host_layout=host_layout,
                     pin_memory=pin)
    pools = TieredPools(layout, PoolPlan(cap_p, cap_s, cap_p, cap_s, page_b, snap_b), dev, host)
    for tier in (dev, host):
        for source, cap in (("page", cap_p), ("state", cap_s)):
            assert tier.alloc(source, cap).ok, "fresh pools hold their own capacity"
    _progress("filling pools with random bytes")
    _fill(dev, 1)
    _fill(host, 2)
    rng = np.random.default_rng(0)
    dev_ids = {"page": _pairs(rng, args.pages, cap_p), "state": _pairs(rng, snaps, cap_s)}
    host_ids = {"page": _pairs(rng, args.pages, cap_p), "state": _pairs(rng, snaps, cap_s)}

    clock = _Clock(device)
    flat_dev = torch.empty(total, dtype=torch.uint8, device=device).fill_(3)
    flat_host = torch.empty(total, dtype=torch.uint8, pin_memory=pin).fill_(4)
    ctl = TransferController(pools, tcfg)
    # Loads layer by layer (what a GPU engine uses so layer N computes while N+1 loads),
    # measured too; on CPU the default (auto) loads a batch at once.
    ctl_layer = TransferController(pools, replace(tcfg, load_granularity="layer"))
    tiers = {"d2h": (dev, host, dev_ids, host_ids), "h2d": (host, dev, host_ids, dev_ids)}

    def batched(direction: str, c: TransferController = ctl) -> None:
        _, _, src, dst = tiers[direction]
        handles: list[CopyHandle] = []
        for s in ("page", "state"):
            if src[s].size:
                h = c.copy(direction, s, src[s], dst[s])
                assert not isinstance(h, QueueFull), f"one batch at a time never fills the queue: {h}"
                handles.append(h)
        c.step()
        assert all(h.wait() for h in handles), [h.error for h in handles]
        assert all(a.ok for a in c.poll())

    # 1. Correctness first: each direction once, into destinations whose old bytes differ,
    #    then every destination row against its source and every other row against its
    #    old bytes. (H2D gets fresh host bytes, so a load that moved nothing would show.)
    verified = True
    for direction in ("d2h", "h2d"):
        src_t, dst_t, src_ids, dst_ids = tiers[direction]
        if direction == "h2d":
            _fill(host, 3)
        check = _Check(dst_t, dst_ids)
        batched(direction)
        ok = check.verify(src_t, src_ids, dst_ids)
        verified &= ok
        _progress(f"{direction} verified: {ok}")
        del check

    # 2. Speed: rounds interleave the baselines and both directions, best of each kept.
    mems = _memcpy_candidates(device, flat_dev, flat_host)
    best: dict[str, float] = {}

    def keep(key: str, seconds: float) -> None:
        best[key] = min(best.get(key, float("inf")), seconds)

    for rep in range(args.reps):
        _progress(f"round {rep + 1}/{args.reps}")
        for direction in ("d2h", "h2d"):
            for name, fn in mems[direction].items():
                keep(f"memcpy_{direction}:{name}", clock.time(fn))
            keep(direction, clock.time(lambda: batched(direction)))
        keep("h2d_per_layer", clock.time(lambda: batched("h2d", ctl_layer)))
    # The last H2D copied host rows back over the device rows the D2H read: they must agree.
    verified &= _Check.agree(dev, host, dev_ids, host_ids)
    _progress("naive loop")
    for direction in ("d2h", "h2d"):
        src_t, dst_t, src_ids, dst_ids = tiers[direction]
        for _ in range(min(2, args.reps)):
            keep(f"naive_{direction}", clock.time(lambda: _naive(src_t, dst_t, src_ids, dst_ids)))
    result = {}
    methods = {}
    for direction in ("d2h", "h2d"):
        cands = {k.split(":", 1)[1]: v for k, v in best.items() if k.startswith(f"memcpy_{direction}:")}
        methods[direction] = min(cands, key=cands.__getitem__)
        result[f"memcpy_{direction}_gbps"] = total / cands[methods[direction]] / 1e9
        result[f"{direction}_gbps"] = total / best[direction] / 1e9
        result[f"naive_{direction}_gbps"] = total / best[f"naive_{direction}"] / 1e9
        result[f"torch_copy_{direction}_gbps"] = total / best[f"memcpy_{direction}:torch_copy"] / 1e9
    ctl.shutdown()
    ctl_layer.shutdown()
    pools.check_integrity()
    if device.type == "cpu":   # the same CPU-to-CPU copy both ways: one limit
        memcpy = max(result["memcpy_d2h_gbps"], result["memcpy_h2d_gbps"])
        base = {"d2h": memcpy, "h2d": memcpy}
    else:
        memcpy = (result["memcpy_d2h_gbps"] + result["memcpy_h2d_gbps"]) / 2
        base = {d: result[f"memcpy_{d}_gbps"] for d in ("d2h", "h2d")}
    naive = max(result["naive_d2h_gbps"], result["naive_h2d_gbps"])
    out = {
        "memcpy_gbps": memcpy, "naive_gbps": naive,
        "d2h_gbps": result["d2h_gbps"], "h2d_gbps": result["h2d_gbps"],
        "d2h_ratio": result["d2h_gbps"] / base["d2h"], "h2d_ratio": result["h2d_gbps"] / base["h2d"],
        "verified": verified,
        "device": "cpu" if device.type == "cpu" else torch.cuda.get_device_name(device),
        "d2h_vs_naive": result["d2h_gbps"] / naive, "h2d_vs_naive": result["h2d_gbps"] / naive,
        "memcpy_d2h_gbps": result["memcpy_d2h_gbps"], "memcpy_h2d_gbps": result["memcpy_h2d_gbps"],
        "naive_d2h_gbps": result["naive_d2h_gbps"], "naive_h2d_gbps": result["naive_h2d_gbps"],
        "backend": ctl.backend, "native": native_status() if device.type == "cpu" else None,
        "memcpy_method": methods,
        "torch_copy_d2h_gbps": result["torch_copy_d2h_gbps"],
        "torch_copy_h2d_gbps": result["torch_copy_h2d_gbps"],
        "h2d_per_layer_gbps": total / best["h2d_per_layer"] / 1e9,
        "h2d_per_layer_ratio": total / best["h2d_per_layer"] / 1e9 / base["h2d"],
        "load_granularity": ctl.load_granularity,
        "layout": layout.model or str(args.config), "host_layout": host_layout,
        "pages": args.pages, "snapshots": snaps, "bytes": total, "reps": args.reps,
        "threads": torch.get_num_threads(),
    }
    if args.json:
        print_json(out)
    else:
        _print_table(out)
    return 0 if verified else 1


def _print_table(o: dict) -> None:
    base = {d: o[f"{d}_gbps"] / o[f"{d}_ratio"] for d in ("d2h", "h2d")}   # each direction's limit
    rows = [["memcpy (contiguous)", o["memcpy_d2h_gbps"], o["memcpy_h2d_gbps"],
             f"{o['memcpy_d2h_gbps'] / base['d2h']:.2f}", f"{o['memcpy_h2d_gbps'] / base['h2d']:.2f}"],
            ["naive per-page loop", o["naive_d2h_gbps"], o["naive_h2d_gbps"],
             f"{o['naive_d2h_gbps'] / base['d2h']:.2f}", f"{o['naive_h2d_gbps'] / base['h2d']:.2f}"],
            [f"hicache batched ({o['backend']})", o["d2h_gbps"], o["h2d_gbps"], f"{o['d2h_ratio']:.2f}",
             f"{o['h2d_ratio']:.2f}"],
            ["hicache, loads layer by layer", None, o["h2d_per_layer_gbps"], None,
             f"{o['h2d_per_layer_ratio']:.2f}"]]
    print(render_table(["path", "D2H GB/s", "H2D GB/s", "D2H x memcpy", "H2D x memcpy"], rows,
                       title=f"{o['layout']} on {o['device']}: {o['pages']} pages + {o['snapshots']} "
                             f"snapshots = {format_bytes(o['bytes'])} per direction, host "
                             f"{o['host_layout']}, best of {o['reps']}"))
    print()
    print(f"batched vs naive   D2H {o['d2h_vs_naive']:.1f}x   H2D {o['h2d_vs_naive']:.1f}x "
          f"(naive = the faster direction's loop)")
    print(f"memcpy baseline    {o['memcpy_method']['d2h']} (torch copy_: D2H {o['torch_copy_d2h_gbps']:.2f}, "
          f"H2D {o['torch_copy_h2d_gbps']:.2f} GB/s)")
    print(f"verified           {'every byte matched' if o['verified'] else 'FAILED: bytes differ'}")
