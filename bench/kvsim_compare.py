"""kvcache-simulator's LRU and optimal hit rates on a trace, at our capacity in history tokens.

The other side of the comparison in issue 6: ``hicache replay --trace FILE`` must reach at
least the LRU hit rate printed here, on the same file, with ``optimal`` as the bound.

    python bench/kvsim_compare.py TRACE.jsonl --capacity-tokens 262144 [--json]
    python bench/kvsim_compare.py TRACE.jsonl --config configs/deepseek-v4-flash.yaml

Measured its way: ``kvcache_sim.run_sweep`` (its Python API, the code behind its CLI) with
its default warm-up fraction 0.5, i.e. hit tokens / prompt tokens over the last half of the
requests, after a first half that must fill the cache.

Budget scaling. kvcache-simulator sizes the cache in GiB and converts with its own
DeepSeek-V4 accounting (``calculator.py``, formula ``deepseek_v4_hybrid``): 512 elements per
KV row at the KV precision (fp8 by default: 512 B, where our FP8 rows are 584 B), indexer
rows of 128 elements at the indexer precision (fp4 by default: 64 B, ours 132 B), and the
128-token sliding window of every layer amortised over ``estimate_tokens`` (by default the
trace's mean prompt length)::

    bytes_per_token = (43*128*512 + sum_l floor(T/r_l)*512 + 21*floor(T/4)*64) / T
    capacity_blocks = floor(GiB * 2**30 / (bytes_per_token * block_size))

We hold ``capacity_tokens`` history tokens (our device + host pages x 256 with
``--config``), so we ask it for ``capacity_blocks = capacity_tokens // block_size`` blocks:
``GiB = (capacity_blocks + 0.5) * bytes_per_block / 2**30``, checked with its own
``cache_blocks_for_gib`` to give exactly that block count. Both caches then hold the same
number of tokens; the GiB figures differ by the ratio of the two byte accountings, which is
printed (``budget_scale``).
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

from hicache.errors import ConfigError, HiCacheError  # noqa: E402

PROG = "bench/kvsim_compare.py"
POLICIES = ("lru", "optimal")


def _kvsim():
    try:
        import kvcache_sim
        from kvcache_sim import calculator, simulator, trace
    except ImportError:
        raise ConfigError("kvcache-simulator", "not installed",
                          "pip install kvcache-simulator (the comparison runs its policies)") from None
    return kvcache_sim, calculator, simulator, trace


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


def scaled_budget_gib(capacity_blocks: int, bytes_per_block: float, simulator) -> float:
    """The GiB budget for which kvcache-simulator allocates exactly ``capacity_blocks``."""
    gib = (capacity_blocks + 0.5) * bytes_per_block / simulator.BYTES_PER_GIB
    got = simulator.cache_blocks_for_gib(gib, bytes_per_block)
    assert got == capacity_blocks, f"budget scaling gives {got} blocks, not {capacity_blocks}"
    return gib


def compare(trace_path: str, capacity_tokens: int, *, model: str = "deepseek-v4-flash",
            kv_precision: str | None = None, indexer_precision: str | None = None,
            backend: str = "cpp", ours: dict | None = None, progress=None) -> dict:
    """Run kvcache-simulator's LRU and optimal at ``capacity_tokens``; one result dict."""
    kvsim, calculator, simulator, trace_mod = _kvsim()
    if isinstance(capacity_tokens, bool) or not isinstance(capacity_tokens, int) or capacity_tokens < 1:
        raise ConfigError("capacity_tokens", capacity_tokens, "must be a positive integer")
    if not Path(trace_path).is_file():
        raise ConfigError("trace", trace_path, "no such file")
    try:
        trace = trace_mod.parse_trace_file(trace_path)
    except ValueError as exc:
        raise ConfigError("trace", trace_path, f"kvcache-simulator refuses it: {exc}") from None
    data = calculator.load_models_data()
    models = calculator.models_by_id(data)
    if model not in models:
        raise ConfigError("model", model, "unknown to kvcache-simulator; see kvcache-simulator list-models")
    capacity_blocks = capacity_tokens // trace.block_size
    if capacity_blocks < 1:
        raise ConfigError("capacity_tokens", capacity_tokens,
                          f"is less than one block ({trace.block_size} tokens)")
    # Exactly what run_sweep computes for its byte accounting.
    estimate = simulator.estimate_tokens_for_trace(trace)
    size = calculator.calculate_cache_size(models[model], tokens=estimate, precision=kv_precision,
                                           indexer_precision=indexer_precision, block_size=trace.block_size,
                                           models_data=data)
    bytes_per_block = float(size.bytes_per_block or size.bytes_per_token * trace.block_size)
    gib = scaled_budget_gib(capacity_blocks, bytes_per_block, simulator)
    result = simulator.run_sweep(trace, model_id=model, precision=kv_precision,
                                 indexer_precision=indexer_precision, budgets_gib=[gib],
                                 policies=list(POLICIES), backend=backend, progress=progress,
                                 models_data=data)
    meta = result["metadata"]
    out = {
        "trace": str(trace_path), "requests": trace.request_count, "block_size": trace.block_size,
        "unique_blocks": meta["uniqueBlocks"], "warmup_requests": meta["warmupRequests"],
        "measured_tokens": meta["totalMeasuredTokens"], "measurement": meta["measurementWindow"],
        "capacity_tokens": capacity_tokens, "capacity_blocks": capacity_blocks,
        "kvsim": {"version": kvsim.__version__, "model": model, "backend": backend,
                  "kv_precision": meta["precision"], "indexer_precision": meta["indexerPrecision"],
                  "estimate_tokens": meta["estimateTokens"], "bytes_per_token": meta["bytesPerToken"],
                  "bytes_per_block": meta["bytesPerBlock"], "budget_gib": gib},
        "ceiling": _policy(result["ceiling"]),
    }
    if ours is not None:
        ours = dict(ours)
        ours["history_gib_for_capacity"] = capacity_tokens * ours["history_bytes_per_token"] / 2**30
        out["ours"] = ours
        out["budget_scale"] = gib / ours["history_gib_for_capacity"]
    points = [p for p in result["points"] if p["cacheBlocks"] == capacity_blocks]
    if points:
        out["status"] = "measured"
        for policy in POLICIES:
            out[policy] = _policy(points[0]["results"][policy])
    elif capacity_blocks >= meta["uniqueBlocks"]:
        # The simulator omits such points: nothing is ever evicted, so every policy is the
        # unbounded-cache ceiling.
        out["status"] = "capacity_holds_whole_trace"
        for policy in POLICIES:
            out[policy] = dict(out["ceiling"])
    else:
        out["status"] = "underfilled"  # the cache was not full when measurement began
        for policy in POLICIES:
            out[policy] = None
    return out


def _policy(r: dict) -> dict:
    return {"hit_rate": r["hitRate"], "hit_tokens": r["hitTokens"], "total_tokens": r["totalTokens"]}


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
