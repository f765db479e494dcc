"""``hicache stress --config PATH [--ops N] [--seed S] [--json]``: random traffic, every byte checked."""

from __future__ import annotations

import argparse
import json

from hicache.cli.common import resolve_config
from hicache.cli.progress import Progress
from hicache.cli.table import render_table
from hicache.config import load_config
from hicache.errors import ConfigError


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("stress", help="random offload traffic with byte-exact checks",
                       description="Run random request traffic (shared prefixes, mid-flight publishes, "
                                   "finishes, aborts, device and host pressure, loads, retention) against a "
                                   "cache with synthetic contents, checking check_integrity() after every "
                                   "operation and every loaded byte.")
    p.add_argument("--config", required=True, help="config YAML or a name from configs/")
    p.add_argument("--ops", type=int, default=2000, help="operations to run (default 2000)")
    p.add_argument("--seed", type=int, default=0, help="random seed (default 0)")
    p.add_argument("--max-running", type=int, default=4, help="concurrent requests (default 4)")
    p.add_argument("--device-pages", type=int, help="device page budget (default: small, to force pressure)")
    p.add_argument("--host-pages", type=int, help="host page budget")
    p.add_argument("--write-policy", choices=["write_through", "write_through_selective", "write_back"],
                   help="override the config's write policy")
    p.add_argument("--prefetch", type=float, default=0.5,
                   help="chance a request first prefetches from L3 (default 0.5)")
    p.add_argument("--fault-rate", type=float, default=0.0,
                   help="chance each copied layer fails with an injected error (default 0)")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.set_defaults(func=run)


def build_cache(args: argparse.Namespace):
    from hicache.cache import HiCache
    from hicache.pools import PoolConfig
    import dataclasses

    layout, cfg = load_config(resolve_config(args.config))
    # Small tiers so eviction, shadows and loads happen within a short run.
    dev_pages = args.device_pages or 24
    host_pages = args.host_pages or dev_pages * 3 // 2
    for name, value in (("--device-pages", dev_pages), ("--host-pages", host_pages)):
        if value < 4:
            raise ConfigError(name, value, "must be at least 4 pages")
    snaps = 8 if layout.object_bytes("state") else 0
    pools = PoolConfig(device="cpu", device_bytes=cfg.pools.device_bytes, host_bytes=cfg.pools.host_bytes,
                       host_ratio=cfg.pools.host_ratio, host_layout=cfg.pools.host_layout,
                       device_pages=dev_pages, device_snapshots=snaps,
                       host_pages=host_pages, host_snapshots=2 * snaps)
    write = cfg.write
    if args.write_policy:
        write = dataclasses.replace(write, write_policy=args.write_policy)
    # The stress loop is synchronous: wait for each prefetch so L3 paths run every time.
    storage = dataclasses.replace(cfg.storage, prefetch_policy="wait_complete")
    return HiCache(layout, dataclasses.replace(cfg, pools=pools, write=write, storage=storage))


def run(args: argparse.Namespace) -> int:
    from hicache.engine.stress import StressConfig, StressRunner

    if args.ops < 1:
        raise ConfigError("--ops", args.ops, "must be >= 1")
    for flag in ("prefetch", "fault_rate"):
        v = getattr(args, flag)
        if not 0.0 <= v <= 1.0:
            raise ConfigError(f"--{flag.replace('_', '-')}", v, "must be between 0 and 1")
    if args.max_running < 1:
        raise ConfigError("--max-running", args.max_running, "must be >= 1")
    cache = build_cache(args)
    try:
        runner = StressRunner(cache, StressConfig(ops=args.ops, seed=args.seed, max_running=args.max_running,
                                                  prefetch=args.prefetch, fault_rate=args.fault_rate),
                              progress=Progress("stress", args.ops))
        rep = runner.run()
    finally:
        cache.close()
    s = rep.stats
    out = {
        "ops": rep.ops, "requests": rep.requests, "integrity_errors": rep.integrity_errors,
        "mismatched_pages": rep.mismatched_pages + rep.mismatched_snapshots,
        "verified_pages": rep.verified_pages, "verified_snapshots": rep.verified_snapshots,
        "ops_per_s": round(rep.ops_per_s, 1),
        "device_evictions": s["device_evicted_pages"] + s["device_demoted_pages"],
        "host_evictions": s["host_evicted_pages"],
        "loaded_pages": s["loaded_pages"], "backed_up_pages": s["backed_up_pages"],
        "hit_rate": round(s["hit_rate"], 4), "failed_loads": rep.failed_loads,
        "l3_prefetched_tokens": rep.l3_tokens, "l3_hit_tokens": s["l3_hit_tokens"],
        "copy_failures": s["load_failures"] + s["backup_failures"],
        "snapshots_offered": s["snapshots_offered"], "snapshots_kept": s["snapshots_kept"],
        "snapshots_evicted": s["snapshots_evicted_device"] + s["snapshots_evicted_host"],
        "first_error": rep.first_error,
    }
    if args.json:
        print(json.dumps(out, indent=2))
    else:
        rows = [[k, v] for k, v in out.items() if k != "first_error"]
        print(render_table(["metric", "value"], rows, align="lr",
                           title=f"hicache stress: {args.config} seed={args.seed}"))
        if rep.first_error:
            print(f"first integrity error: {rep.first_error}")
    return 0 if rep.integrity_errors == 0 and out["mismatched_pages"] == 0 else 1
