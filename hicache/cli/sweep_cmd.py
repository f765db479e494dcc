"""``hicache sweep``: the same requests replayed at several host budgets, beside
kvcache-simulator's LRU and optimal at the same bytes.

    hicache sweep [--config C] (--trace FILE | --workload W [--conversations N] [--seed S])
                  --device-gib D --host-gib a,b,c [--write-policy P ...] [--bytes real|none]
                  [--policies P,P,... | --eviction P] [--jobs N] [--json] [--plot FILE.png]

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

``--policies lru,value,adaptive`` replays every point once per eviction policy (each as
``--eviction P`` with the same config and flags, on a fresh cache) and prints them side by
side, each with the share of the simulator's LRU -> optimal gap it closes
(:mod:`hicache.cli.sweep_report`). The simulator still runs once: its figures do not
depend on our policy, and its capacity -- our pools' sizes at a host budget -- is the same
for every policy (checked). Without ``--policies`` the sweep replays the config's policy,
or ``--eviction``'s.

``--jobs N`` replays up to N (policy, host budget) pairs at once, each in a fresh (spawned)
process that builds or reads the requests again; the pairs are independent, so the figures
are those of ``--jobs 1``. It needs no L3 (the default), since one process's points share an
in-process ``memory://`` store and separate processes would not.

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
from hicache.cli.sweep_report import (policy_points, print_policies_table, print_table, served, write_plot,
                                     write_policies_plot)
from hicache.config import EVICTION_POLICIES
from hicache.errors import ConfigError, HiCacheError
from hicache.storage import mask_url

NO_L3 = "none://"

POINT_KEYS = ("device_gib", "host_gib", "device_pages", "host_pages", "hit_rate", "hit_rate_last_half",
              "hit_rate_last_half_sim", "hit_rate_last_half_served", "rejected_requests", "policy_followed",
              "policy_switches",
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
    p.add_argument("--policies", metavar="P,P,...",
                   help=f"replay every host budget once per eviction policy, side by side: names from "
                        f"{','.join(EVICTION_POLICIES)} (default: the config's policy, or --eviction's)")
    p.add_argument("--jobs", type=int, default=1,
                   help="(policy, host budget) pairs replayed at once, each in its own process (default 1; "
                        "needs no L3, the default)")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.add_argument("--plot", metavar="FILE.png", help="hit rate vs host budget (needs matplotlib)")
    p.add_argument("--quiet", action="store_true", help="no progress line")
    p.set_defaults(func=run)


def parse_budgets(text: str) -> list[float]:
    return parse_positive_list(text, "--host-gib", float, "0.5,1,2 (GiB)")


def parse_policies(text: str | None, eviction: str | None) -> list[str] | None:
    """``--policies``: distinct names from :data:`EVICTION_POLICIES`, in the order given
    (None without the flag). It replaces ``--eviction``, so the two together are refused."""
    if text is None:
        return None
    if eviction is not None:
        raise ConfigError("--policies", text, f"replays each policy as --eviction P: drop --eviction {eviction}")
    names = [x.strip() for x in text.split(",")]
    if not names or any(n not in EVICTION_POLICIES for n in names) or len(set(names)) != len(names):
        raise ConfigError("--policies", text, f"must list distinct names from {','.join(EVICTION_POLICIES)}")
    return names


def _with_eviction(args: argparse.Namespace, policy: str | None) -> argparse.Namespace:
    """``args`` as ``--eviction policy`` (``args`` itself for None: the config's or --eviction's)."""
    return args if policy is None else argparse.Namespace(**{**vars(args), "eviction": policy})


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
        summary, _ = replay_once(layout, cfg, engine_config(args, path, work, layout), work, None)
        return summary
    except HiCacheError as exc:
        return {"error": str(exc)}


def _replay_points(pairs: list[tuple[argparse.Namespace, float]], device_gib: float, jobs: int,
                   progress: Progress, work: Workload, labels: list[str]) -> list[dict]:
    """The summaries of ``pairs`` (the flags of one policy, a host budget), in order: one
    after another, or ``jobs`` at a time in fresh (spawned) processes -- every pair is a
    fresh cache either way."""
    n, total = len(work.requests), len(work.requests) * len(pairs)
    if jobs == 1:
        summaries = []
        for i, ((args, host), label) in enumerate(zip(pairs, labels)):
            path, layout, cfg = load_cache_config(args, **budget_overrides(args, device_gib, host))

            def step(done: int, _total: int, offset: int = i * n, label: str = label) -> None:
                progress(offset + done, total, label)

            summaries.append(replay_once(layout, cfg, engine_config(args, path, work, layout), work, step)[0])
        return summaries
    import concurrent.futures as cf
    import multiprocessing as mp

    with cf.ProcessPoolExecutor(max_workers=min(jobs, len(pairs)), mp_context=mp.get_context("spawn")) as pool:
        futures = [pool.submit(_replay_point, args, host) for args, host in pairs]
        for done, _ in enumerate(cf.as_completed(futures), 1):
            progress(done * n, total, f"{done}/{len(pairs)} replays")
        summaries = [f.result() for f in futures]
    for s in summaries:
        if "error" in s:
            raise HiCacheError(s["error"])
    return summaries


def _check_same_pools(by_policy: dict, hosts: list[float]) -> None:
    """Every policy's pools at a host budget are the same size: the simulator, run once, is
    given one capacity per budget (module docstring)."""
    keys = ("device_pages", "host_pages", "device_bytes", "host_bytes", "budget")
    for i, host in enumerate(hosts):
        sizes = {p: tuple(s[i][k] for k in keys) for p, s in by_policy.items()}
        assert len(set(sizes.values())) == 1, f"host {host:g} GiB: pool sizes differ by policy: {sizes}"


def _served_trace(args: argparse.Namespace, work: Workload, rejected: set[int], page_tokens: int, tmp: str) -> str:
    """The trace of the requests the engine served (the rejected ones left out): the given
    trace's other lines as they are, or the served part of the workload written as one."""
    path = Path(tmp) / "served.jsonl"
    if args.trace:
        from hicache.engine.workloads import open_text

        lines = {work.requests[i].source_line for i in rejected}
        with open_text(Path(args.trace)) as src, open(path, "w") as dst:
            for number, line in enumerate(src, 1):
                if number not in lines:
                    dst.write(line if line.endswith("\n") else line + "\n")
        return str(path)
    from hicache.engine.workloads import write_trace

    write_trace([r for r in work.requests if r.request_id not in rejected], path, block_size=page_tokens)
    return str(path)


def _rejected(summaries: list[dict]) -> set[int]:
    """The requests the engine rejected (longer than the device): the same at every point,
    whatever the policy, since the device budget is fixed."""
    sets = {tuple(s.get("rejected_request_ids", ())) for s in summaries}
    assert len(sets) == 1, "the rejected requests depend on the device budget alone"
    return set(sets.pop())


def _simulate(args: argparse.Namespace, work: Workload, layout, cfg, ecfg,
              summaries: list[dict]) -> tuple[dict, list[dict]]:
    """kvcache-simulator's LRU and optimal (and our reference's LRU counted both ways) at the
    capacity of each point's pools: (the sweep's fields, one dict of fields per point).

    When the engine rejected requests (longer than the device: no engine can run them, and
    no policy serves them), the simulator also runs on the trace of the served requests, at
    the same capacities: ``sim_lru_served`` / ``sim_optimal_served`` are the figures to set
    beside ours over the same requests (``hit_rate_last_half_served``); with every request
    rejected, there are none (``sim_status_served`` ``none_served``)."""
    from hicache.engine import hybrid_ref, kvsim

    out: dict = {}
    n = len(work.requests)
    rejected = _rejected(summaries)
    served: list[dict] | None = None
    with tempfile.TemporaryDirectory(prefix="hicache-sweep-") as tmp:
        trace = _trace_for_sim(args, work, layout.page_tokens, tmp)
        mean_prompt = sum(len(r.prompt) for r in work.requests) / n
        caps = [_capacity_tokens(s, cfg.pools.budget, layout, mean_prompt) for s in summaries]
        if cfg.pools.budget != "split":
            out["sim_mean_prompt_tokens"] = round(mean_prompt, 1)
        model = args.sim_model or kvsim.model_for(layout.model)
        sim = kvsim.simulate(trace, caps, model=model, kv_precision=args.sim_kv_precision,
                             indexer_precision=args.sim_indexer_precision, backend=args.sim_backend,
                             block_size=args.block_size)
        # the engine's chunk ends fall every chunk_tokens rounded down to whole pages (the
        # trace's blocks are our pages)
        chunk_blocks = max(ecfg.chunk_tokens // sim["block_size"], 1)
        refs = hybrid_ref.reference(trace, [s["capacity_blocks"] for s in sim["points"]], chunk_blocks=chunk_blocks,
                                    block_size=args.block_size)
        out["ref_chunk_blocks"] = chunk_blocks
        if len(rejected) == n:   # nothing served: nothing to simulate over (the simulator refuses an empty trace)
            served = [{"status": "none_served", "lru": None, "optimal": None}] * len(caps)
        elif rejected:
            served = kvsim.simulate(_served_trace(args, work, rejected, layout.page_tokens, tmp), caps, model=model,
                                    kv_precision=args.sim_kv_precision, indexer_precision=args.sim_indexer_precision,
                                    backend=args.sim_backend, block_size=args.block_size)["points"]
    out["rejected_requests"] = len(rejected)
    out["rejected_prompt_tokens"] = sum(len(work.requests[i].prompt) for i in rejected)
    if args.trace:   # the served trace is the given one without these lines
        out["rejected_trace_lines"] = sorted(work.requests[i].source_line for i in rejected)
    fields = []
    for i, (s, r) in enumerate(zip(sim["points"], refs)):
        f = dict(sim_gib=s["budget_gib"], sim_blocks=s["capacity_blocks"], sim_status=s["status"],
                 sim_lru=None if s["lru"] is None else s["lru"]["hit_rate"],
                 sim_optimal=None if s["optimal"] is None else s["optimal"]["hit_rate"],
                 ref_block_lru=r.block_lru,
                 # a layout without state resumes at any page: only the block count applies
                 ref_hybrid_lru=r.hybrid_lru if layout.object_bytes("state") else None)
        if served is not None:
            v = served[i]
            f.update(sim_status_served=v["status"], sim_lru_served=None if v["lru"] is None else v["lru"]["hit_rate"],
                     sim_optimal_served=None if v["optimal"] is None else v["optimal"]["hit_rate"])
        fields.append(f)
    k = sim["kvsim"]
    out.update(sim_model=k["model"], sim_kv_precision=k["kv_precision"],
               sim_indexer_precision=k["indexer_precision"], sim_backend=k["backend"],
               sim_version=k["version"], sim_block_size=sim["block_size"], sim_ceiling=sim["ceiling"]["hit_rate"],
               sim_trace=args.trace)
    return out, fields


def run(args: argparse.Namespace) -> int:
    from hicache.engine import kvsim

    policies = parse_policies(args.policies, args.eviction)
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
    names: list[str | None] = list(policies) if policies else [None]
    pairs = [(_with_eviction(args, p), host) for p in names for host in hosts]
    labels = [(f"{p}, " if p else "") + f"host {host:g} GiB" for p in names for host in hosts]
    progress = Progress("sweep", n * len(pairs), enabled=not args.quiet)
    layout = cfg = path = ecfg = None
    for a, host in pairs:   # every replay's config is checked before any replay
        path, layout, cfg = load_cache_config(a, **budget_overrides(a, args.device_gib, host))
        ecfg = engine_config(a, path, work, layout)
    assert layout is not None and cfg is not None and ecfg is not None, "parse_budgets returns at least one budget"
    flat = _replay_points(pairs, args.device_gib, jobs, progress, work, labels)
    by_policy = {p: flat[i * len(hosts):(i + 1) * len(hosts)] for i, p in enumerate(names)}
    _check_same_pools(by_policy, hosts)
    summaries = by_policy[names[0]]
    out = {"config": str(path), "workload": work.name, "requests": n, "ceiling": summaries[0]["ceiling"],
           "ceiling_last_half": summaries[0]["ceiling_last_half"], "write_policy": summaries[0]["write_policy"],
           "prefetch_policy": summaries[0]["prefetch_policy"], "verify": summaries[0]["verify"],
           "bytes": summaries[0]["bytes"], "prompt_grain": summaries[0]["prompt_grain"],
           "budget": cfg.pools.budget, "storage": mask_url(cfg.storage.url)}
    out.update(work.trace_info)
    sims = None
    if not args.no_sim and kvsim.available():
        fields, sims = _simulate(args, work, layout, cfg, ecfg, summaries)
        out.update(fields)
    else:
        out.update(sim_model=None, sim_kv_precision=None, sim_indexer_precision=None)
    if policies:
        measures = {s.get("hit_rate_last_half_sim") is not None for s in flat}
        assert len(measures) == 1, "the measure depends on the requests alone"
        out["policies"] = policies
        out["measure"] = ("hit_rate_last_half_served" if sims and served(sims[0])
                          else "hit_rate_last_half_sim" if measures.pop() else "hit_rate_last_half")
        out["points"] = policy_points(policies, {p: by_policy[p] for p in policies}, hosts, args.device_gib, sims)
    else:
        points = [_point(s, args.device_gib, host) for s, host in zip(summaries, hosts)]
        for p, f in zip(points, sims or []):
            p.update(f)
        out["points"] = points
    if args.plot:
        (write_policies_plot if policies else write_plot)(args.plot, out)
    if args.json:
        print_json(out)
    else:
        (print_policies_table if policies else print_table)(out)
    return 0 if all(s["mismatched_pages"] == 0 for s in flat) else 1
