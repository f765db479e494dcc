"""``hicache fleet``: N engines behind a router, sharing one L3 store (issue 26 part 3).

    hicache fleet --engines N [--routing round-robin|conversation] [--config PATH]
                  [--workload NAME | --trace FILE] [--conversations N] [--seed S]
                  [--storage URL] [--device-gib X] [--host-gib Y] [cache / engine flags]
                  [--processes] [--no-baselines] [--json] [--quiet]

Each engine gets the config's budgets (or ``--device-gib`` / ``--host-gib``, per engine).
The run is repeated as baselines: the same fleet without L3 (``none://``), and one engine
holding the summed budgets (with the store). Each run writes under its own key salt, so
no run reads another's objects, and its namespace is purged at the end. The engines are
driven on one virtual clock (:mod:`hicache.engine.fleet` says why); their L3 reads and
writes are real, each through its own connection. With ``--processes`` each engine runs in
an OS process of its own, in lock step with the driver (:mod:`hicache.engine.fleet_proc`). Prints per engine and per tier the hit
rate, TTFT with and without the store, what L3 admission wrote, and the fleet's totals.
"""

from __future__ import annotations

import argparse
import dataclasses
import statistics
from typing import Any

from hicache.cli.common import at_least, print_json
from hicache.cli.progress import Progress
from hicache.cli.replay_cmd import (CONVERSATIONS_HELP, add_cache_args, add_engine_args, add_source_args,
                                    budget_overrides, engine_config, load_cache_config, load_requests,
                                    prompt_grain)
from hicache.cli.table import render_table
from hicache.config import NO_L3
from hicache.errors import HiCacheError
from hicache.storage import mask_url, memory_store_name, with_memory_store_name
from hicache.units import format_bytes


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("fleet", help="several engines behind a router, sharing one L3 store",
                       description="Serve one workload on N engines (each with its own device and host "
                                   "budgets) behind a round-robin or per-conversation router, sharing one "
                                   "L3 store; report hits per engine and tier, the fleet's total, the same "
                                   "fleet without L3 and one engine holding the summed budgets.")
    p.add_argument("--engines", type=int, required=True, help="engines in the fleet (>= 1)")
    p.add_argument("--routing", choices=["round-robin", "conversation"], default="round-robin",
                   help="round-robin: each request to the next engine (default); conversation: a "
                        "conversation's turns stay on one engine")
    add_source_args(p, conversations_help=CONVERSATIONS_HELP + ")")
    p.add_argument("--device-gib", type=float, help="device (L1) budget of each engine, GiB")
    p.add_argument("--host-gib", type=float, help="host (L2) budget of each engine, GiB")
    add_cache_args(p)
    add_engine_args(p)
    p.add_argument("--processes", action="store_true",
                   help="each engine in its own OS process (its own pools, threads and store connection), "
                        "driven in lock step on the one virtual clock; needs a shared store (redis://, file://)")
    p.add_argument("--no-baselines", dest="baselines", action="store_false",
                   help="only the fleet with the store (no run without L3, no single engine)")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.add_argument("--quiet", action="store_true", help="no progress line")
    p.set_defaults(func=run, bytes="real", model="synthetic")


def _engine_summary(rep, stats: dict) -> dict:
    recs = rep.records
    prompt = sum(r.prompt_tokens for r in recs)
    ttft = sorted(r.ttft_s for r in recs if r.ttft_s is not None)

    def q(p: float) -> float | None:
        return round(ttft[min(len(ttft) - 1, int(p * len(ttft)))], 4) if ttft else None

    out: dict[str, Any] = {"requests": len(recs), "prompt_tokens": prompt}
    for tier in ("", "device_", "host_", "l3_"):
        out[f"{tier}hit_tokens"] = sum(getattr(r, f"{tier}hit_tokens") for r in recs)
    out["recomputed_tokens"] = sum(r.recomputed_tokens for r in recs)
    out["hit_rate"] = round(out["hit_tokens"] / prompt, 4) if prompt else 0.0
    out["ttft_p50_s"], out["ttft_p90_s"] = q(0.5), q(0.9)
    out["ttft_mean_s"] = round(statistics.fmean(ttft), 4) if ttft else None
    out["mismatched_pages"] = rep.mismatched_pages
    out["verified_pages"] = rep.verified_pages
    out["virtual_s"] = round(rep.virtual_s, 3)
    for k in ("l3_admit_chains", "l3_admit_bytes", "l3_admit_skipped_existing", "l3_admit_throttled",
              "l3_prefetched_pages", "l3_errors"):
        out[k] = stats.get(k, 0)
    return out


def _total(rows: list[dict]) -> dict:
    out = {k: sum(r[k] for r in rows) for k in ("requests", "prompt_tokens", "hit_tokens", "device_hit_tokens",
                                                "host_hit_tokens", "l3_hit_tokens", "recomputed_tokens",
                                                "mismatched_pages", "verified_pages", "l3_admit_bytes",
                                                "l3_admit_skipped_existing", "l3_errors")}
    out["hit_rate"] = round(out["hit_tokens"] / out["prompt_tokens"], 4) if out["prompt_tokens"] else 0.0
    timed = [(r["ttft_mean_s"], r["requests"]) for r in rows if r["ttft_mean_s"] is not None and r["requests"]]
    # per request, not per engine: engines serve different numbers of requests
    out["ttft_mean_s"] = round(statistics.fmean([m for m, _ in timed], weights=[n for _, n in timed]), 4) if timed else None
    return out


def _fleet_once(args, layout, cfg, ecfg, work, engines: int, label: str, url: str) -> dict:
    """One fleet run of ``engines`` engines on ``url`` under its own salt; its summary."""
    from hicache.cache import HiCache
    from hicache.engine import run_fleet, run_fleet_processes
    from hicache.pools import plan_pools

    storage = dataclasses.replace(cfg.storage, url=url, salt=f"{cfg.storage.salt}.fleet-{label}")
    cfg = dataclasses.replace(cfg, storage=storage)
    routing = args.routing if engines > 1 else "round-robin"
    progress = Progress(f"fleet {label}", len(work.requests), enabled=not args.quiet)
    plan = plan_pools(layout, cfg.pools)
    if args.processes:
        fr = run_fleet_processes(layout, cfg, engines, ecfg, work.requests, routing, progress)
    else:
        caches = [HiCache(layout, cfg) for _ in range(engines)]
        try:
            fr = run_fleet(caches, ecfg, work.requests, routing, progress)
        finally:
            for c in caches:
                c.close()
    rows = [_engine_summary(rep, st) for rep, st in zip(fr.reports, fr.stats)]
    purged = _purge(url, layout, storage.salt)
    return {"label": label, "purged": purged, "engines": engines, "storage_url": mask_url(url), "per_engine": rows,
            "total": _total(rows), "device_bytes": plan.device_bytes, "host_bytes": plan.host_bytes,
            "wall_s": round(fr.wall_s, 2)}


def _purge(url: str, layout, salt: str) -> bool:
    """Remove a run's namespace from a shared store (memory:// dies with the process).
    Best effort: a store that went down during the run (a node killed) leaves its keys,
    and the run's figures still count; False then."""
    if url == NO_L3 or url.startswith("memory://"):
        return True
    from hicache.storage import make_namespace, open_backend, purge

    try:
        backend = open_backend(url)
        try:
            purge(backend, make_namespace(layout.fingerprint, salt))
        finally:
            backend.close()
    except HiCacheError:
        return False
    return True


def run(args: argparse.Namespace) -> int:
    n = at_least("--engines", args.engines, 1)
    assert n is not None
    path, layout, cfg = load_cache_config(args, **budget_overrides(args, args.device_gib, args.host_gib))
    ecfg = engine_config(args, path)   # the flags checked before a long trace is read
    work = load_requests(args)
    ecfg = dataclasses.replace(ecfg, prompt_grain=prompt_grain(args.prompt_grain, work, layout))
    url = cfg.storage.url
    if args.processes:
        from hicache.engine import check_shareable

        check_shareable(url)
    if memory_store_name(url) == "":
        url = with_memory_store_name(url, "fleet")   # one store shared by the engines of this process
    out: dict[str, Any] = {"config": path.stem, "workload": work.name, "routing": args.routing, "engines": n,
                           "processes": bool(args.processes)}
    out["fleet"] = _fleet_once(args, layout, cfg, ecfg, work, n, "fleet", url)
    if args.baselines:
        out["fleet_no_l3"] = _fleet_once(args, layout, cfg, ecfg, work, n, "no-l3", NO_L3)
        plan = out["fleet"]
        pools = dataclasses.replace(cfg.pools, device_bytes=n * plan["device_bytes"],
                                    host_bytes=n * plan["host_bytes"])
        out["single"] = _fleet_once(args, layout, dataclasses.replace(cfg, pools=pools), ecfg, work, 1, "single", url)
    if args.json:
        print_json(out)
    else:
        print_fleet(out)
    bad = sum(run["total"]["mismatched_pages"] for key, run in out.items() if isinstance(run, dict) and "total" in run)
    return 0 if bad == 0 else 1


def _row(name: str, s: dict) -> list:
    pt = max(s["prompt_tokens"], 1)
    return [name, s["requests"], f"{s['hit_rate']:.1%}", f"{s['device_hit_tokens'] / pt:.1%}",
            f"{s['host_hit_tokens'] / pt:.1%}", f"{s['l3_hit_tokens'] / pt:.1%}",
            "-" if s.get("ttft_mean_s") is None else f"{s['ttft_mean_s']:.3f}",
            format_bytes(s["l3_admit_bytes"]), s["mismatched_pages"]]


def print_fleet(out: dict) -> None:
    head = ["engine", "requests", "hit rate", "device", "host", "L3", "TTFT mean s", "L3 admitted", "mismatched"]
    fleet = out["fleet"]
    rows = [_row(f"#{i}", s) for i, s in enumerate(fleet["per_engine"])]
    rows.append(_row(f"fleet of {out['engines']}", fleet["total"]))
    if "fleet_no_l3" in out:
        nol3 = out["fleet_no_l3"]
        rows += [_row(f"#{i} without L3", s) for i, s in enumerate(nol3["per_engine"])]
        rows.append(_row(f"fleet of {out['engines']} without L3", nol3["total"]))
        rows.append(_row("one engine, summed budgets", out["single"]["total"]))
    print(f"hicache fleet: {out['config']}, {out['workload']}, {out['engines']} engines, {out['routing']} routing, "
          f"store {fleet['storage_url']}; per engine device {format_bytes(fleet['device_bytes'])}, "
          f"host {format_bytes(fleet['host_bytes'])}")
    print(render_table(head, rows))
