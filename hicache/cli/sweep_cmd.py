"""``hicache sweep``: the same requests replayed at several host budgets, beside
kvcache-simulator's LRU and optimal at the same bytes.

    hicache sweep [--config C] (--trace FILE | --workload W [--conversations N] [--seed S])
                  --device-gib D --host-gib a,b,c [--write-policy P ...] [--bytes real|none]
                  [--jobs N] [--json] [--plot FILE.png]

Each point is a full replay on a fresh cache (every byte it reads back checked, as
``--verify`` says; with ``--bytes none`` a policy-only replay, the same decisions with no
bytes moved or checked, see ``hicache replay``). When ``kvcache-simulator`` is installed, its ``lru`` and ``optimal``
policies run once over the same trace (a workload is first written as a trace with the
layout's page size as block size) with, per point, the capacity of our device + host
pages in tokens (a tier that is one arena -- the host with ``--budget shared_host``, both
with ``shared`` -- counts the tokens its bytes hold at one snapshot per mean prompt,
:func:`hicache.engine.kvsim.shared_capacity_tokens`), scaled into
its byte accounting (:mod:`hicache.engine.kvsim`): ``sim_gib`` is the budget to pass to
``kvcache-simulator run --budgets-gib`` to reproduce ``sim_lru`` / ``sim_optimal``.
Beside them, ``ref_hybrid_lru`` counts the same LRU at the same blocks as a hybrid model
must: a hit ends at a boundary with a (free) snapshot where our engine offers one --
request ends, forks, prefill chunk ends (:mod:`hicache.engine.hybrid_ref`, also ``hicache
ref``); the gap to ``sim_lru`` is what the resume rule alone costs an LRU cache.
``ref_block_lru`` is that code's attention-only count: kvcache-simulator's LRU reimplemented
(the sweep test checks it against the simulator). A layout without state (MHA, MLA) resumes
at any page, so it has no hybrid figure (None).

``--jobs N`` replays up to N points at once, each in a fresh (spawned) process that builds
or reads the requests again; the points are independent, so the figures are those of
``--jobs 1``. It needs no L3 (the default), since one process's points share an in-process
``memory://`` store and separate processes would not.

L3 is off unless ``--storage`` names one: the simulator is given device + host bytes only,
and an L3 would add bytes it does not have (an in-process ``memory://`` store would also
outlive each point and serve the next point's replay from the previous one's objects).
"""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path

from hicache.cli.common import at_least, check_output, parse_positive_list, print_json
from hicache.cli.progress import Progress
from hicache.cli.replay_cmd import (CONVERSATIONS_HELP, Workload, add_cache_args, add_engine_args, add_source_args,
                                    budget_overrides, engine_config, load_cache_config, load_requests, replay_once)
from hicache.cli.table import render_table
from hicache.errors import ConfigError, HiCacheError

NO_L3 = "none://"

POINT_KEYS = ("device_gib", "host_gib", "device_pages", "host_pages", "hit_rate", "hit_rate_last_half",
              "hit_rate_last_half_sim", "rejected_requests", "policy_followed", "policy_switches",
              "sim_gib", "sim_blocks", "sim_status", "sim_lru", "sim_optimal", "device_hit_tokens",
              "host_hit_tokens", "l3_hit_tokens", "ttft_p50_s", "ttft_p90_s", "ttft_p99_s",
              "ttft_uncached_p50_s", "queue_p90_s", "preemptions", "verified_pages", "mismatched_pages", "wall_s")


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("sweep", help="replay the same requests at several host budgets, beside kvcache-simulator",
                       description="Replay one workload or trace at each host budget and compare the hit rate "
                                   "with kvcache-simulator's LRU and optimal policies at the same bytes.")
    add_source_args(p, conversations_help=CONVERSATIONS_HELP + ")")
    p.add_argument("--device-gib", type=float, required=True, help="device (L1) budget in GiB, every point")
    p.add_argument("--host-gib", required=True, metavar="A,B,C", help="host (L2) budgets in GiB, one point each")
    add_cache_args(p)
    add_engine_args(p)
    sim = p.add_argument_group("kvcache-simulator (when installed)")
    sim.add_argument("--sim-model", default=None, help="its model id (default: the config's model)")
    sim.add_argument("--sim-kv-precision", default=None, help="its KV precision (default: its model default)")
    sim.add_argument("--sim-indexer-precision", default=None, help="its indexer precision (default: its default)")
    sim.add_argument("--sim-backend", choices=["cpp", "python"], default="cpp", help="its backend (default cpp)")
    sim.add_argument("--no-sim", action="store_true", help="do not run kvcache-simulator")
    p.add_argument("--jobs", type=int, default=1,
                   help="points replayed at once, each in its own process (default 1; needs no L3, the default)")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.add_argument("--plot", metavar="FILE.png", help="hit rate vs host budget (needs matplotlib)")
    p.add_argument("--quiet", action="store_true", help="no progress line")
    p.set_defaults(func=run)


def parse_budgets(text: str) -> list[float]:
    return parse_positive_list(text, "--host-gib", float, "0.5,1,2 (GiB)")


def _trace_for_sim(args: argparse.Namespace, work: Workload, page_tokens: int, tmp: str) -> str:
    """The trace the simulator reads: the given one, or the workload written as one."""
    if args.trace:
        return args.trace
    from hicache.engine.workloads import write_trace

    path = str(Path(tmp) / "workload.jsonl")
    write_trace(work.requests, path, block_size=page_tokens)
    return path


def _point(summary: dict, device_gib: float, host_gib: float) -> dict:
    out = {"device_gib": device_gib, "host_gib": host_gib}
    out.update({k: summary[k] for k in POINT_KEYS if k in summary})
    return out


def _capacity_tokens(summary: dict, budget: str, layout, mean_prompt: float) -> int:
    """The history tokens the simulator is given for one point, tier by tier: a split tier
    its page count, an arena its bytes at one snapshot per mean prompt (module docstring)."""
    from hicache.engine import kvsim
    from hicache.pools import ARENA_TIERS

    total = 0
    for tier in ("device", "host"):
        if tier in ARENA_TIERS[budget]:
            total += kvsim.shared_capacity_tokens(summary[f"{tier}_bytes"], layout.object_bytes("page"),
                                                  layout.object_bytes("state"), layout.page_tokens, mean_prompt)
        else:
            total += summary[f"{tier}_pages"] * layout.page_tokens
    return total


def _replay_point(args: argparse.Namespace, host: float) -> dict:
    """One point in a worker process (``--jobs``): the requests built (or read) again, as
    the parent did; a refusal comes back as ``{"error": ...}`` (exceptions with fields do
    not cross processes)."""
    try:
        work = load_requests(args)
        path, layout, cfg = load_cache_config(args, **budget_overrides(args, args.device_gib, host))
        summary, _ = replay_once(layout, cfg, engine_config(args, path), work, None)
        return summary
    except HiCacheError as exc:
        return {"error": str(exc)}


def _replay_points(args: argparse.Namespace, hosts: list[float], jobs: int, progress: Progress,
                   work: Workload) -> list[dict]:
    """The points' summaries, in ``hosts`` order: one after another, or ``jobs`` at a time in
    fresh (spawned) processes -- every point is a fresh cache either way."""
    n = len(work.requests)
    if jobs == 1:
        summaries = []
        for i, host in enumerate(hosts):
            path, layout, cfg = load_cache_config(args, **budget_overrides(args, args.device_gib, host))

            def step(done: int, total: int, offset: int = i * n, host: float = host) -> None:
                progress(offset + done, n * len(hosts), f"host {host:g} GiB")

            summaries.append(replay_once(layout, cfg, engine_config(args, path), work, step)[0])
        return summaries
    import concurrent.futures as cf
    import multiprocessing as mp

    with cf.ProcessPoolExecutor(max_workers=min(jobs, len(hosts)), mp_context=mp.get_context("spawn")) as pool:
        futures = [pool.submit(_replay_point, args, host) for host in hosts]
        for done, _ in enumerate(cf.as_completed(futures), 1):
            progress(done * n, n * len(hosts), f"{done}/{len(hosts)} points")
        summaries = [f.result() for f in futures]
    for s in summaries:
        if "error" in s:
            raise HiCacheError(s["error"])
    return summaries


def run(args: argparse.Namespace) -> int:
    from hicache.engine import hybrid_ref, kvsim

    hosts = parse_budgets(args.host_gib)
    if args.storage is None:
        args.storage = NO_L3   # same bytes as the simulator (module docstring)
    jobs = at_least("--jobs", args.jobs, 1)
    assert jobs is not None
    if jobs > 1 and args.storage != NO_L3:
        raise ConfigError("--jobs", jobs, f"needs --storage {NO_L3}: points in separate processes would not "
                                          "share an in-process L3 as one process's points do")
    check_output("--plot", args.plot)
    work = load_requests(args)
    n = len(work.requests)
    progress = Progress("sweep", n * len(hosts), enabled=not args.quiet)
    layout = cfg = path = ecfg = None
    for host in hosts:   # every point's config is checked before any replay
        path, layout, cfg = load_cache_config(args, **budget_overrides(args, args.device_gib, host))
        ecfg = engine_config(args, path)
    assert layout is not None and cfg is not None and ecfg is not None, "parse_budgets returns at least one budget"
    summaries = _replay_points(args, hosts, jobs, progress, work)
    points = [_point(s, args.device_gib, host) for s, host in zip(summaries, hosts)]
    out = {"config": str(path), "workload": work.name, "requests": n, "ceiling": summaries[0]["ceiling"],
           "ceiling_last_half": summaries[0]["ceiling_last_half"], "write_policy": summaries[0]["write_policy"],
           "prefetch_policy": summaries[0]["prefetch_policy"], "verify": summaries[0]["verify"],
           "bytes": summaries[0]["bytes"],
           "budget": cfg.pools.budget, "storage": cfg.storage.url}
    out.update(work.trace_info)
    if not args.no_sim and kvsim.available():
        with tempfile.TemporaryDirectory(prefix="hicache-sweep-") as tmp:
            trace = _trace_for_sim(args, work, layout.page_tokens, tmp)
            mean_prompt = sum(len(r.prompt) for r in work.requests) / n
            caps = [_capacity_tokens(s, cfg.pools.budget, layout, mean_prompt) for s in summaries]
            if cfg.pools.budget != "split":
                out["sim_mean_prompt_tokens"] = round(mean_prompt, 1)
            model = args.sim_model or kvsim.model_for(layout.model)
            sim = kvsim.simulate(trace, caps, model=model, kv_precision=args.sim_kv_precision,
                                 indexer_precision=args.sim_indexer_precision, backend=args.sim_backend)
            # the engine's chunk ends fall every chunk_tokens rounded down to whole pages (the
            # trace's blocks are our pages)
            chunk_blocks = max(ecfg.chunk_tokens // sim["block_size"], 1)
            refs = hybrid_ref.reference(trace, [s["capacity_blocks"] for s in sim["points"]],
                                        chunk_blocks=chunk_blocks)
            out["ref_chunk_blocks"] = chunk_blocks
        for p, s, r in zip(points, sim["points"], refs):
            p.update(sim_gib=s["budget_gib"], sim_blocks=s["capacity_blocks"], sim_status=s["status"],
                     sim_lru=None if s["lru"] is None else s["lru"]["hit_rate"],
                     sim_optimal=None if s["optimal"] is None else s["optimal"]["hit_rate"],
                     ref_block_lru=r.block_lru,
                     # a layout without state resumes at any page: only the block count applies
                     ref_hybrid_lru=r.hybrid_lru if layout.object_bytes("state") else None)
        k = sim["kvsim"]
        out.update(sim_model=k["model"], sim_kv_precision=k["kv_precision"],
                   sim_indexer_precision=k["indexer_precision"], sim_backend=k["backend"],
                   sim_version=k["version"], sim_block_size=sim["block_size"], sim_ceiling=sim["ceiling"]["hit_rate"],
                   sim_trace=args.trace)
    else:
        out.update(sim_model=None, sim_kv_precision=None, sim_indexer_precision=None)
    out["points"] = points
    if args.plot:
        write_plot(args.plot, out)
    if args.json:
        print_json(out)
    else:
        print_table(out)
    return 0 if all(p["mismatched_pages"] == 0 for p in points) else 1


def _pct(v) -> str | None:
    return None if v is None else f"{100 * v:.2f}%"


def print_table(out: dict) -> None:
    pts = out["points"]
    rows = []
    for p in pts:
        pt = p["device_hit_tokens"] + p["host_hit_tokens"] + p["l3_hit_tokens"]
        rows.append([f"{p['host_gib']:g}", f"{p['device_pages']:,} + {p['host_pages']:,}", _pct(p["hit_rate"]),
                     _pct(p["hit_rate_last_half"]), _pct(p.get("sim_lru")) or p.get("sim_status"),
                     _pct(p.get("sim_optimal")) or p.get("sim_status"), _pct(p.get("ref_hybrid_lru")),
                     None if p.get("sim_gib") is None else f"{p['sim_gib']:.4f}",
                     f"{p['device_hit_tokens'] / max(pt, 1):.0%} / {p['host_hit_tokens'] / max(pt, 1):.0%} / "
                     f"{p['l3_hit_tokens'] / max(pt, 1):.0%}",
                     None if p["ttft_p50_s"] is None else f"{p['ttft_p50_s']:.3f}", p["mismatched_pages"]])
    print(render_table(["host GiB", "pages dev + host", "hit rate", "last half", "sim LRU", "sim optimal",
                        "hybrid LRU", "sim GiB", "dev / host / L3", "TTFT p50 s", "mismatched"], rows,
                       title=f"hicache sweep: {Path(out['config']).stem}, {out['workload']}, {out['requests']} "
                             f"requests, device {pts[0]['device_gib']:g} GiB, {out['write_policy']}"
                             + (", policy-only (--bytes none)" if out.get("bytes") == "none" else "")))
    print()
    print(f"ceiling (unlimited memory): {out['ceiling']:.2%} of all prompt tokens, "
          f"{out['ceiling_last_half']:.2%} of the last half")
    if out.get("sim_model"):
        print(f"kvcache-simulator {out['sim_version']}: model {out['sim_model']}, kv {out['sim_kv_precision']}, "
              f"indexer {out['sim_indexer_precision']}, last half measured, its ceiling {out['sim_ceiling']:.2%}; "
              f"rerun one point with: kvcache-simulator run --trace TRACE --model {out['sim_model']} "
              f"--budgets-gib SIM_GIB --policies lru,optimal")
        print("hybrid LRU: the simulator's LRU at the same blocks, a hit counted only up to a boundary where a "
              f"snapshot is offered (request ends, forks, every {out['ref_chunk_blocks']} blocks of prefill; "
              "snapshots free): what the resume rule costs LRU (hicache ref)")
    else:
        print("kvcache-simulator not run (not installed, or --no-sim)")


def write_plot(path: str, out: dict) -> None:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        raise ConfigError("--plot", path, "needs matplotlib: pip install 'hicache[plot]'") from None
    pts = out["points"]
    xs = [p["host_gib"] for p in pts]
    fig, ax = plt.subplots(figsize=(7, 4))
    ax.plot(xs, [p["hit_rate_last_half"] for p in pts], "o-", label="hicache (last half)")
    for key, label in (("sim_lru", "kvcache-simulator LRU"), ("sim_optimal", "kvcache-simulator optimal"),
                       ("ref_hybrid_lru", "LRU counted at snapshots (hybrid)")):
        if any(p.get(key) is not None for p in pts):
            ax.plot(xs, [p.get(key) for p in pts], "s--", label=label)
    ax.axhline(out["ceiling_last_half"], color="grey", linestyle=":", label="ceiling (unlimited memory)")
    ax.set_xlabel(f"host budget, GiB (device {pts[0]['device_gib']:g} GiB)")
    ax.set_ylabel("hit rate, last half of requests")
    ax.set_ylim(0, 1)
    ax.legend(loc="lower right")
    ax.set_title(f"{out['workload']}, {out['requests']} requests")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
