"""``hicache bench overlap``: how much of a per-layer load hides behind layer compute.

An engine that resumes a request from the host loads its pages layer by layer
(``load_granularity="layer"``): layer N computes while layer N+1 is still copying, and
``LoadHandle.wait_layer(N)`` is what it waits on. This measures that, with a stand-in for
the layer's work (``k`` square matmuls per model layer on the caller's stream), in one run:

* ``copy``: the load of ``--pages`` scattered pages alone (one launch per layer);
* ``compute``: the stand-in compute alone, ``k`` chosen so that it takes about as long as
  the copy (then at most all of the copy can hide, and the figure says how much does);
* ``per_layer``: the load, and per layer ``wait_layer(l)`` then that layer's compute --
  the engine's order; the first layer's copy cannot hide, so the bound is ``1 - 1/layers``;
* ``free``: the load and all the compute launched without waiting (no dependency): what
  the hardware overlaps at best (on CUDA the Triton copy and the matmul share the SMs).

``hidden = (copy + compute - both) / copy``, clamped to [0, 1]. Each figure is the best of
``--reps`` rounds. Before timing, one per-layer load into device rows of other bytes checks
that every layer's rows have landed when ``wait_layer`` returns, and that the bytes match.
"""

from __future__ import annotations

import argparse
import time
from typing import Callable

import numpy as np
import torch

from hicache.cli.bench_pools import (Check, add_copy_arguments, check_host_memory, device_name, fill, full_pools, pairs,
                                     progress_printer)
from hicache.cli.common import at_least, print_json, resolve_config
from hicache.cli.table import render_table
from hicache.config import load_config
from hicache.pools import TieredPools, resolve_device
from hicache.transfer import LoadHandle, TransferConfig, TransferController
from hicache.units import format_bytes

_progress = progress_printer("overlap")
MAX_K = 256   # matmuls per layer: bounds the run when the copy is slow and the matmul fast


def add_arguments(p: argparse.ArgumentParser) -> None:
    add_copy_arguments(p, pages=256, what="loaded", reps=5)
    p.add_argument("--matmul", type=int, default=None,
                   help="side of the stand-in square matmul (default 4096 on CUDA, bf16; 128 on CPU, fp32)")
    p.add_argument("--gpu-programs", type=int, default=0,
                   help="bound the Triton copy's grid to N programs (TransferConfig.gpu_programs; default 0: "
                        "one program per chunk)")


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _timed(device: torch.device, fn: Callable[[], object]) -> float:
    """Wall seconds of ``fn`` until the GPU is idle again (the host waits on layers here,
    so GPU events alone would miss the time the host spends polling)."""
    _sync(device)
    t0 = time.perf_counter()
    fn()
    _sync(device)
    return time.perf_counter() - t0


class _Load:
    """The measured load: host rows ``src`` -> device rows ``dst``, every page family."""

    def __init__(self, ctl: TransferController, src: np.ndarray, dst: np.ndarray):
        self.ctl, self.src, self.dst = ctl, src, dst

    def start(self) -> LoadHandle:
        h = self.ctl.copy("h2d", "page", self.src, self.dst)
        assert isinstance(h, LoadHandle), f"one load at a time never fills the queue: {h}"
        self.ctl.step()
        return h

    def finish(self, h: LoadHandle) -> None:
        assert h.wait(60), h.error or "the load did not finish in 60 s"
        assert all(a.ok for a in self.ctl.poll())


def _landed_per_layer(pools: TieredPools, load: _Load, layers: list[int]) -> bool:
    """One load into device rows of other bytes; as each ``wait_layer`` returns, that
    layer's rows of every family must already hold the host's bytes."""
    fill(pools.device, 99)
    h = load.start()
    ok = True
    d, s = torch.from_numpy(load.dst).to(pools.device.device), torch.from_numpy(load.src)
    for layer in layers:
        ok &= h.wait_layer(layer, timeout=60)
        for fam in pools.layout.families_on("page"):
            if layer in fam.layer_ids:
                i = fam.layer_ids.index(layer)
                ok &= torch.equal(pools.device.view(fam.name)[i, d].cpu(), pools.host.view(fam.name)[i, s])
    load.finish(h)
    return bool(ok)


def run(args: argparse.Namespace) -> int:
    # On CPU the stand-in runs on one torch thread: with intra-op threads each small matmul
    # pays an OpenMP fork/join, which next to the copy's threads on a shared 2-core machine
    # took 20+ ms instead of 0.1 (the same reason as bench transfer's naive loop).
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        return _run(args)
    finally:
        torch.set_num_threads(threads)


def _run(args: argparse.Namespace) -> int:
    layout, cfg = load_config(resolve_config(args.config))
    device = resolve_device(args.device or cfg.pools.device)
    host_layout = args.host_layout or cfg.pools.host_layout
    at_least("--pages", args.pages, 1)
    at_least("--reps", args.reps, 1)
    side = at_least("--matmul", args.matmul, 1) or (4096 if device.type == "cuda" else 128)
    at_least("--gpu-programs", args.gpu_programs, 0)
    tcfg = TransferConfig(backend=args.backend, load_granularity="layer", gpu_programs=args.gpu_programs)
    cap = args.pages + max(1, args.pages // 4)
    total = args.pages * layout.object_bytes("page")
    pool_b = cap * layout.object_bytes("page") + layout.object_bytes("state")
    check_host_memory("--pages", args.pages, pool_b * (1 if device.type == "cuda" else 2),
                      cfg.pools.host_reserve_bytes)
    pools = full_pools(layout, device, host_layout, cap, 1)
    fill(pools.host, 2)
    rng = np.random.default_rng(0)
    src, dst = pairs(rng, args.pages, cap), pairs(rng, args.pages, cap)
    ctl = TransferController(pools, tcfg)
    load = _Load(ctl, src, dst)
    layers = sorted({l for f in layout.families_on("page") for l in f.layer_ids})
    _progress(f"{layout.model or args.config}: {args.pages} pages = {format_bytes(total)} over "
              f"{len(layers)} layers on {device}, host {host_layout}")
    verified = _landed_per_layer(pools, load, layers)
    _progress(f"per-layer landing verified: {verified}")

    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    g = torch.Generator(device=device).manual_seed(0)
    x = torch.randn(side, side, dtype=dtype, device=device, generator=g)
    w = torch.randn(side, side, dtype=dtype, device=device, generator=g)
    y = torch.empty_like(x)

    def compute(k: int) -> None:
        for _ in range(k):
            torch.mm(x, w, out=y)

    def copy_alone() -> None:
        h = load.start()
        _sync(device)   # the GPU is done: the handle's host-side poll adds nothing to the time
        load.finish(h)

    # Calibrate: k matmuls per layer so that the compute takes about as long as the copy.
    compute(2)
    copy_s = min(_timed(device, copy_alone) for _ in range(2))
    mm_s = min(_timed(device, lambda: compute(len(layers))) for _ in range(2)) / len(layers)
    k = int(min(MAX_K, max(1, round(copy_s / len(layers) / max(mm_s, 1e-9)))))
    _progress(f"copy {copy_s * 1e3:.2f} ms; one matmul {mm_s * 1e3:.3f} ms: {k} per layer")

    def per_layer() -> None:
        h = load.start()
        for layer in layers:
            assert h.wait_layer(layer, timeout=60), h.error or f"layer {layer} did not land"
            compute(k)
        _sync(device)
        load.finish(h)

    def free() -> None:
        h = load.start()
        for _ in layers:
            compute(k)
        _sync(device)
        load.finish(h)

    best: dict[str, float] = {}
    runs = {"copy": copy_alone, "compute": lambda: compute(k * len(layers)), "per_layer": per_layer,
            "free": free}
    for rep in range(args.reps):
        _progress(f"round {rep + 1}/{args.reps}")
        for name, fn in runs.items():
            best[name] = min(best.get(name, float("inf")), _timed(device, fn))
    verified &= Check.agree(pools.device, pools.host, {"page": load.dst}, {"page": load.src})
    ctl.shutdown()
    pools.check_integrity()

    def hidden(both: float) -> float:
        return max(0.0, min(1.0, (best["copy"] + best["compute"] - both) / best["copy"]))

    out = {
        "device": device_name(device), "layout": layout.model or str(args.config), "host_layout": host_layout,
        "backend": ctl.backend, "gpu_programs": args.gpu_programs, "pages": args.pages, "bytes": total, "layers": len(layers),
        "matmul": side, "matmuls_per_layer": k, "reps": args.reps,
        "copy_s": best["copy"], "compute_s": best["compute"],
        "per_layer_s": best["per_layer"], "free_s": best["free"],
        "copy_gbps": total / best["copy"] / 1e9,
        "hidden_per_layer": hidden(best["per_layer"]), "hidden_free": hidden(best["free"]),
        "hidden_bound_per_layer": 1 - 1 / len(layers),
        "verified": bool(verified),
    }
    if args.json:
        print_json(out)
    else:
        _print_table(out)
    return 0 if verified else 1


def _print_table(o: dict) -> None:
    rows = [["copy alone (per-layer load)", o["copy_s"] * 1e3, None],
            [f"compute alone ({o['matmuls_per_layer']} x {o['matmul']}^2 matmul per layer)",
             o["compute_s"] * 1e3, None],
            ["both: wait_layer(l), then layer l's compute", o["per_layer_s"] * 1e3, f"{o['hidden_per_layer']:.2f}"],
            ["both: no waits (hardware overlap)", o["free_s"] * 1e3, f"{o['hidden_free']:.2f}"]]
    print(render_table(["run", "ms", "copy hidden"], rows,
                       title=f"{o['layout']} on {o['device']}: load of {o['pages']} pages = "
                             f"{format_bytes(o['bytes'])} over {o['layers']} layers ({o['backend']}), "
                             f"host {o['host_layout']}, best of {o['reps']}"))
    print()
    print(f"copy               {o['copy_gbps']:.2f} GB/s; hidden share bound for per-layer waits "
          f"{o['hidden_bound_per_layer']:.2f} (the first layer's copy cannot hide)")
    print(f"verified           {'every layer landed before its wait returned' if o['verified'] else 'FAILED'}")
