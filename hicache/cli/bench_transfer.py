"""``hicache bench transfer``: batched D2H / H2D copies against memcpy and a naive loop.

In one run, for the same total bytes (``--pages`` history pages plus ``--snapshots`` state
snapshots, every family of the layout, random scattered ids on both sides):

(a) ``memcpy``: one contiguous copy (torch ``copy_``; on CUDA a pinned ``cudaMemcpy``);
(b) ``naive``: a per-page, per-family, per-layer ``copy_`` loop, what one writes first;
(c) ``d2h`` / ``h2d``: the TransferController (submit, ``step()``, wait), one merged batch;
(d) with ``--duplex``, both at once: a D2H and an H2D of disjoint rows in one step (two
    streams on CUDA, two worker threads on CPU) against two contiguous copies at once.

Every figure is the best of ``--reps`` rounds, each round timing memcpy next to the batch
so machine noise hits both. After the batch runs, every destination row is compared with
its source and every other row of the destination pools with its old bytes.
"""

from __future__ import annotations

import argparse
from dataclasses import replace
from functools import partial
from typing import Any, Callable

import numpy as np
import torch

from hicache.cli.bench_pools import (Check, Clock, add_copy_arguments, bump, check_host_memory, device_name, fill,
                                     full_pools, progress_printer)
from hicache.cli.common import at_least, print_json, resolve_config
from hicache.cli.table import render_table
from hicache.config import load_config
from hicache.pools import TierPools, resolve_device
from hicache.transfer import CopyHandle, QueueFull, TransferConfig, TransferController, native, native_status
from hicache.units import format_bytes


def add_arguments(p: argparse.ArgumentParser) -> None:
    add_copy_arguments(p, pages=1024, what="per batch", reps=8)
    p.add_argument("--snapshots", type=int, default=None,
                   help="state snapshots per batch (default pages/16, at least 1 if the layout has state)")
    p.add_argument("--duplex", action="store_true",
                   help="also both directions at once (D2H and H2D of disjoint rows in one step) against "
                        "two contiguous copies at once; doubles the pools")


_progress = progress_printer("transfer")


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


def _duplex_memcpy(device: torch.device, bufs: list[torch.Tensor]) -> Callable[[], object] | None:
    """Both directions at once, each one contiguous pinned ``copy_`` on its own stream (two
    DMA engines): the limit of ``--duplex`` on CUDA. None on CPU, where both directions
    share one memory bus and the limit is the two memcpys one after the other."""
    if device.type != "cuda":
        return None
    flat_dev, flat_host, flat_dev2, flat_host2 = bufs
    streams = [torch.cuda.Stream(device=device) for _ in range(2)]

    def both() -> None:
        main = torch.cuda.current_stream(device)
        for s, (dst, src) in zip(streams, ((flat_host, flat_dev), (flat_dev2, flat_host2))):
            s.wait_stream(main)
            with torch.cuda.stream(s):
                dst.copy_(src, non_blocking=True)
        for s in streams:
            main.wait_stream(s)
    return both


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
    # Room to scatter into: 25% more rows than are copied (--duplex: two disjoint sets).
    sets = 2 if args.duplex else 1
    cap_p, cap_s = sets * args.pages + max(1, args.pages // 4), sets * snaps + max(1, snaps // 4)
    page_b, snap_b = layout.object_bytes("page"), layout.object_bytes("state")
    total = args.pages * page_b + snaps * snap_b
    pool_b = cap_p * page_b + cap_s * snap_b
    host_need = pool_b + 2 * sets * total + pool_b // 4 + (pool_b if device.type == "cpu" else 0)
    check_host_memory("--pages", args.pages, host_need, pcfg.host_reserve_bytes)
    _progress(f"{layout.model or args.config}: {args.pages} pages + {snaps} snapshots = "
              f"{format_bytes(total)} per direction on {device}, host {host_layout}")
    pin = device.type == "cuda"
    pools = full_pools(layout, device, host_layout, cap_p, cap_s)
    dev, host = pools.device, pools.host
    _progress("filling pools with random bytes")
    fill(dev, 1)
    fill(host, 2)
    rng = np.random.default_rng(0)
    perms = {t: {"page": rng.permutation(cap_p), "state": rng.permutation(cap_s)} for t in ("dev", "host")}
    n = {"page": args.pages, "state": snaps}
    # Set k of a tier: ids [k*n, (k+1)*n) of its permutation (scattered, disjoint sets).
    ids = [{t: {s: perms[t][s][k * n[s]:(k + 1) * n[s]].astype(np.int64) for s in n} for t in perms}
           for k in range(sets)]
    dev_ids, host_ids = ids[0]["dev"], ids[0]["host"]

    clock = Clock(device)
    bufs = [torch.empty(total, dtype=torch.uint8, device=device).fill_(3),
            torch.empty(total, dtype=torch.uint8, pin_memory=pin).fill_(4)]
    ctl = TransferController(pools, tcfg)
    # Loads layer by layer (what a GPU engine uses so layer N computes while N+1 loads),
    # measured too; on CPU the default (auto) loads a batch at once.
    ctl_layer = TransferController(pools, replace(tcfg, load_granularity="layer"))
    tiers = {"d2h": (dev, host, dev_ids, host_ids), "h2d": (host, dev, host_ids, dev_ids)}

    def batched(directions: tuple[str, ...], c: TransferController = ctl) -> None:
        handles: list[CopyHandle] = []
        for direction in directions:
            # both at once (--duplex): the H2D moves the second set, so the two never conflict
            k = 1 if len(directions) == 2 and direction == "h2d" else 0
            src, dst = (ids[k]["dev"], ids[k]["host"]) if direction == "d2h" else (ids[k]["host"], ids[k]["dev"])
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
            bump(host)
        check = Check(dst_t, dst_ids)
        batched((direction,))
        ok = check.verify(src_t, src_ids, dst_ids)
        verified &= ok
        _progress(f"{direction} verified: {ok}")
        del check
    if args.duplex:
        # new host bytes: both sets' destinations now differ from their sources
        bump(host)
        bufs += [torch.empty(total, dtype=torch.uint8, device=device).fill_(5),
                 torch.empty(total, dtype=torch.uint8, pin_memory=pin).fill_(6)]
        batched(("d2h", "h2d"))
        ok = Check.agree(dev, host, dev_ids, host_ids) and Check.agree(dev, host, ids[1]["dev"], ids[1]["host"])
        verified &= ok
        _progress(f"both at once verified: {ok}")

    # 2. Speed: rounds interleave the baselines and both directions, best of each kept.
    mems = _memcpy_candidates(device, bufs[0], bufs[1])
    duplex_mem = _duplex_memcpy(device, bufs) if args.duplex else None
    best: dict[str, float] = {}

    def keep(key: str, seconds: float) -> None:
        best[key] = min(best.get(key, float("inf")), seconds)

    for rep in range(args.reps):
        _progress(f"round {rep + 1}/{args.reps}")
        for direction in ("d2h", "h2d"):
            for name, fn in mems[direction].items():
                keep(f"memcpy_{direction}:{name}", clock.time(fn))
            keep(direction, clock.time(lambda: batched((direction,))))
        keep("h2d_per_layer", clock.time(lambda: batched(("h2d",), ctl_layer)))
        if args.duplex:
            keep("duplex", clock.time(lambda: batched(("d2h", "h2d"))))
            if duplex_mem is not None:
                keep("memcpy_duplex", clock.time(duplex_mem))
    # The last H2D copied host rows back over the device rows the D2H read: they must agree.
    verified &= Check.agree(dev, host, dev_ids, host_ids)
    _progress("naive loop")
    for direction in ("d2h", "h2d"):
        src_t, dst_t, src_ids, dst_ids = tiers[direction]
        for _ in range(min(2, args.reps)):
            keep(f"naive_{direction}", clock.time(lambda: _naive(src_t, dst_t, src_ids, dst_ids)))
    out = _results(best, total, device)
    ctl.shutdown()
    ctl_layer.shutdown()
    pools.check_integrity()
    out.update(verified=verified, backend=ctl.backend, native=native_status() if device.type == "cpu" else None,
               load_granularity=ctl.load_granularity, layout=layout.model or str(args.config),
               host_layout=host_layout, pages=args.pages, snapshots=snaps, bytes=total, reps=args.reps,
               threads=torch.get_num_threads())
    if args.json:
        print_json(out)
    else:
        _print_table(out)
    return 0 if verified else 1


def _results(best: dict[str, float], total: int, device: torch.device) -> dict:
    """GB/s of every path from the best seconds, and each one's ratio to its limit."""
    result, methods = {}, {}
    for direction in ("d2h", "h2d"):
        cands = {k.split(":", 1)[1]: v for k, v in best.items() if k.startswith(f"memcpy_{direction}:")}
        methods[direction] = min(cands, key=cands.__getitem__)
        result[f"memcpy_{direction}_gbps"] = total / cands[methods[direction]] / 1e9
        result[f"{direction}_gbps"] = total / best[direction] / 1e9
        result[f"naive_{direction}_gbps"] = total / best[f"naive_{direction}"] / 1e9
        result[f"torch_copy_{direction}_gbps"] = total / best[f"memcpy_{direction}:torch_copy"] / 1e9
    if device.type == "cpu":   # the same CPU-to-CPU copy both ways: one limit
        memcpy = max(result["memcpy_d2h_gbps"], result["memcpy_h2d_gbps"])
        base = {"d2h": memcpy, "h2d": memcpy}
    else:
        memcpy = (result["memcpy_d2h_gbps"] + result["memcpy_h2d_gbps"]) / 2
        base = {d: result[f"memcpy_{d}_gbps"] for d in ("d2h", "h2d")}
    naive = max(result["naive_d2h_gbps"], result["naive_h2d_gbps"])
    out: dict[str, Any] = {
        "memcpy_gbps": memcpy, "naive_gbps": naive,
        "d2h_gbps": result["d2h_gbps"], "h2d_gbps": result["h2d_gbps"],
        "d2h_ratio": result["d2h_gbps"] / base["d2h"], "h2d_ratio": result["h2d_gbps"] / base["h2d"],
        "device": device_name(device),
        "d2h_vs_naive": result["d2h_gbps"] / naive, "h2d_vs_naive": result["h2d_gbps"] / naive,
        "memcpy_method": methods,
        "h2d_per_layer_gbps": total / best["h2d_per_layer"] / 1e9,
        "h2d_per_layer_ratio": total / best["h2d_per_layer"] / 1e9 / base["h2d"],
    }
    for d in ("d2h", "h2d"):
        for k in (f"memcpy_{d}_gbps", f"naive_{d}_gbps", f"torch_copy_{d}_gbps"):
            out[k] = result[k]
        out[f"naive_{d}_ratio"] = result[f"naive_{d}_gbps"] / base[d]
    if "duplex" in best:
        # Both at once moves 2 x total. The limit: two DMA copies at once on CUDA; on CPU
        # the two best memcpys one after the other (one memory bus).
        limit_s = best.get("memcpy_duplex", total / base["d2h"] / 1e9 + total / base["h2d"] / 1e9)
        out["duplex_gbps"] = 2 * total / best["duplex"] / 1e9
        out["memcpy_duplex_gbps"] = 2 * total / limit_s / 1e9
        out["duplex_ratio"] = out["duplex_gbps"] / out["memcpy_duplex_gbps"]
    return out


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
    if "duplex_gbps" in o:
        print(f"both at once       {o['duplex_gbps']:.2f} GB/s D2H + H2D = {o['duplex_ratio']:.2f}x of "
              f"{o['memcpy_duplex_gbps']:.2f} GB/s for two contiguous copies at once")
    print(f"verified           {'every byte matched' if o['verified'] else 'FAILED: bytes differ'}")
