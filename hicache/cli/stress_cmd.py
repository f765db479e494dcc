"""``hicache stress``: random traffic against a small cache, every byte and invariant checked.

    hicache stress --config PATH [--ops N] [--seed S | --seeds A-B] [--max-running N]
                   [--device-pages N] [--host-pages N] [--device-snapshots N] [--host-snapshots N]
                   [--write-policy P] [--host-tier inclusive|exclusive] [--eviction lru|lfu|value]
                   [--retention N|none] [--candidates P,P] [--adaptive-window N] [--adaptive-record W]
                   [--adaptive-z Z] [--adaptive-trial N] [--adaptive-dead-outputs N] [--adaptive-floor on|off]
                   [--max-queued-ops N] [--prefetch F]
                   [--fault-rate F] [--json]

Every knob a random sweep varies is a flag, so a failing configuration found by a sweep is
one command line away. ``--seeds A-B`` runs each seed on a fresh cache and prints one
summary: seeds run, pages verified, faults injected, integrity errors, mismatches and the
first failing seed with its error. (The stress loop has no scheduler, so there is no
``--admission``: that belongs to ``hicache replay``.)
"""

from __future__ import annotations

import argparse
import dataclasses
import time
import traceback

from hicache.cli.common import (add_adaptive_flags, at_least, parse_candidates, parse_retention, print_json,
                                resolve_config)
from hicache.cli.limits import check_seed_range
from hicache.cli.progress import Progress
from hicache.cli.table import render_table
from hicache.config import (EVICTION_POLICIES, HOST_TIERS, WRITE_POLICIES, check_adaptive_z,
                            check_lookups, load_config)
from hicache.errors import ConfigError


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("stress", help="random offload traffic with byte-exact checks",
                       description="Run random request traffic (shared prefixes, mid-flight publishes, "
                                   "finishes, aborts, device and host pressure, loads, retention) against a "
                                   "cache with synthetic contents, checking check_integrity() after every "
                                   "operation and every loaded byte.")
    p.add_argument("--config", required=True, help="config YAML or a name from configs/")
    p.add_argument("--ops", type=int, default=2000, help="operations per seed (default 2000)")
    seeds = p.add_mutually_exclusive_group()
    seeds.add_argument("--seed", type=int, default=0, help="random seed (default 0)")
    seeds.add_argument("--seeds", metavar="A-B", help="run every seed from A to B, one fresh cache each")
    p.add_argument("--max-running", type=int, default=4, help="concurrent requests (default 4)")
    p.add_argument("--device-pages", type=int, help="device page budget (default 24, to force pressure)")
    p.add_argument("--host-pages", type=int, help="host page budget (default 1.5x the device's)")
    p.add_argument("--device-snapshots", type=int,
                   help="device state snapshots (default 8 for a layout with state, else 0)")
    p.add_argument("--host-snapshots", type=int, help="host state snapshots (default 2x the device's)")
    p.add_argument("--budget", choices=["split", "shared_host", "shared"], default="split",
                   help="split: the page and snapshot counts below; shared: one arena per tier of the same "
                        "bytes (page count x page bytes + snapshot count x snapshot bytes) that pages and "
                        "snapshots compete for; shared_host: the device split, the host such an arena "
                        "(default split)")
    p.add_argument("--write-policy", choices=WRITE_POLICIES, help="override the config's write policy")
    p.add_argument("--host-tier", choices=HOST_TIERS,
                   help="override the config's host tier (exclusive needs --write-policy write_back)")
    p.add_argument("--eviction", choices=EVICTION_POLICIES, help="override the config's eviction order")
    p.add_argument("--retention", help="retention interval in tokens, or 'none' (default: the config's)")
    add_adaptive_flags(p, {"adaptive_window": 16, "adaptive_z": 0.0, "adaptive_trial": 0}, {
        "adaptive_window": "default 16, small so the stress loop switches orders often",
        "adaptive_z": "default 0, so the stress loop switches orders often; the shipped config's is 2",
        "adaptive_trial": "default 0: at once",
        "adaptive_dead_outputs": "default: the config's; 1 makes the floor change order early and back at "
                                 "the first follow-up"})
    p.add_argument("--max-queued-ops", type=int,
                   help="copies the transfer queue holds before a submission is refused (default 4096)")
    p.add_argument("--prefetch", type=float, default=0.5,
                   help="chance a request first prefetches from L3 (default 0.5)")
    p.add_argument("--fault-rate", type=float, default=0.0,
                   help="chance each copied layer fails with an injected error (default 0)")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.set_defaults(func=run)


def parse_seeds(text: str) -> range:
    """``A-B`` (or one seed ``A``) -> the seeds A..B, each an integer >= 0."""
    lo, dash, hi = text.strip().partition("-")
    try:
        a, b = int(lo), int(hi) if dash else int(lo)
    except ValueError:
        raise ConfigError("--seeds", text, "must be a range of seeds like 1-200") from None
    if a < 0 or b < a:
        raise ConfigError("--seeds", text, "must be A-B with 0 <= A <= B")
    return check_seed_range("--seeds", text, a, b)


def check_args(args: argparse.Namespace) -> range:
    """Every flag checked before anything runs; returns the seeds to run."""
    at_least("--ops", args.ops, 1)
    at_least("--max-running", args.max_running, 1)
    at_least("--seed", args.seed, 0)
    for flag in ("--device-pages", "--host-pages"):
        at_least(flag, getattr(args, flag[2:].replace("-", "_")), 4)
    for flag in ("--device-snapshots", "--host-snapshots"):
        at_least(flag, getattr(args, flag[2:].replace("-", "_")), 0)
    at_least("--max-queued-ops", args.max_queued_ops, 1)
    for flag in ("--prefetch", "--fault-rate"):
        v = getattr(args, flag[2:].replace("-", "_"))
        if not 0.0 <= v <= 1.0:
            raise ConfigError(flag, v, "must be between 0 and 1")
    if args.retention is not None:
        parse_retention("--retention", args.retention)
    if args.candidates is not None:
        parse_candidates("--candidates", args.candidates)
    at_least("--adaptive-window", args.adaptive_window, 1)
    if args.adaptive_record is not None:
        at_least("--adaptive-record", args.adaptive_record, 1)
    check_adaptive_z("--adaptive-z", args.adaptive_z)
    check_lookups("--adaptive-trial", args.adaptive_trial)
    if args.adaptive_dead_outputs is not None:
        check_lookups("--adaptive-dead-outputs", args.adaptive_dead_outputs)
    return parse_seeds(args.seeds) if args.seeds is not None else range(args.seed, args.seed + 1)


def build_cache(args: argparse.Namespace):
    """A small cache from the config and the flags (tiers small enough for pressure)."""
    from hicache.cache import HiCache
    from hicache.pools import PoolConfig
    from hicache.transfer import TransferConfig

    layout, cfg = load_config(resolve_config(args.config))
    dev_pages = args.device_pages or 24
    host_pages = args.host_pages or max(4, dev_pages * 3 // 2)
    has_state = bool(layout.object_bytes("state"))
    dev_snaps = args.device_snapshots if args.device_snapshots is not None else (8 if has_state else 0)
    host_snaps = args.host_snapshots if args.host_snapshots is not None else 2 * dev_snaps
    if args.budget == "shared":
        page, snap = layout.object_bytes("page"), layout.object_bytes("state")
        pools = PoolConfig(device="cpu", budget="shared", host_layout="page_first",
                           device_bytes=dev_pages * page + dev_snaps * snap,
                           host_bytes=host_pages * page + host_snaps * snap)
    elif args.budget == "shared_host":   # the host counts size its arena (PoolConfig)
        pools = PoolConfig(device="cpu", budget="shared_host", host_layout="page_first",
                           device_bytes=cfg.pools.device_bytes, device_pages=dev_pages, device_snapshots=dev_snaps,
                           host_pages=host_pages, host_snapshots=host_snaps)
    else:
        pools = PoolConfig(device="cpu", device_bytes=cfg.pools.device_bytes, host_bytes=cfg.pools.host_bytes,
                           host_ratio=cfg.pools.host_ratio, host_layout=cfg.pools.host_layout,
                           device_pages=dev_pages, device_snapshots=dev_snaps,
                           host_pages=host_pages, host_snapshots=host_snaps)
    # Both flags in one replace: the pair is validated together (an exclusive host tier needs
    # write_back), so applying them one at a time could refuse a valid combination.
    flags = {name: getattr(args, name) for name in ("write_policy", "host_tier") if getattr(args, name)}
    write = dataclasses.replace(cfg.write, **flags) if flags else cfg.write
    tree = cfg.tree
    if args.eviction:
        tree = dataclasses.replace(tree, eviction=args.eviction)
    if args.candidates is not None:
        tree = dataclasses.replace(tree, adaptive_candidates=parse_candidates("--candidates", args.candidates))
    # margin 0 (and z 0 unless asked): any lead switches, so the loop exercises the reorder
    # under every operation
    tree = dataclasses.replace(tree, adaptive_window=args.adaptive_window, adaptive_margin=0.0,
                               adaptive_z=args.adaptive_z, adaptive_trial=args.adaptive_trial)
    if args.adaptive_floor is not None:
        tree = dataclasses.replace(tree, adaptive_floor=args.adaptive_floor == "on")
    if args.adaptive_record is not None:
        tree = dataclasses.replace(tree, adaptive_record=args.adaptive_record)
    if args.adaptive_dead_outputs is not None:
        tree = dataclasses.replace(tree, adaptive_dead_outputs=args.adaptive_dead_outputs)
    if args.retention is not None:
        tree = dataclasses.replace(tree, retention_interval=parse_retention("--retention", args.retention))
    # The stress loop is synchronous: wait for each prefetch so L3 paths run every time.
    storage = dataclasses.replace(cfg.storage, prefetch_policy="wait_complete")
    transfer = TransferConfig() if args.max_queued_ops is None else TransferConfig(max_queued_ops=args.max_queued_ops)
    full = dataclasses.replace(cfg, pools=pools, write=write, tree=tree, storage=storage)
    return HiCache(layout, full, transfer=transfer)


def _where(exc: BaseException) -> str:
    """``file:line`` of the innermost frame, so a crash found by a sweep can be found in code."""
    tb = traceback.extract_tb(exc.__traceback__)
    return f" at {tb[-1].filename.rsplit('/', 2)[-1]}:{tb[-1].lineno}" if tb else ""


def run_seed(args: argparse.Namespace, seed: int, progress) -> dict:
    """One seed on a fresh cache -> its report as a flat dict.

    An exception out of the cache (a broken invariant, a misuse it detected in itself) is a
    finding like a failed integrity check: it is counted under ``crashes`` with the op, the
    error and where it was raised, and the sweep goes on with the next seed.
    """
    from hicache.engine import StressConfig, StressRunner

    cache = build_cache(args)  # a ConfigError here is bad input: one line, exit 2
    crash = None
    runner = StressRunner(cache, StressConfig(ops=args.ops, seed=seed, max_running=args.max_running,
                                              prefetch=args.prefetch, fault_rate=args.fault_rate),
                          progress=progress)
    rep = runner.report
    try:
        rep = runner.run()
    except Exception as exc:
        crash = f"op {rep.ops}: {type(exc).__name__}: {exc}{_where(exc)}"
    try:
        if crash is not None:
            rep.stats = cache.stats()
        cache.close()
    except Exception as exc:
        crash = crash or f"close: {type(exc).__name__}: {exc}{_where(exc)}"
    s = rep.stats

    def stat(name: str) -> int:
        return s.get(name, 0)

    return {
        "seed": seed, "ops": rep.ops, "requests": rep.requests,
        "integrity_errors": rep.integrity_errors, "crashes": int(crash is not None),
        "mismatched_pages": rep.mismatched_pages + rep.mismatched_snapshots,
        "verified_pages": rep.verified_pages, "verified_snapshots": rep.verified_snapshots,
        "injected_faults": rep.injected_faults, "failed_loads": rep.failed_loads,
        "ops_per_s": round(rep.ops_per_s, 1),
        "device_evictions": stat("device_evicted_pages") + stat("device_demoted_pages"),
        "host_evictions": stat("host_evicted_pages"),
        "loaded_pages": stat("loaded_pages"), "backed_up_pages": stat("backed_up_pages"),
        "hit_rate": round(s.get("hit_rate", 0.0), 4),
        "l3_prefetched_tokens": rep.l3_tokens, "l3_hit_tokens": stat("l3_hit_tokens"),
        "copy_failures": stat("load_failures") + stat("backup_failures"),
        "snapshots_offered": stat("snapshots_offered"), "snapshots_kept": stat("snapshots_kept"),
        "snapshots_evicted": stat("snapshots_evicted_device") + stat("snapshots_evicted_host"),
        "policy_switches": stat("policy_switches"),
        "first_error": crash or rep.first_error,
    }


def _failed(r: dict) -> bool:
    return bool(r["integrity_errors"] or r["crashes"] or r["mismatched_pages"])


def summarize(seeds: range, results: list[dict], wall_s: float) -> dict:
    """One summary over many seeds: totals, and the first failing seed with its error."""
    failing = [r for r in results if _failed(r)]
    total = {k: sum(r[k] for r in results) for k in
             ("ops", "requests", "integrity_errors", "crashes", "mismatched_pages", "verified_pages", "verified_snapshots",
              "injected_faults", "failed_loads", "copy_failures", "loaded_pages", "policy_switches")}
    return {
        "seeds": f"{seeds.start}-{seeds.stop - 1}", "seeds_run": len(results), **total,
        "failed_seeds": len(failing), "failing_seeds": [r["seed"] for r in failing][:50],
        "first_failing_seed": failing[0]["seed"] if failing else None,
        "first_error": failing[0]["first_error"] if failing else None,
        "wall_s": round(wall_s, 2),
    }


def _emit(args: argparse.Namespace, out: dict, title: str, hidden: tuple[str, ...], notes: list[str]) -> None:
    if args.json:
        print_json(out)
        return
    rows = [[k, v] for k, v in out.items() if k not in hidden]
    print(render_table(["metric", "value"], rows, align="lr", title=title))
    for line in notes:
        print(line)


def run(args: argparse.Namespace) -> int:
    seeds = check_args(args)  # the config itself is checked by the first seed's build_cache
    if len(seeds) == 1:
        out = run_seed(args, seeds[0], Progress("stress", args.ops))
        _emit(args, out, f"hicache stress: {args.config} seed={seeds[0]}", ("first_error", "seed"),
              [f"first integrity error: {out['first_error']}"] if out["first_error"] else [])
        return 1 if _failed(out) else 0
    t0 = time.perf_counter()
    progress = Progress("stress seeds", len(seeds))
    results: list[dict] = []
    for i, seed in enumerate(seeds):
        results.append(run_seed(args, seed, None))
        progress(i + 1, len(seeds), f"seed {seed}, {sum(_failed(r) for r in results)} failed")
    out = summarize(seeds, results, time.perf_counter() - t0)
    first = out["first_failing_seed"]
    _emit(args, out, f"hicache stress: {args.config} seeds {out['seeds']}, {args.ops} ops each",
          ("first_error", "failing_seeds"),
          [f"first failing seed {first}: {out['first_error']}",
           f"reproduce: add --seed {first} instead of --seeds"] if first is not None else [])
    return 1 if out["failed_seeds"] else 0
