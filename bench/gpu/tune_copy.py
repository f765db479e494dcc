"""Sweep the Triton copy kernel's launch shape on a GPU: bytes per program and warps.

    PYTHONPATH=. python -m bench.gpu.tune_copy [--device cuda] [--kib 524288] [--json PATH]

For each layout (Llama-3.1-8B: 1 MiB per page and layer; DeepSeek-V4-Flash: 3 history
and 3 state families with bytes), host layout (layer_first, page_first) and direction (D2H,
H2D), it copies the same scattered pages with :func:`hicache.transfer.triton_copy.launch`
at every ``chunk_bytes`` x ``num_warps`` x ``vec_bytes`` of the grid below, one
``copy_`` per unit (the copy engine), and a contiguous pinned
``copy_`` of the same bytes in the same process (the DMA rate; every figure is a ratio to
it). Every configuration's bytes are checked against the source once. The defaults in
``triton_copy`` (``CHUNK_BYTES``, ``NUM_WARPS``) come from this sweep (docs/transfer.md).
On CPU (``--device cpu``, ``TRITON_INTERPRET=1``, the tiny layout) it checks that the script runs.
"""

from __future__ import annotations

import json
import os
import sys
import time

import numpy as np
import torch

from bench.gpu.suite import _Parser
from hicache.cli.bench_pools import Clock, fill, full_pools
from hicache.cli.common import resolve_config
from hicache.config import load_config
from hicache.transfer import make_row_copy, triton_copy
from hicache.transfer.plan import CopyPlan

CHUNKS = (0, 1 << 20, 256 << 10, 64 << 10, 16 << 10)    # 0: one program per unit (the old kernel)
WARPS = (4, 8)
VECS = (16, 8)                                            # widest access promised, bytes
LAYOUTS = ("llama-3.1-8b", "deepseek-v4-flash")


def _items(pools, direction: str, ids: dict) -> list:
    src, dst = (pools.device, pools.host) if direction == "d2h" else (pools.host, pools.device)
    side = (0, 1) if direction == "d2h" else (1, 0)
    return [make_row_copy(src.view(f.name), dst.view(f.name), ids[f.index_source][side[0]],
                          ids[f.index_source][side[1]], name=f.name, layer_ids=f.layer_ids)
            for f in pools.layout.families]


def _per_unit_copies(plan: CopyPlan) -> None:
    """The copy-engine alternative: one asynchronous ``copy_`` per (layer, pair) unit."""
    for s in plan.segments:
        it = plan.items[s.item]
        if it.unit_bytes == 0:
            continue
        src, dst = it.src[s.layer], it.dst[s.layer]
        for a, b in zip(it.src_ids.tolist(), it.dst_ids.tolist()):
            dst[b].copy_(src[a], non_blocking=True)


def sweep_layout(name: str, device: torch.device, kib: int, reps: int, host_layout: str,
                 chunks: tuple[int, ...] = CHUNKS, programs: tuple[int, ...] = ()) -> list[dict]:
    layout, _ = load_config(resolve_config(name))
    page_b, snap_b = layout.object_bytes("page"), layout.object_bytes("state")
    pages = max(2, (kib << 10) // (page_b + (snap_b // 16 if snap_b else 0)))
    snaps = max(1, pages // 16) if snap_b else 0
    cap_p, cap_s = pages + pages // 4 + 1, snaps + snaps // 4 + 1
    pools = full_pools(layout, device, host_layout, cap_p, cap_s)
    fill(pools.device, 1)
    fill(pools.host, 2)
    rng = np.random.default_rng(0)
    ids = {"page": (rng.permutation(cap_p)[:pages], rng.permutation(cap_p)[:pages]),
           "state": (rng.permutation(cap_s)[:snaps], rng.permutation(cap_s)[:snaps])}
    total = pages * page_b + snaps * snap_b
    clock = Clock(device)
    pin = device.type == "cuda"
    dbuf = torch.empty(total, dtype=torch.uint8, device=device)
    hbuf = torch.empty(total, dtype=torch.uint8, pin_memory=pin)
    rows = []
    for direction in ("d2h", "h2d"):
        dma = min(clock.time(lambda: (hbuf if direction == "d2h" else dbuf).copy_(
            dbuf if direction == "d2h" else hbuf, non_blocking=True)) for _ in range(reps + 1))
        plan = CopyPlan(_items(pools, direction, ids))
        shapes = [(c, w, v, 0) for c in chunks for w in WARPS for v in VECS]
        shapes += [(triton_copy.CHUNK_BYTES, triton_copy.NUM_WARPS, triton_copy.VEC_BYTES, p) for p in programs]
        for chunk, warps, vec, progs in shapes + [(-1, 0, 0, 0)]:
            def go() -> None:
                if chunk < 0:      # the copy engine: one copy_ per unit (cudaMemcpyAsync)
                    _per_unit_copies(plan)
                else:
                    triton_copy.launch(plan, plan.segments, chunk_bytes=chunk, num_warps=warps, vec_bytes=vec,
                                       programs=progs)
            for it in plan.items:              # scribble first: each shape's check is its own
                it.dst[:, torch.from_numpy(it.dst_ids).to(it.dst.device)] = 0
            go()                                   # compile + check the bytes once
            if device.type == "cuda":
                torch.cuda.synchronize()
            ok = all(torch.equal(it.dst[:, torch.from_numpy(it.dst_ids).to(it.dst.device)].cpu(),
                                 it.src[:, torch.from_numpy(it.src_ids).to(it.src.device)].cpu())
                     for it in plan.items)
            best = min(clock.time(go) for _ in range(reps))
            rows.append({"layout": name, "host_layout": host_layout, "direction": direction,
                         "chunk_bytes": chunk, "num_warps": warps, "vec_bytes": vec, "programs": progs,
                         "bytes": total,
                         "gbps": round(total / best / 1e9, 2), "dma_gbps": round(total / dma / 1e9, 2),
                         "x_dma": round(dma / best, 3), "verified": ok})
            r = rows[-1]
            shape = (f"chunk {chunk >> 10:5d} KiB warps {warps} vec {vec:2d} programs {progs or '-'}" if chunk >= 0
                     else "one copy_ per unit")
            print(f"{name:18s} {host_layout:11s} {direction} {shape}: {r['gbps']:7.2f} GB/s = {r['x_dma']:.2f}x "
                  f"DMA {r['dma_gbps']:.1f}; ok {ok}", file=sys.stderr, flush=True)
    del pools, dbuf, hbuf
    if device.type == "cuda":
        torch.cuda.empty_cache()
    return rows


def main(argv: list[str] | None = None) -> int:
    p = _Parser(prog="bench/gpu/tune_copy.py", description=__doc__.split("\n\n")[0])   # errors: one line
    p.add_argument("--device", choices=["cuda", "cpu"], default="cuda")
    p.add_argument("--kib", type=int, default=None, help="KiB per direction (default 524288 = 512 MiB on CUDA, 8 on CPU)")
    p.add_argument("--reps", type=int, default=None)
    p.add_argument("--layouts", default=None,
                   help=f"comma-separated config names (default {','.join(LAYOUTS)} on CUDA, tiny-hybrid on CPU)")
    p.add_argument("--chunks", default=None, help="comma-separated chunk sizes in KiB, 0 = whole unit")
    p.add_argument("--host-layouts", default="layer_first,page_first")
    p.add_argument("--programs", default="",
                   help="comma-separated bounded grids to try at the shipped shape (TransferConfig.gpu_programs)")
    p.add_argument("--json", default=None, help="write the rows here")
    a = p.parse_args(argv)
    device = torch.device(a.device)
    if device.type == "cpu":
        os.environ["TRITON_INTERPRET"] = "1"    # read when the kernel is first decorated
    if device.type == "cuda" and not torch.cuda.is_available():
        print("tune_copy: --device cuda: no CUDA device here", file=sys.stderr)
        return 2
    kib = a.kib or (512 << 10 if device.type == "cuda" else 8)
    reps = a.reps or (4 if device.type == "cuda" else 1)
    t0 = time.monotonic()
    names = a.layouts.split(",") if a.layouts else (LAYOUTS if device.type == "cuda" else ("tiny-hybrid",))
    try:
        chunks = tuple(int(c) << 10 for c in a.chunks.split(",")) if a.chunks else CHUNKS
        programs = tuple(int(x) for x in a.programs.split(",") if x.strip())
    except ValueError:
        p.error(f"--chunks {a.chunks!r} / --programs {a.programs!r}: comma-separated whole numbers")
    if any(c < 0 for c in chunks) or any(x < 1 for x in programs) or (a.kib is not None and a.kib < 1) \
            or (a.reps is not None and a.reps < 1):
        p.error("--chunks >= 0, --programs >= 1, --kib >= 1 and --reps >= 1")
    rows = [r for name in names for hl in a.host_layouts.split(",")
            for r in sweep_layout(name, device, kib, reps, hl, chunks, programs)]
    result = {"device": torch.cuda.get_device_name() if device.type == "cuda" else "cpu", "kib": kib,
              "reps": reps, "default_chunk_bytes": triton_copy.CHUNK_BYTES,
              "default_num_warps": triton_copy.NUM_WARPS,
              "default_vec_bytes": triton_copy.VEC_BYTES, "verified": all(r["verified"] for r in rows),
              "seconds": round(time.monotonic() - t0, 1), "best": best_rows(rows), "rows": rows}
    if a.json:
        with open(a.json, "w") as f:
            json.dump(result, f, indent=1)
    print(f"{len(rows)} configurations in {result['seconds']:.0f} s; all verified: {result['verified']}",
          file=sys.stderr)
    print(json.dumps(result))            # the last line: what bench/gpu/suite.py reads
    return 0 if result["verified"] else 1


def best_rows(rows: list[dict]) -> list[dict]:
    """Per layout, host layout and direction: the whole-unit kernel, the shipped defaults
    and the fastest configuration, each as x the DMA copy."""
    out = []
    keys = sorted({(r["layout"], r["host_layout"], r["direction"]) for r in rows})
    for key in keys:
        group = [r for r in rows if (r["layout"], r["host_layout"], r["direction"]) == key]
        kernel = [r for r in group if r["chunk_bytes"] >= 0 and not r["programs"]]
        best = max(kernel, key=lambda r: r["x_dma"])
        whole = max((r["x_dma"] for r in kernel if r["chunk_bytes"] == 0), default=None)
        per_unit = max((r["x_dma"] for r in group if r["chunk_bytes"] < 0), default=None)
        shipped = [r["x_dma"] for r in kernel if r["chunk_bytes"] == triton_copy.CHUNK_BYTES
                   and r["num_warps"] == triton_copy.NUM_WARPS and r["vec_bytes"] == triton_copy.VEC_BYTES]
        out.append({"layout": key[0], "host_layout": key[1], "direction": key[2], "whole_unit_x": whole,
                    "default_x": shipped[0] if shipped else None, "best_x": best["x_dma"],
                    "best_chunk_bytes": best["chunk_bytes"], "best_num_warps": best["num_warps"],
                    "best_vec_bytes": best["vec_bytes"], "per_unit_copy_x": per_unit,
                    "bounded_x": {r["programs"]: r["x_dma"] for r in group if r["programs"]},
                    "dma_gbps": best["dma_gbps"]})
    return out


if __name__ == "__main__":
    sys.exit(main())
