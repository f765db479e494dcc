"""``hicache bench tree``: match and publish cost of the radix tree.

Three modes:

* default: long prompts on a real layout. Baseline (same run): chaining SHA-256 page
  hashes over the prompt and looking each up in a dict -- what a hash-keyed prefix cache
  (vLLM block hashes, LMCache chunk keys) pays per request before it touches any memory.
  The tree's ``match`` compares token pages and hashes nothing; ``publish`` hashes only the
  pages it adds.
* ``--trace FILE --capacity-tokens N``: a token trace replayed through the facade the way
  SGLang's peer harness drives its radix caches (``bench/sglang_tree_compare.py`` runs
  those on the same file); see :mod:`hicache.cli.bench_tree_trace`.
* ``--scale``: mean cost of one request at ~1k to ~1M cached pages.
"""

from __future__ import annotations

import argparse
import json
import time

import numpy as np

from hicache.cli.common import at_least, positive_number, print_json, resolve_config
from hicache.cli.table import render_table
from hicache.config import load_config
from hicache.errors import ConfigError


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--config", default=None,
                   help="config YAML or name (default deepseek-v4-flash; --trace: a tiny one-family layout)")
    p.add_argument("--trace", metavar="TOKENS.jsonl", help="replay a token trace (input_ids / output_ids per line)")
    p.add_argument("--capacity-tokens", type=int, help="--trace: device capacity in tokens (evict beyond it)")
    p.add_argument("--page-tokens", type=int, default=None,
                   help="--trace / --scale without --config: page size (default 256 / 16)")
    p.add_argument("--scale", action="store_true", help="mean cost per request at ~1k to ~1M cached pages")
    p.add_argument("--scale-ops", type=int, default=2000, help="--scale: timed requests per point (default 2000)")
    p.add_argument("--scale-max-pages", type=int, default=1 << 20,
                   help="--scale: largest cached size (default 1048576 pages; points at 1k, 16k, 256k, 1M)")
    p.add_argument("--prompt-tokens", type=int, default=32768, help="prompt length (default 32768)")
    p.add_argument("--requests", type=int, default=64, help="distinct cached prompts (default 64)")
    p.add_argument("--chunk-pages", type=int, default=16, help="pages per mid-flight publish (default 16)")
    p.add_argument("--seconds", type=float, default=2.0, help="time per measurement (default 2)")
    p.add_argument("--json", action="store_true")


def _rate(fn, seconds: float) -> float:
    n, t0 = 0, time.perf_counter()
    while True:
        fn()
        n += 1
        dt = time.perf_counter() - t0
        if dt >= seconds:
            return n / dt


def _print(out: dict, args: argparse.Namespace, title: str) -> None:
    if args.json:
        print_json(out)
    else:
        rows = [[k, json.dumps(v) if isinstance(v, (list, dict)) else v] for k, v in out.items()]
        print(render_table(["measure", "value"], rows, align="lr", title=title))


def run(args: argparse.Namespace) -> int:
    from hicache.cli import bench_tree_trace
    from hicache.cli.progress import Progress

    if args.trace and args.scale:
        raise ConfigError("--scale", True, "give either --trace or --scale, not both")
    at_least("--page-tokens", args.page_tokens, 1)
    if args.page_tokens is not None and args.config is not None:
        raise ConfigError("--page-tokens", args.page_tokens, "comes from the layout when --config is given")
    if args.trace:
        if args.capacity_tokens is None:
            raise ConfigError("--capacity-tokens", None, "--trace needs --capacity-tokens N")
        out = bench_tree_trace.run_trace(args.trace, args.capacity_tokens, args.page_tokens or 256, args.config,
                                         progress=Progress("bench tree --trace", 1, enabled=not args.json))
        _print(out, args, f"hicache bench tree --trace {args.trace}")
        return 0
    if args.scale:
        at_least("--scale-ops", args.scale_ops, 100)
        if args.config is not None:
            raise ConfigError("--config", args.config, "--scale runs its own one-byte-per-page layout")
        points = tuple(p for p in bench_tree_trace.SCALE_POINTS if p <= args.scale_max_pages)
        if len(points) < 2:
            raise ConfigError("--scale-max-pages", args.scale_max_pages,
                              f"must be at least {bench_tree_trace.SCALE_POINTS[1]} (two points)")
        out = bench_tree_trace.run_scale(points, page_tokens=args.page_tokens or 16, ops=args.scale_ops,
                                         progress=Progress("bench tree --scale", len(points) + 10, enabled=not args.json))
        _print(out, args, "hicache bench tree --scale")
        return 0
    return run_prompts(args)


def run_prompts(args: argparse.Namespace) -> int:
    import dataclasses

    from hicache.cache import Boundary, HiCache
    from hicache.pools import PoolConfig
    from hicache.tree import ROOT_HASH, chain_hashes

    at_least("--requests", args.requests, 1)
    at_least("--chunk-pages", args.chunk_pages, 1)
    positive_number("--seconds", args.seconds)
    args.config = args.config or "deepseek-v4-flash"
    layout, cfg = load_config(resolve_config(args.config))
    P = layout.page_tokens
    if args.prompt_tokens < 2 * P:
        raise ConfigError("--prompt-tokens", args.prompt_tokens, f"must be at least {2 * P}")
    pages = args.prompt_tokens // P
    cap = pages * (args.requests + 2)
    snaps = (pages // args.chunk_pages + 2) * (args.requests + 2) if layout.object_bytes("state") else 0
    # Pools are allocated but never touched: this measures the tree, not memory.
    pools = PoolConfig(device="cpu", device_bytes=cfg.pools.device_bytes, host_bytes=cfg.pools.host_bytes,
                       device_pages=cap, device_snapshots=snaps, host_pages=4, host_snapshots=4 if snaps else 0,
                       host_reserve_bytes=1)
    cache = HiCache(layout, dataclasses.replace(cfg, pools=pools,
                                                write=dataclasses.replace(cfg.write, write_policy="write_back")))
    rng = np.random.default_rng(0)
    shared = rng.integers(0, 50_000, pages * P // 2, dtype=np.int32)   # half of each prompt is shared
    prompts = [np.concatenate([shared, rng.integers(0, 50_000, pages * P - len(shared), dtype=np.int32)])
               for _ in range(args.requests)]
    has_state = bool(layout.object_bytes("state"))

    def publish_all(tokens):
        lease = cache.load(cache.match(tokens))
        done = lease.resume_pages
        cache.alloc_pages(lease, pages - len(lease.page_table))
        while done < pages:
            done = min(done + args.chunk_pages, pages)
            sid = int(cache.alloc_snapshot(lease).ids[0]) if has_state else None
            cache.publish(lease, tokens, done, snapshot_id=sid, why=Boundary.PREFILL)
        return lease

    t0 = time.perf_counter()
    leases = [publish_all(p) for p in prompts]
    publish_s = (time.perf_counter() - t0) / len(prompts)
    for lease in leases:
        cache.release(lease)
    probe = [np.concatenate([p, [1]]) for p in prompts]
    i = [0]

    def do_match():
        cache.match(probe[i[0] % len(probe)])
        i[0] += 1

    def do_load_release():
        cache.release(cache.load(cache.match(probe[i[0] % len(probe)])))
        i[0] += 1

    index = {h: k for k, p in enumerate(prompts) for h in chain_hashes(b"s", ROOT_HASH, p, P)}

    def baseline():
        hs = chain_hashes(b"s", ROOT_HASH, probe[i[0] % len(probe)], P)
        sum(1 for h in hs if h in index)
        i[0] += 1

    match_rate = _rate(do_match, args.seconds)
    load_rate = _rate(do_load_release, args.seconds)
    base_rate = _rate(baseline, args.seconds)
    cache.check_integrity()
    cache.close()
    out = {"prompt_tokens": pages * P, "page_tokens": P, "cached_prompts": args.requests,
           "match_ops_per_s": round(match_rate, 1), "load_release_ops_per_s": round(load_rate, 1),
           "publish_prompts_per_s": round(1 / publish_s, 1),
           "publish_pages_per_s": round(pages / publish_s, 1),
           "hash_baseline_ops_per_s": round(base_rate, 1),
           "match_vs_hash_baseline": round(match_rate / base_rate, 2)}
    _print(out, args, f"hicache bench tree: {args.config}, {pages * P}-token prompts")
    return 0
