"""``hicache replay``: real multi-turn traffic through the reference engine, every tier live.

    hicache replay [--config PATH] [--workload NAME | --trace FILE]
                   [--conversations N] [--seed S] [--storage URL] [--device-gib X] [--host-gib Y]
                   [--device cpu|cuda|auto] [--verify full|sample|off] [--bytes real|none]
                   [clock flags] [--json]
                   [--plot FILE.png] [--requests-out FILE.jsonl] [--metrics-out FILE.prom]

``NAME`` is ``synthetic`` (the chat preset) or a workload family (:data:`WORKLOADS`,
``hicache.engine.workloads.FAMILIES``: multi-turn, chat, long-context, long-revisit, agentic,
sharegpt, sharegpt-nosys, reasoning, rag, mix, mix-poisson, production); ``--conversations``
counts the family's units (tasks for agentic, sessions for rag, requests for production).
The default workload is the ``multi-turn`` synthetic preset, 60 conversations. With no
``--config`` it runs the main job: the DeepSeek-V4-Flash layout with budgets sized to that
workload (:data:`MAIN_BUDGETS`) so that device, host and L3 each serve hits under the
config's policies. With ``--config`` the config's budgets apply.

``--bytes none`` is a policy-only replay: the same cache code and the same decisions on pools
that hold no bytes (``PoolConfig.bytes_mode``), copies that move none and a clock charged
the bytes they would have moved, so a large trace replays in minutes. Nothing can be
verified (``--verify`` is ``off``; ``full`` or ``sample`` is refused) and there is no L3
(``--storage none://`` is required: an L3 object is a host row's bytes).
"""

from __future__ import annotations

import argparse
import dataclasses
from dataclasses import dataclass
from pathlib import Path

from hicache.cli.common import (add_adaptive_flags, at_least, check_output, parse_candidates, parse_retention,
                                positive_number, resolve_config)
from hicache.cli.limits import check_units
from hicache.cli.progress import Progress
from hicache.cli.replay_report import build_summary, emit, print_summary
from hicache.config import (EVICTION_POLICIES, NO_L3, HiCacheConfig, StorageConfig, check_adaptive_z,
                            check_lookups, load_config)
from hicache.errors import ConfigError
from hicache.layout import CacheLayout, read_config_file
from hicache.storage import mask_url
from hicache.units import check_number

GiB = 1024**3
DEFAULT_CONFIG = "deepseek-v4-flash"
DEFAULT_WORKLOAD, DEFAULT_CONVERSATIONS = "multi-turn", 60
# The main job's budgets (no --config), sized to the default workload: see docs/workloads.md.
# The host is smaller than the device because write_through_selective backs up only pages
# hit twice: a larger host never fills, so L3 would never serve.
MAIN_BUDGETS = {"device_gib": 0.5, "host_gib": 0.25, "state_share": 0.6}
# Every family of hicache.engine.workloads.FAMILIES, plus "synthetic" (= chat); a literal so
# that building the parser imports no numpy (tests/cli/test_replay_cmd.py checks it is complete).
WORKLOADS = ("multi-turn", "synthetic", "chat", "sharegpt", "sharegpt-nosys", "long-context", "long-revisit",
             "agentic", "reasoning", "rag", "mix", "mix-poisson", "production")
CONVERSATIONS_HELP = ("conversations; tasks for agentic, sessions for rag, units for mix, requests for production "
                      f"(default {DEFAULT_CONVERSATIONS}")
CLOCK_FLAGS = (("prefill_tps", "prefill_tokens_per_s", 1.0), ("decode_step_ms", "decode_step_s", 1e-3),
               ("h2d_gbps", "h2d_gbps", 1.0), ("d2h_gbps", "d2h_gbps", 1.0), ("l3_gbps", "l3_gbps", 1.0),
               ("l3_rtt_ms", "l3_rtt_s", 1e-3))


def add_source_args(p: argparse.ArgumentParser, *, conversations_help: str) -> None:
    """--config, the workload or trace, its size and seed (replay and sweep)."""
    p.add_argument("--config", default=None,
                   help=f"config YAML or name (default: {DEFAULT_CONFIG} with the main job's budgets: "
                        f"device {MAIN_BUDGETS['device_gib']} GiB, host {MAIN_BUDGETS['host_gib']} GiB, "
                        f"state share {MAIN_BUDGETS['state_share']})")
    src = p.add_mutually_exclusive_group()
    src.add_argument("--workload", choices=WORKLOADS, default=DEFAULT_WORKLOAD,
                     help=f"built-in workload (default {DEFAULT_WORKLOAD}; synthetic = the chat preset)")
    src.add_argument("--trace", metavar="FILE.jsonl", help="a kvcache-simulator block-hash trace")
    p.add_argument("--block-size", type=int, default=None, metavar="TOKENS",
                   help="--trace: tokens per hash id for lines without block_size (a line's own "
                        "block_size wins), as kvcache-simulator's --block-size; Mooncake's traces "
                        "name none and use 512")
    p.add_argument("--conversations", type=int, default=None, help=conversations_help)
    p.add_argument("--seed", type=int, default=0, help="workload seed (default 0)")


def add_cache_args(p: argparse.ArgumentParser) -> None:
    """Policy and budget overrides of the config's ``cache:`` section."""
    p.add_argument("--storage", metavar="URL", help="L3 URL (default: the config's, memory://); none:// disables L3")
    p.add_argument("--device", metavar="DEV",
                   help="where the device (L1) pools live: cpu, cuda, cuda:N or auto (default: the config's; "
                        "cuda pins the host pools and copies with the Triton kernel)")
    p.add_argument("--device-pages", type=int, help="device budget as a page count (overrides --device-gib)")
    p.add_argument("--host-pages", type=int, help="host budget as a page count")
    p.add_argument("--state-share", type=float,
                   help="a split tier: share of its bytes kept for state snapshots; budget shared: a cap on "
                        "the bytes snapshots may take (default: the config's)")
    p.add_argument("--budget", choices=["split", "shared_host", "shared"],
                   help="split: fixed page / snapshot shares of each tier; shared_host: the device split, the "
                        "host one arena that pages and snapshots compete for; shared: one arena per tier "
                        "(default: the config's)")
    p.add_argument("--device-snapshots", type=int, help="device state snapshots")
    p.add_argument("--host-snapshots", type=int, help="host state snapshots")
    p.add_argument("--retention", help="retention interval in tokens, or 'none' (keep every snapshot)")
    add_adaptive_flags(p, {}, {"candidates": "default: the config's; docs/policy.md",
                               "adaptive_z": "default: the config's, 2; 0 off",
                               "adaptive_trial": "default: the config's; 0 off",
                               "adaptive_dead_outputs": "default: the config's, 32; 0 off",
                               "adaptive_floor": "default: the config's, on"})
    p.add_argument("--prefetch-policy", choices=["best_effort", "wait_complete", "timeout"],
                   help="how long admission waits for an L3 prefetch (default: the config's)")
    p.add_argument("--l3-admit", choices=["off", "published", "reused"],
                   help="which chains go to L3 on their own, not behind host eviction: published ones, reused "
                        "ones, or none (default: the config's; docs/storage.md)")
    p.add_argument("--l3-admit-min-tokens", type=int, metavar="N", help="L3 admission: shortest chain admitted")
    p.add_argument("--l3-admit-gbps", type=float, metavar="X", help="L3 admission: bandwidth budget, GB/s")
    p.add_argument("--write-policy", choices=["write_through", "write_through_selective", "write_back"],
                   help="when device pages are backed up to host (default: the config's)")
    p.add_argument("--eviction", choices=list(EVICTION_POLICIES),
                   help="victim order in every tier: lru, lfu or value (default: the config's)")
    p.add_argument("--host-tier", choices=["inclusive", "exclusive"],
                   help="keep host copies of pages loaded back to device (inclusive) or free them "
                        "(exclusive, needs --write-policy write_back); default: the config's")
    p.add_argument("--bytes", choices=["real", "none"], default="real",
                   help="real: the pools hold their bytes and every copy moves them (default); none: a "
                        "policy-only run -- the same decisions on pools with no bytes, copies that move "
                        "none (the clock charges what they would), nothing verified, no L3 (needs "
                        "--storage none://); minutes for a production-size trace")


def add_engine_args(p: argparse.ArgumentParser) -> None:
    """The reference engine's scheduling, verification and virtual clock."""
    p.add_argument("--max-running", type=int, default=16, help="concurrent requests (default 16)")
    p.add_argument("--admission", choices=["reserve", "greedy"], default="reserve",
                   help="reserve: admit while running requests' final pages fit the device (default); "
                        "greedy: admit up to --max-running and preempt when pages run out")
    p.add_argument("--verify", choices=["full", "sample", "off"], default=None,
                   help="page checks: every byte (full, for CI proofs), sampled words of every page "
                        "(sample, default) or none (off; the only one with --bytes none)")
    p.add_argument("--copy-landing", choices=["step", "wallclock"], default="step",
                   help="step: a step's device<->host copies land by its end, so replays repeat exactly "
                        "(default); wallclock: they land when the copy threads finish (as a live engine)")
    p.add_argument("--no-expect-queued", dest="expect_queued", action="store_false",
                   help="do not keep the cached prefixes of the queue's head warm while they wait "
                        "(HiCache.expect each step; on by default)")
    p.add_argument("--warm-queue-every", type=int, default=None, metavar="STEPS",
                   help="every STEPS steps keep warm the queued requests past the head too, front "
                        "first, while their prompts add up to no more pages than the cache holds "
                        "(default 8; 0: the head only)")
    p.add_argument("--prompt-grain", default="auto", metavar="TOKENS|auto",
                   help="the grain on which prompts share prefixes: a prompt's snapshot is also offered at "
                        "its last boundary on it (auto: a --trace's block_size, for layouts with state; "
                        "else 0, the page)")
    p.add_argument("--no-peer-hold", dest="peer_hold", action="store_false",
                   help="admit a queued request even while a running request is still computing its "
                        "prefix (by default it waits for that request's chunk, then resumes from it)")
    clock = p.add_argument_group("virtual clock (default: the config's engine: section, else built-in)")
    clock.add_argument("--prefill-tps", type=float, help="prefill tokens per second")
    clock.add_argument("--decode-step-ms", type=float, help="one decode iteration of the batch, ms")
    clock.add_argument("--h2d-gbps", type=float, help="host -> device copy bandwidth, GB/s")
    clock.add_argument("--d2h-gbps", type=float, help="device -> host copy bandwidth, GB/s")
    clock.add_argument("--l3-gbps", type=float, help="L3 read bandwidth, GB/s")
    clock.add_argument("--l3-rtt-ms", type=float, help="L3 round trip, ms")


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("replay", help="replay multi-turn traffic through the reference engine",
                       description="Run real or synthetic multi-turn conversations through a reference "
                                   "serving loop that embeds HiCache, with every tier live, on a virtual "
                                   "clock, and report reuse per tier against the ceiling, time to first "
                                   "token with and without the cache, bytes moved and byte checks.")
    add_source_args(p, conversations_help=CONVERSATIONS_HELP + "; tiny: 6)")
    p.add_argument("--model", choices=["synthetic", "tiny"], default="synthetic",
                   help="page contents: synthetic bytes (default) or the tiny DeepSeek-V4-style model")
    p.add_argument("--device-gib", type=float, help="device (L1) budget in GiB")
    p.add_argument("--host-gib", type=float, help="host (L2) budget in GiB")
    add_cache_args(p)
    add_engine_args(p)
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.add_argument("--plot", metavar="FILE.png", help="hit rate over time per tier (needs matplotlib)")
    p.add_argument("--requests-out", metavar="FILE.jsonl",
                   help="one line per replayed request (trace records kvcache-simulator skips are not "
                        "replayed; trace_line names each request's line)")
    p.add_argument("--metrics-out", metavar="FILE.prom",
                   help="write the Prometheus exposition text of the cache's metrics at the end "
                        "(labels model_name and rank=0; needs prometheus-client)")
    p.add_argument("--quiet", action="store_true", help="no progress line")
    p.set_defaults(func=run)


def cache_overrides(args: argparse.Namespace) -> dict:
    """The ``cache:`` fields the flags set (budgets in GiB are the caller's)."""
    out: dict = {}
    if args.storage is not None:
        out["storage_url"] = args.storage  # "" too: StorageConfig refuses it rather than ignoring it
    if args.device is not None:
        out["device"] = args.device        # PoolConfig checks it; building the pools finds no CUDA
    for flag in ("device_pages", "host_pages", "device_snapshots", "host_snapshots"):
        v = at_least(f"--{flag.replace('_', '-')}", getattr(args, flag), 1 if flag.endswith("pages") else 0)
        if v is not None:
            out[flag] = v
    if args.state_share is not None:
        out["state_share"] = args.state_share
    for flag in ("l3_admit", "l3_admit_min_tokens", "l3_admit_gbps"):
        if getattr(args, flag, None) is not None:
            out[flag] = getattr(args, flag)
    for flag in ("prefetch_policy", "write_policy", "host_tier", "eviction", "budget"):
        if getattr(args, flag):
            out[flag] = getattr(args, flag)
    if args.retention is not None:
        out["retention_interval"] = parse_retention("--retention", args.retention)
    if args.candidates is not None:
        out["adaptive_candidates"] = parse_candidates("--candidates", args.candidates)
    if args.adaptive_window is not None:
        out["adaptive_window"] = at_least("--adaptive-window", args.adaptive_window, 1)
    if args.adaptive_record is not None:
        out["adaptive_record"] = at_least("--adaptive-record", args.adaptive_record, 1)
    if args.adaptive_z is not None:
        out["adaptive_z"] = check_adaptive_z("--adaptive-z", args.adaptive_z)
    if args.adaptive_trial is not None:
        out["adaptive_trial"] = check_lookups("--adaptive-trial", args.adaptive_trial)
    if args.adaptive_dead_outputs is not None:
        out["adaptive_dead_outputs"] = check_lookups("--adaptive-dead-outputs", args.adaptive_dead_outputs)
    if args.adaptive_floor is not None:
        out["adaptive_floor"] = args.adaptive_floor == "on"
    if args.bytes != "real":
        out["bytes_mode"] = args.bytes
    return out


def check_bytes_flags(args: argparse.Namespace, path: Path) -> None:
    """``--bytes none`` with what needs bytes -- a byte check, an L3 store -- is one line.
    The L3 named by the config (no ``--storage``) counts too: a policy-only run must say
    ``--storage none://``, or it would silently differ from the byte replay of the same flags."""
    if args.bytes != "none":
        return
    if args.verify not in (None, "off"):
        raise ConfigError("--verify", args.verify, "needs the pools' bytes; --bytes none replays without "
                                                   "them (verify is off)")
    url = args.storage
    if url is None:
        section = read_config_file(path).get("cache")
        url = section.get("storage_url", StorageConfig().url) if isinstance(section, dict) else StorageConfig().url
    if url != NO_L3:
        where = "" if args.storage is not None else f" (the L3 of {path.name})"
        raise ConfigError("--storage", mask_url(str(url)),
                          f"--bytes none keeps no bytes for an L3 store to hold{where}: add --storage {NO_L3}")


def gib_bytes(flag: str, value: float) -> int:
    return max(1, int(check_number(flag, value) * GiB))


def budget_overrides(args: argparse.Namespace, device_gib: float | None, host_gib: float | None) -> dict:
    """Byte budgets from GiB flags; without ``--config``, the main job's where none is given."""
    main = MAIN_BUDGETS if args.config is None else {}
    device_gib = device_gib if device_gib is not None else main.get("device_gib")
    host_gib = host_gib if host_gib is not None else main.get("host_gib")
    out: dict[str, float | None] = {"device_bytes": gib_bytes("--device-gib", device_gib) if device_gib is not None else None,
           "host_bytes": gib_bytes("--host-gib", host_gib) if host_gib is not None else None}
    if args.state_share is None and "state_share" in main and args.budget != "shared":
        out["state_share"] = main["state_share"]   # the main job's split (a shared arena has no cap)
    return out


def load_cache_config(args: argparse.Namespace, **budgets) -> tuple[Path, CacheLayout, HiCacheConfig]:
    """The config file (or the default) with the flags' overrides and ``budgets`` applied."""
    path = resolve_config(args.config or DEFAULT_CONFIG)
    check_bytes_flags(args, path)
    over = cache_overrides(args)
    over.update({k: v for k, v in budgets.items() if v is not None})
    retention_set = "retention_interval" in over
    retention = over.pop("retention_interval", None)
    layout, cfg = load_config(path, **over)
    if retention_set:
        cfg = dataclasses.replace(cfg, tree=dataclasses.replace(cfg.tree, retention_interval=retention))
    return path, layout, cfg


def engine_config(args: argparse.Namespace, path: Path, work: "Workload | None" = None, layout=None):
    """EngineConfig from the flags and the config file's ``engine:`` section; ``work`` and
    ``layout`` resolve ``--prompt-grain auto`` (without them it is 0)."""
    from hicache.engine import EngineConfig, clock_from_mapping, contents
    from hicache.layout import read_config_file

    at_least("--max-running", args.max_running, 1)
    flags = {}
    for flag, key, scale in CLOCK_FLAGS:
        v = getattr(args, flag)
        if v is not None:
            if not (key == "l3_rtt_s" and v == 0):
                positive_number(f"--{flag.replace('_', '-')}", v)
            flags[key] = v * scale
    clock = clock_from_mapping(read_config_file(path).get("engine"), source=str(path), **flags)
    verify = contents.check_mode(args.verify or ("off" if args.bytes == "none" else "sample"))
    warm = {} if args.warm_queue_every is None else {"warm_queue_every": args.warm_queue_every}
    return EngineConfig(max_running=args.max_running, admission=args.admission, verify=verify,
                        copy_landing=args.copy_landing, expect_queued=args.expect_queued,
                        peer_hold=args.peer_hold, clock=clock,
                        prompt_grain=prompt_grain(getattr(args, "prompt_grain", "auto"), work, layout), **warm)


def prompt_grain(flag: str, work: "Workload | None", layout) -> int:
    """``--prompt-grain``: a token count, or ``auto``: a block-hash trace's ``block_size``
    for a layout with state (there a resume point needs a snapshot), else 0."""
    if flag == "auto":
        if work is None or layout is None or not layout.object_bytes("state"):
            return 0
        return int(work.trace_info.get("trace_block_size", 0))
    try:
        grain = int(flag)
    except ValueError:
        raise ConfigError("--prompt-grain", flag, "must be a token count (0: the page) or auto") from None
    at_least("--prompt-grain", grain, 0)
    return grain


@dataclass
class Workload:
    requests: list
    trace_info: dict      # what the trace reader passed over ({} for built workloads)
    name: str


def load_requests(args: argparse.Namespace) -> Workload:
    from hicache.engine import workloads

    n = args.conversations if args.conversations is not None else DEFAULT_CONVERSATIONS
    at_least("--conversations", n, 1)
    if args.block_size is not None:
        if not args.trace:
            raise ConfigError("--block-size", args.block_size, "applies to --trace only")
        at_least("--block-size", args.block_size, 1)
    if args.trace:
        loaded = workloads.read_trace(args.trace, block_size=args.block_size)
        return Workload(loaded.requests, loaded.info(), Path(args.trace).name)
    name = "chat" if args.workload == "synthetic" else args.workload
    check_units("--conversations", n, name)     # built whole in memory: bounded before building
    return Workload(workloads.build_family(name, n, args.seed), {}, f"{name} x{n}")


def replay_once(layout, cfg, ecfg, work: Workload, progress, metrics_out: str | None = None,
                model_name: str = "") -> tuple[dict, object]:
    """One replay of ``work`` on a fresh cache; (summary, engine report). ``metrics_out``:
    write the cache's Prometheus exposition text there at the end."""
    from hicache.cache import HiCache
    from hicache.engine import ReferenceEngine

    cache = HiCache(layout, cfg)
    try:
        report = ReferenceEngine(cache, ecfg, progress=progress).run(work.requests)
        summary = build_summary(cache, report, work.requests, layout, ecfg)
        if metrics_out:
            from hicache.cache import PrometheusExporter

            PrometheusExporter(cache, labels={"model_name": layout.model or model_name, "rank": 0}).write(metrics_out)
    finally:
        cache.close()
    summary.update(work.trace_info)
    return summary, report


def check_outputs(args: argparse.Namespace) -> None:
    """Outputs are checked before the run, so a bad path never throws a finished run away."""
    check_output("--requests-out", getattr(args, "requests_out", None))
    check_output("--metrics-out", getattr(args, "metrics_out", None))
    check_output("--plot", args.plot)
    if getattr(args, "metrics_out", None):
        try:
            import prometheus_client  # noqa: F401
        except ImportError:
            raise ConfigError("--metrics-out", args.metrics_out, "needs prometheus-client: "
                                                                 "pip install prometheus-client") from None
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
    path, layout, cfg = load_cache_config(args, **budget_overrides(args, args.device_gib, args.host_gib))
    ecfg = engine_config(args, path)   # the flags checked before a long trace is read
    work = load_requests(args)
    ecfg = dataclasses.replace(ecfg, prompt_grain=prompt_grain(args.prompt_grain, work, layout))
    progress = Progress("replay", len(work.requests), enabled=not args.quiet)
    summary, report = replay_once(layout, cfg, ecfg, work, progress, args.metrics_out, path.stem)
    emit(args, summary, report,
         lambda: print_summary(summary, title=f"hicache replay: {path.stem}, {work.name}, "
                                              f"{len(work.requests)} requests"
                                              + (", policy-only (--bytes none)" if args.bytes == "none" else "")))
    return 0 if summary["mismatched_pages"] == 0 else 1
