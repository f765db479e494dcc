"""The summary of a replay: what was reused from where, at what cost, and whether every
byte was right; as a table, as JSON, per request (JSONL) and as a plot."""

from __future__ import annotations

import dataclasses
import json
import statistics

import numpy as np

from hicache.cli.common import print_json
from hicache.cli.table import render_table
from hicache.engine import request_slots
from hicache.errors import ConfigError
from hicache.storage import mask_url
from hicache.units import format_bytes


def percentiles(values, prefix: str) -> dict:
    """``{prefix}_p50_s``, ``_p90_s``, ``_p99_s`` (None without values)."""
    vals = [v for v in values if v is not None]
    out = {}
    for q in (50, 90, 99):
        out[f"{prefix}_p{q}_s"] = round(float(np.percentile(vals, q)), 4) if vals else None
    return out


def _timing(records) -> dict:
    """Virtual-clock times: TTFT with and without the cache, and queueing delay."""
    ran = [r for r in records if not r.rejected]
    out = {}
    out.update(percentiles([r.ttft_s for r in ran], "ttft"))
    out.update(percentiles([r.ttft_uncached_s for r in ran], "ttft_uncached"))
    out.update(percentiles([r.queue_s for r in ran], "queue"))
    ttft = [r.ttft_s for r in ran if r.ttft_s is not None]
    base = [r.ttft_uncached_s for r in ran if r.ttft_uncached_s is not None]
    out["ttft_mean_s"] = round(statistics.fmean(ttft), 4) if ttft else None
    out["ttft_uncached_mean_s"] = round(statistics.fmean(base), 4) if base else None
    return out


def _ceiling(recs, requests, layout) -> dict:
    """Hit rate with unlimited memory (whole pages, one token short of each prompt)."""
    from hicache.engine.workloads import reusable_per_request

    reusable = reusable_per_request(requests, page_tokens=layout.page_tokens)
    prompt = sum(r.prompt_tokens for r in recs)
    half = recs[len(recs) // 2:]
    half_prompt = sum(r.prompt_tokens for r in half)
    return {
        "ceiling": round(sum(reusable.get(r.request_id, 0) for r in recs) / prompt, 4) if prompt else 0.0,
        "ceiling_last_half": round(sum(reusable.get(r.request_id, 0) for r in half) / half_prompt, 4)
        if half_prompt else 0.0,
    }


def _sim_measure(half, requests) -> float | None:
    """The last half's hit rate as kvcache-simulator measures its own: over the prompt
    tokens of the blocks a trace hashes (an unhashed tail of a prompt, which no cache can
    share, is not counted), each hit counted up to them. None for a built workload, whose
    written trace hashes every prompt token (then it equals ``hit_rate_last_half``)."""
    hashed = {r.request_id: r.hashed_tokens for r in requests}
    if not half or any(hashed.get(r.request_id) is None for r in half):
        return None
    total = sum(hashed[r.request_id] for r in half)
    hit = sum(min(r.hit_tokens, hashed[r.request_id]) for r in half)
    return round(hit / total, 4) if total else 0.0


def _served_measure(recs, requests) -> float:
    """The last half's hit rate over the requests the engine served: a request longer than
    the device (prompt + output) cannot run on it and is rejected, under any policy; this
    is the figure to set beside a simulator run on the same served requests (``hicache
    sweep``). The simulator's measure on a trace (hashed blocks), else every prompt token."""
    served = [r for r in recs if not r.rejected]
    half = served[len(served) // 2:]
    sim = _sim_measure(half, requests)
    if sim is not None:
        return sim
    total = sum(r.prompt_tokens for r in half)
    return round(sum(r.hit_tokens for r in half) / total, 4) if total else 0.0


def admission_summary(cache, s: dict, virtual_s: float) -> dict:
    """L3 admission's counters (issue 26) and its write rate against its budget."""
    keys = ("l3_admit_chains", "l3_admit_objects", "l3_admit_bytes", "l3_admit_skipped_existing",
            "l3_admit_failed_objects", "l3_admit_throttled", "l3_admit_dropped")
    out: dict = {k: s[k] for k in keys}
    from hicache.cache import admission_active

    active = admission_active(cache.config.admit, cache.config.storage.url)
    out["l3_admit"] = cache.config.admit.mode if active else "off"
    out["l3_admit_budget_gbps"] = cache.config.admit.gbps
    out["l3_admit_gbps"] = round(s["l3_admit_bytes"] / virtual_s / 1e9, 4) if virtual_s else 0.0
    out["l3_admit_engine_s"] = round(s["l3_admit_engine_us"] / 1e6, 3)
    return out


def build_summary(cache, report, requests, layout, ecfg) -> dict:
    """One flat dict of the run (the ``--json`` object)."""
    s = cache.stats()
    t = cache.transfer_stats()
    l3 = cache.l3_stats()
    recs = report.records
    prompt = sum(r.prompt_tokens for r in recs)
    hit = sum(r.hit_tokens for r in recs)
    half = recs[len(recs) // 2:]
    half_prompt = sum(r.prompt_tokens for r in half)
    l3c = l3.get("counters", {}) if l3 else {}
    out = {
        "requests": len(recs),
        "prompt_tokens": prompt,
        "hit_tokens": hit,
        "hit_rate": round(hit / prompt, 4) if prompt else 0.0,
        "hit_rate_last_half": round(sum(r.hit_tokens for r in half) / half_prompt, 4) if half_prompt else 0.0,
        "hit_rate_last_half_sim": _sim_measure(half, requests),
        "hit_rate_last_half_served": _served_measure(recs, requests),
        "rejected_tokens": sum(r.prompt_tokens for r in recs if r.rejected),
        "rejected_request_ids": [r.request_id for r in recs if r.rejected],
        "prompt_tokens_last_half": half_prompt,
        "hit_tokens_last_half": sum(r.hit_tokens for r in half),
        "device_hit_tokens": sum(r.device_hit_tokens for r in recs),
        "host_hit_tokens": sum(r.host_hit_tokens for r in recs),
        "l3_hit_tokens": sum(r.l3_hit_tokens for r in recs),
        "recomputed_tokens": sum(r.recomputed_tokens for r in recs),
        "preemptions": report.preemptions,
        # steps a queued request waited for a running request computing its prefix (peer_hold)
        "peer_holds": report.peer_holds,
        "readmission_recomputed_tokens": sum(r.readmission_recomputed_tokens for r in recs),
        "rejected_requests": report.rejected,
        # loads the device could not take whole (no free row, often no state row): the
        # request resumed at the deepest point already on the device instead
        "load_fallbacks": s["load_fallbacks"],
        "finished_requests": sum(r.finished for r in recs),
        "d2h_bytes": t["d2h"]["bytes"], "d2h_gbps": round(t["d2h"]["gbps"], 2),
        "h2d_bytes": t["h2d"]["bytes"], "h2d_gbps": round(t["h2d"]["gbps"], 2),
        "l3_put_objects": s["l3_put_objects"], "l3_put_dropped": s["l3_put_dropped"],
        "l3_prefetched_pages": s["l3_prefetched_pages"],
        "l3_get_bytes": int(l3c.get("get_bytes", 0)), "l3_put_bytes": int(l3c.get("put_bytes", 0)),
        **admission_summary(cache, s, report.virtual_s),
        # evicted = dropped (no copy left below) + demoted (a host copy stays)
        "device_evicted_pages": s["device_evicted_pages"] + s["device_demoted_pages"],
        "device_dropped_pages": s["device_evicted_pages"], "device_demoted_pages": s["device_demoted_pages"],
        "host_evicted_pages": s["host_evicted_pages"],
        "host_released_pages": s["host_released_pages"],
        "snapshots_offered": s["snapshots_offered"], "snapshots_kept": s["snapshots_kept"],
        "snapshots_provisional": s["snapshots_provisional"],
        "snapshots_dropped_retention": s["snapshots_dropped_retention"],
        "snapshots_evicted": s["snapshots_evicted_device"] + s["snapshots_evicted_host"],
        "verified_pages": report.verified_pages,
        "mismatched_pages": report.mismatched_pages,
        "l3_errors": s["l3_errors"],
        "l3_rejected": s["l3_rejected"],
        "budget": cache.pools.plan.budget,
        "compaction_moves": s["compaction_moves"],
        "device_bytes": cache.pools.plan.device_bytes,
        "host_bytes": cache.pools.plan.host_bytes,
        "device_pages": cache.pools.plan.device_pages,
        "host_pages": cache.pools.plan.host_pages,
        "device_snapshots": s["device_states_total"],
        "request_slots": request_slots(cache),   # running requests the device's state rows serve
        "retention_interval": cache.config.tree.retention_interval,
        "eviction": cache.config.tree.eviction,
        "adaptive_candidates": list(cache.config.tree.adaptive_candidates),
        "adaptive_floor": cache.config.tree.adaptive_floor,
        "adaptive_record": cache.config.tree.adaptive_record,
        "adaptive_z": cache.config.tree.adaptive_z,
        "adaptive_trial": cache.config.tree.adaptive_trial,
        "adaptive_dead_outputs": cache.config.tree.adaptive_dead_outputs,
        "policy_trials": s.get("policy_trials", 0),
        "policy_followed": s.get("policy_followed", cache.config.tree.eviction),   # adaptive: its choice at the end
        "policy_switches": s.get("policy_switches", 0),
        "policy_regret_pages": s.get("policy_regret_pages", 0),
        "policy_looked_up_pages": s.get("policy_looked_up_pages", 0),
        # the followed candidates' ghost hits, in tokens, beside the real cache's hit_tokens:
        # how well the ghost the cache follows predicts it (the ghosts' fidelity)
        "policy_ghost_hit_tokens": s.get("policy_followed_ghost_hit_pages", 0) * layout.page_tokens,
        "ghost_hit_pages": {k.split(":", 1)[1]: v for k, v in s.items() if k.startswith("ghost_hit_pages:")},
        "storage_url": mask_url(cache.config.storage.url),
        "write_policy": cache.config.write.write_policy,
        "prefetch_policy": cache.config.storage.prefetch_policy,
        "l3_planned_pages": sum(r.l3_planned_pages for r in recs),
        "l3_landed_pages": sum(r.l3_landed_pages for r in recs),
        "verify": ecfg.verify,
        "bytes": cache.config.pools.bytes_mode,   # none: a policy-only run (nothing moved or verified)
        "device": str(cache.pools.device.device),   # where the device tier's pools live
        "copy_landing": ecfg.copy_landing,
        "prompt_grain": ecfg.prompt_grain,   # tokens; 0: snapshots at page boundaries only
        "clock": dataclasses.asdict(ecfg.clock),
        "virtual_s": round(report.virtual_s, 3),
        "wall_s": round(report.wall_s, 2),
        "requests_per_s": round(len(recs) / report.wall_s, 2) if report.wall_s else None,
    }
    out.update(_ceiling(recs, requests, layout))
    out.update(_timing(recs))
    return out


def hit_rows(s: dict) -> list[list[str]]:
    """The table rows both replays share: requests, tokens, and hits per tier."""
    pt = max(s["prompt_tokens"], 1)

    def share(n):
        return f"{n:,} ({n / pt:.1%})"

    return [
        ["requests", f"{s['requests']:,}"],
        ["prompt tokens", f"{s['prompt_tokens']:,}"],
        ["hit tokens (hit rate)", share(s["hit_tokens"])],
        ["  from device", share(s["device_hit_tokens"])],
        ["  from host", share(s["host_hit_tokens"])],
        ["  from L3", share(s["l3_hit_tokens"])],
    ]


def emit(args, summary: dict, report, print_table) -> None:
    """Print the JSON object or the table, then write --requests-out / --plot (checked
    before the run; a failure now still leaves the summary printed)."""
    if args.json:
        print_json(summary)
    else:
        print_table()
    for flag, path, write in (("--requests-out", args.requests_out, write_requests), ("--plot", args.plot, write_plot)):
        if path:
            try:
                write(path, report)
            except OSError as exc:
                raise ConfigError(flag, path, f"cannot be written: {exc.strerror}") from None


def print_summary(summary: dict, *, title: str) -> None:
    s = summary
    pt = max(s["prompt_tokens"], 1)

    def share(n):
        return f"{n:,} ({n / pt:.1%})"

    rows = hit_rows(s) + [
        ["ceiling (unlimited memory)", f"{s['ceiling']:.1%}"],
        ["hit rate / ceiling, last half of requests", f"{s['hit_rate_last_half']:.1%} / {s['ceiling_last_half']:.1%}"],
    ]
    if s.get("hit_rate_last_half_sim") is not None:
        rows.append(["  as kvcache-simulator counts it (hashed blocks)", f"{s['hit_rate_last_half_sim']:.1%}"])
    rows += policy_rows(s) + [
        ["recomputed tokens", share(s["recomputed_tokens"])],
        ["waits for a peer's prefill (request-steps)", f"{s['peer_holds']:,}"],
        ["device -> host", _moved(s, "d2h")],
        ["host -> device", _moved(s, "h2d")],
        ["host -> L3 / L3 -> host", f"{format_bytes(s['l3_put_bytes'])} / {format_bytes(s['l3_get_bytes'])}"],
        ["evicted pages device / host", f"{s['device_evicted_pages']:,} / {s['host_evicted_pages']:,}"],
        ["device evictions dropped / demoted", f"{s['device_dropped_pages']:,} / {s['device_demoted_pages']:,}"],
        ["snapshots offered / kept / provisional", f"{s['snapshots_offered']:,} / {s['snapshots_kept']:,} / "
                                                   f"{s['snapshots_provisional']:,}"],
        ["snapshots dropped (retention) / evicted", f"{s['snapshots_dropped_retention']:,} / {s['snapshots_evicted']:,}"],
        ["pages verified / mismatched", f"{s['verified_pages']:,} / {s['mismatched_pages']:,}"
         if s.get("bytes") != "none" else "- (policy-only run, --bytes none)"],
        ["L3 faults / rejected values", f"{s['l3_errors']:,} / {s['l3_rejected']:,}"],
        ["device / host budget", f"{format_bytes(s['device_bytes'])} / {format_bytes(s['host_bytes'])}"],
    ]
    if s.get("l3_admit", "off") != "off":
        rows.append(["L3 admission: chains / written / already held",
                     f"{s['l3_admit_chains']:,} / {format_bytes(s['l3_admit_bytes'])} / "
                     f"{s['l3_admit_skipped_existing']:,} objects"])
        rows.append(["L3 admission: rate / budget, throttled / dropped",
                     f"{s['l3_admit_gbps']:.3f} / {s['l3_admit_budget_gbps']:g} GB/s, "
                     f"{s['l3_admit_throttled']:,} / {s['l3_admit_dropped']:,} chains"])
    if s.get("l3_planned_pages"):
        rows.append(["L3 pages planned / landed in time", f"{s['l3_planned_pages']:,} / {s['l3_landed_pages']:,} "
                                                          f"({s['prefetch_policy']})"])
    if s.get("ttft_p50_s") is not None:
        rows += [
            ["TTFT p50 / p90 / p99, with cache", _secs(s, "ttft")],
            ["TTFT p50 / p90 / p99, without cache", _secs(s, "ttft_uncached")],
            ["queueing p50 / p90 / p99, with cache", _secs(s, "queue")],
        ]
    if s.get("skipped_records") is not None:
        rows.append(["trace records skipped / not JSON", f"{s['skipped_records']:,} / {s['parse_errors']:,}"])
    mode = "policy-only, no bytes" if s.get("bytes") == "none" else f"verify {s['verify']}"
    rows.append(["virtual time / wall time", f"{s['virtual_s']:,.1f} s / {s['wall_s']} s "
                                             f"({s['requests_per_s']} requests/s, {mode})"])
    print(render_table(["metric", "value"], rows, align="lr", title=title))


def policy_rows(s: dict) -> list[list[str]]:
    """Which order the cache followed (adaptive: its choice at the end, the switches, the
    switches tried in a clone first, the regret against the best candidate per window,
    every candidate's ghost hits)."""
    if s.get("eviction") != "adaptive":
        return [["eviction", str(s.get("eviction"))]]
    looked = max(s.get("policy_looked_up_pages") or 0, 1)
    ghosts = [[f"  ghost hit rate: {k}", f"{v / looked:.1%}"] for k, v in (s.get("ghost_hit_pages") or {}).items()]
    rows = [["eviction adaptive: following / switches / trials",
             f"{s['policy_followed']} / {s['policy_switches']:,} / {s.get('policy_trials', 0):,}"]]
    if ghosts:
        rows += [["  regret (best candidate's ghost hits - followed)", f"{s['policy_regret_pages'] / looked:.2%} of "
                                                                        "looked-up pages"],
                 *ghosts]
        if s.get("hit_tokens"):
            rows.append(["  followed ghosts' hits / the cache's hits",
                         f"{s.get('policy_ghost_hit_tokens', 0) / s['hit_tokens']:.3f}"])
    return rows


def _moved(s: dict, direction: str) -> str:
    """Bytes a direction's copies moved and at what rate (none moved on pools without bytes:
    the bytes they stand for, which the clock charged)."""
    if s.get("bytes") == "none":
        return f"{format_bytes(s[f'{direction}_bytes'])} (nominal: no bytes moved)"
    return f"{format_bytes(s[f'{direction}_bytes'])} at {s[f'{direction}_gbps']} GB/s"


def _secs(s: dict, prefix: str) -> str:
    return " / ".join(f"{s[f'{prefix}_p{q}_s']:.3f}" for q in (50, 90, 99)) + " s"


def write_requests(path: str, report) -> None:
    """One JSON line per request record (a dataclass), in request-id order."""
    import math

    with open(path, "w") as f:
        for r in report.records:
            row = {k: (v if not isinstance(v, float) or math.isfinite(v) else str(v))
                   for k, v in dataclasses.asdict(r).items()}
            f.write(json.dumps(row, allow_nan=False) + "\n")


def write_plot(path: str, report, window: int = 50) -> None:
    """Hit rate per tier over the run (a moving window of requests, in arrival order)."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        raise ConfigError("--plot", path, "needs matplotlib: pip install 'hicache[plot]'") from None
    recs = report.records
    xs: list[int] = []
    series: dict[str, list[float]] = {"device": [], "host": [], "L3": []}
    for i in range(len(recs)):
        win = recs[max(0, i - window + 1): i + 1]
        pt = sum(r.prompt_tokens for r in win) or 1
        xs.append(i)
        series["device"].append(sum(r.device_hit_tokens for r in win) / pt)
        series["host"].append(sum(r.host_hit_tokens for r in win) / pt)
        series["L3"].append(sum(r.l3_hit_tokens for r in win) / pt)
    fig, ax = plt.subplots(figsize=(8, 4))
    ax.stackplot(xs, series["device"], series["host"], series["L3"], labels=["device", "host", "L3"])
    ax.set_xlabel("request (arrival order)")
    ax.set_ylabel(f"hit rate (last {window} requests)")
    ax.set_ylim(0, 1)
    ax.legend(loc="upper left")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
