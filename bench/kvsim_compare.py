"""kvcache-simulator's LRU and optimal hit rates on a trace, at our capacity in history tokens.

The other side of the comparison in issue 6: ``hicache replay --trace FILE`` must reach at
least the LRU hit rate printed here, on the same file, with ``optimal`` as the bound.
``hicache sweep`` runs the same comparison at several budgets.

    python bench/kvsim_compare.py TRACE.jsonl --capacity-tokens 262144 [--json]
    python bench/kvsim_compare.py TRACE.jsonl --config configs/deepseek-v4-flash.yaml

The simulation and its budget scaling (both caches hold the same number of history
tokens; the simulator's GiB differ from ours by the ratio of the two byte accountings,
printed as ``budget_scale``) are :mod:`hicache.engine.kvsim`.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from hicache.engine import kvsim  # noqa: E402
from hicache.errors import HiCacheError  # noqa: E402

PROG = "bench/kvsim_compare.py"
POLICIES = kvsim.POLICIES


def our_capacity(config: str) -> dict:
    """History tokens our device + host budgets hold (pages x page_tokens), and their bytes."""
    from hicache.cli.common import resolve_config
    from hicache.config import load_config
    from hicache.pools import plan_pools

    layout, cfg = load_config(resolve_config(config))
    plan = plan_pools(layout, cfg.pools, available_bytes=1 << 62)  # sizing only, nothing allocated
    pages = plan.device_pages + plan.host_pages
    return {"config": config, "page_tokens": layout.page_tokens, "device_pages": plan.device_pages,
            "host_pages": plan.host_pages, "capacity_tokens": pages * layout.page_tokens,
            "history_bytes_per_token": layout.history_bytes_per_token,
            "history_bytes": pages * layout.history_bytes_per_page,
            "budget_bytes": plan.device_bytes + plan.host_bytes}


def compare(trace_path: str, capacity_tokens: int, *, model: str = kvsim.DEFAULT_MODEL,
            kv_precision: str | None = None, indexer_precision: str | None = None,
            backend: str = "cpp", ours: dict | None = None, progress=None) -> dict:
    """Run kvcache-simulator's LRU and optimal at ``capacity_tokens``; one result dict."""
    sim = kvsim.simulate(trace_path, [capacity_tokens], model=model, kv_precision=kv_precision,
                         indexer_precision=indexer_precision, backend=backend, progress=progress)
    (point,) = sim.pop("points")
    out = dict(sim)
    out.pop("skipped_records"), out.pop("parse_errors")
    out["kvsim"] = dict(sim["kvsim"], budget_gib=point["budget_gib"])
    out.update(capacity_tokens=capacity_tokens, capacity_blocks=point["capacity_blocks"], status=point["status"])
    for policy in POLICIES:
        out[policy] = point[policy]
    if ours is not None:
        ours = dict(ours)
        ours["history_gib_for_capacity"] = capacity_tokens * ours["history_bytes_per_token"] / 2**30
        out["ours"] = ours
        out["budget_scale"] = point["budget_gib"] / ours["history_gib_for_capacity"]
    return out


def _print_table(out: dict) -> None:
    from hicache.cli.table import render_table

    rows = []
    for name in (*POLICIES, "ceiling"):
        r = out.get(name)
        rows.append([name, None if r is None else f"{100 * r['hit_rate']:.2f}%",
                     None if r is None else r["hit_tokens"], None if r is None else r["total_tokens"]])
    k = out["kvsim"]
    print(render_table(["policy", "hit rate", "hit tokens", "measured tokens"], rows,
                       title=f"kvcache-simulator {k['version']} on {out['trace']}: "
                             f"{out['requests']} requests, last half measured, status {out['status']}"))
    print()
    print(f"capacity          {out['capacity_tokens']:,} tokens = {out['capacity_blocks']:,} blocks of "
          f"{out['block_size']} (trace has {out['unique_blocks']:,} unique blocks)")
    print(f"its accounting    {k['model']} kv={k['kv_precision']} indexer={k['indexer_precision']}: "
          f"{k['bytes_per_token']:,.2f} B/token at T={k['estimate_tokens']:,} "
          f"-> budget {k['budget_gib']:.4f} GiB")
    if "ours" in out:
        o = out["ours"]
        print(f"our accounting    {o['history_bytes_per_token']:,.2f} B/token -> "
              f"{o['history_gib_for_capacity']:.4f} GiB of history; budget_scale {out['budget_scale']:.4f}")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog=PROG, description=__doc__.split("\n\n")[0])
    p.add_argument("trace", help="kvcache-simulator JSONL trace "
                   "(python -m hicache.engine.workloads ... --write-trace)")
    p.add_argument("--capacity-tokens", type=int,
                   help="history tokens both caches hold (default: --config's budgets)")
    p.add_argument("--config", default="deepseek-v4-flash",
                   help="our config, for the default capacity (device + host pages) and our bytes per token")
    p.add_argument("--model", default="deepseek-v4-flash", help="kvcache-simulator model id")
    p.add_argument("--kv-precision", default=None,
                   help="its KV precision (default: its model default, fp8_int8)")
    p.add_argument("--indexer-precision", default=None,
                   help="its indexer precision (default fp4_int4 for V4)")
    p.add_argument("--backend", choices=["cpp", "python"], default="cpp", help="its simulation backend")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    args = p.parse_args(argv)

    def progress(done: float, total: float, label: str) -> None:
        print(f"{PROG}: [{done:.1f}/{total:.0f}] {label}", file=sys.stderr)

    try:
        ours = our_capacity(args.config)
        capacity = args.capacity_tokens if args.capacity_tokens is not None else ours["capacity_tokens"]
        out = compare(args.trace, capacity, model=args.model, kv_precision=args.kv_precision,
                      indexer_precision=args.indexer_precision, backend=args.backend, ours=ours,
                      progress=progress)
    except HiCacheError as exc:
        print(f"{PROG}: error: {exc}", file=sys.stderr)
        return 2
    if args.json:
        print(json.dumps(out, indent=2))
    else:
        _print_table(out)
    return 0 if not math.isnan(out["ceiling"]["hit_rate"]) else 1


if __name__ == "__main__":
    sys.exit(main())
