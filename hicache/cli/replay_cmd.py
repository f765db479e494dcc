"""``hicache replay``: real multi-turn traffic through the reference engine, every tier live.

    hicache replay --config PATH [--workload synthetic|sharegpt|long-context | --trace FILE]
                   [--conversations N] [--seed S] [--storage URL] [--device-gib X] [--host-gib Y]
                   [--retention N|none] [--json] [--plot FILE.png] [--requests-out FILE.jsonl]
                   [--metrics-out FILE.prom]
"""

from __future__ import annotations

import argparse
import dataclasses

from hicache.cli.common import check_output, parse_retention, positive_number, resolve_config
from hicache.cli.progress import Progress
from hicache.cli.replay_report import build_summary, emit, print_summary
from hicache.config import load_config
from hicache.errors import ConfigError

GiB = 1024**3


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("replay", help="replay multi-turn traffic through the reference engine",
                       description="Run real or synthetic multi-turn conversations through a reference "
                                   "serving loop that embeds HiCache, with every tier live, and report "
                                   "reuse per tier, bytes moved, evictions, snapshots and byte checks.")
    p.add_argument("--config", default="deepseek-v4-flash", help="config YAML or name (default deepseek-v4-flash)")
    src = p.add_mutually_exclusive_group()
    src.add_argument("--workload", choices=["synthetic", "sharegpt", "long-context", "long-revisit"],
                     default="synthetic",
                     help="built-in workload (default synthetic)")
    src.add_argument("--trace", metavar="FILE.jsonl", help="a kvcache-simulator block-hash trace")
    p.add_argument("--model", choices=["synthetic", "tiny"], default="synthetic",
                   help="page contents: synthetic bytes (default) or the tiny DeepSeek-V4-style model")
    p.add_argument("--conversations", type=int, default=None, help="conversations (default 100; tiny: 6)")
    p.add_argument("--seed", type=int, default=0, help="workload seed (default 0)")
    p.add_argument("--storage", metavar="URL", help="L3 URL (default: the config's, memory://); none:// disables L3")
    p.add_argument("--device-gib", type=float, help="device (L1) budget in GiB")
    p.add_argument("--host-gib", type=float, help="host (L2) budget in GiB")
    p.add_argument("--device-pages", type=int, help="device budget as a page count (overrides --device-gib)")
    p.add_argument("--host-pages", type=int, help="host budget as a page count")
    p.add_argument("--state-share", type=float,
                   help="share of each tier's byte budget kept for state snapshots (default: the config's)")
    p.add_argument("--device-snapshots", type=int, help="device state snapshots")
    p.add_argument("--host-snapshots", type=int, help="host state snapshots")
    p.add_argument("--retention", help="retention interval in tokens, or 'none' (keep every snapshot)")
    p.add_argument("--prefetch-policy", choices=["best_effort", "wait_complete", "timeout"],
                   help="how long admission waits for an L3 prefetch (default: the config's)")
    p.add_argument("--write-policy", choices=["write_through", "write_through_selective", "write_back"],
                   help="when device pages are backed up to host (default: the config's)")
    p.add_argument("--host-tier", choices=["inclusive", "exclusive"],
                   help="keep host copies of pages loaded back to device (inclusive) or free them "
                        "(exclusive, needs --write-policy write_back); default: the config's")
    p.add_argument("--max-running", type=int, default=16, help="concurrent requests (default 16)")
    p.add_argument("--admission", choices=["reserve", "greedy"], default="reserve",
                   help="reserve: admit while running requests' final pages fit the device (default); "
                        "greedy: admit up to --max-running and preempt when pages run out")
    p.add_argument("--prefill-tps", type=float, default=None,
                   help="prefill tokens/s of the modelled GPU for TTFT estimates (default: the config's)")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.add_argument("--plot", metavar="FILE.png", help="hit rate over time per tier (needs matplotlib)")
    p.add_argument("--requests-out", metavar="FILE.jsonl", help="one line per request, in arrival order")
    p.add_argument("--metrics-out", metavar="FILE.prom",
                   help="write the Prometheus exposition text of the cache's metrics at the end "
                        "(labels model_name and rank=0; needs prometheus-client)")
    p.add_argument("--quiet", action="store_true", help="no progress line")
    p.set_defaults(func=run)


def _overrides(args: argparse.Namespace) -> dict:
    out: dict = {}
    if args.storage is not None:
        out["storage_url"] = args.storage  # "" too: StorageConfig refuses it rather than ignoring it
    for flag, key in (("device_gib", "device_bytes"), ("host_gib", "host_bytes")):
        v = positive_number(f"--{flag.replace('_', '-')}", getattr(args, flag))
        if v is not None:
            out[key] = max(1, int(v * GiB))
    for flag in ("device_pages", "host_pages", "device_snapshots", "host_snapshots"):
        v = getattr(args, flag)
        if v is not None:
            if v < 0 or (v < 1 and flag.endswith("pages")):
                raise ConfigError(f"--{flag.replace('_', '-')}", v, "must be >= 1" if flag.endswith("pages") else "must be >= 0")
            out[flag] = v
    if args.state_share is not None:
        out["state_share"] = args.state_share
    if args.prefetch_policy:
        out["prefetch_policy"] = args.prefetch_policy
    if args.write_policy:
        out["write_policy"] = args.write_policy
    if args.host_tier:
        out["host_tier"] = args.host_tier
    if args.retention is not None:
        out["retention_interval"] = parse_retention("--retention", args.retention)
    return out


def load_requests(args: argparse.Namespace, page_tokens: int) -> list:
    from hicache.engine import workloads

    n = args.conversations if args.conversations is not None else 100
    if n < 1:
        raise ConfigError("--conversations", n, "must be >= 1")
    if args.trace:
        return workloads.load_trace(args.trace)
    if args.workload == "sharegpt":
        return workloads.sharegpt(conversations=n, seed=args.seed)
    if args.workload in ("long-context", "long-revisit"):
        return workloads.synthetic(conversations=n, seed=args.seed, preset=args.workload)
    return workloads.synthetic(conversations=n, seed=args.seed)


def check_outputs(args: argparse.Namespace) -> None:
    """Outputs are checked before the run, so a bad path never throws a finished run away."""
    check_output("--requests-out", args.requests_out)
    check_output("--plot", args.plot)
    if args.plot:
        try:
            import matplotlib  # noqa: F401
        except ImportError:
            raise ConfigError("--plot", args.plot, "needs matplotlib: pip install 'hicache[plot]'") from None


def run(args: argparse.Namespace) -> int:
    check_outputs(args)
    if args.model == "tiny":
        from hicache.cli.replay_tiny import run_tiny

        return run_tiny(args)
    from hicache.cache import HiCache
    from hicache.engine.loop import EngineConfig, ReferenceEngine

    path = resolve_config(args.config)
    over = _overrides(args)
    retention_set = "retention_interval" in over
    retention = over.pop("retention_interval", None)
    layout, cfg = load_config(path, **over)
    if retention_set:
        cfg = dataclasses.replace(cfg, tree=dataclasses.replace(cfg.tree, retention_interval=retention))
    if args.max_running < 1:
        raise ConfigError("--max-running", args.max_running, "must be >= 1")
    positive_number("--prefill-tps", args.prefill_tps)
    requests = load_requests(args, layout.page_tokens)
    ecfg = EngineConfig(max_running=args.max_running, prefill_tokens_per_s=args.prefill_tps,
                        admission=args.admission)
    cache = HiCache(layout, cfg)
    try:
        engine = ReferenceEngine(cache, ecfg, progress=Progress("replay", len(requests), enabled=not args.quiet))
        report = engine.run(requests)
        summary = build_summary(cache, report, requests, layout, ecfg)
        if args.metrics_out:
            from hicache.cache.metrics import PrometheusExporter

            PrometheusExporter(cache, labels={"model_name": layout.model or path.stem, "rank": 0}).write(args.metrics_out)
    finally:
        cache.close()
    emit(args, summary, report,
         lambda: print_summary(summary, title=f"hicache replay: {path.name}, {len(requests)} requests"))
    return 0 if summary["mismatched_pages"] == 0 else 1
