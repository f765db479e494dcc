"""The summary of a replay: what was reused from where, at what cost, and whether every
byte was right; as a table, as JSON, per request (JSONL) and as a plot."""

from __future__ import annotations

import json
import statistics

from hicache.cli.common import print_json
from hicache.cli.table import render_table
from hicache.errors import ConfigError
from hicache.storage.url import mask_url
from hicache.units import format_bytes


def _ttft(records, layout, cfg, stats) -> dict:
    """Estimated time to first token: recomputed tokens at the configured prefill rate,
    plus the bytes loaded from host (and fetched from L3) at the rates measured here."""
    rate = cfg.prefill_tokens_per_s
    if not rate:
        return {}
    page_bytes = layout.history_bytes_per_page
    h2d = stats["transfer"]["h2d"]["gbps"] * 1e9 or None
    with_cache, without = [], []
    for r in records:
        loaded = (r.host_hit_tokens + r.l3_hit_tokens) // layout.page_tokens * page_bytes
        load_s = loaded / h2d if h2d and loaded else 0.0
        with_cache.append(r.recomputed_tokens / rate + load_s)
        without.append(r.prompt_tokens / rate)
    return {
        "ttft_mean_s_cached": round(statistics.fmean(with_cache), 4),
        "ttft_mean_s_uncached": round(statistics.fmean(without), 4),
        "ttft_p90_s_cached": round(sorted(with_cache)[int(0.9 * (len(with_cache) - 1))], 4),
        "ttft_p90_s_uncached": round(sorted(without)[int(0.9 * (len(without) - 1))], 4),
    }


def build_summary(cache, report, requests, layout, ecfg) -> dict:
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
        "prompt_tokens_last_half": half_prompt,
        "hit_tokens_last_half": sum(r.hit_tokens for r in half),
        "device_hit_tokens": sum(r.device_hit_tokens for r in recs),
        "host_hit_tokens": sum(r.host_hit_tokens for r in recs),
        "l3_hit_tokens": sum(r.l3_hit_tokens for r in recs),
        "recomputed_tokens": sum(r.recomputed_tokens for r in recs),
        "preemptions": report.preemptions,
        "readmission_recomputed_tokens": sum(r.readmission_recomputed_tokens for r in recs),
        "rejected_requests": report.rejected,
        "finished_requests": sum(r.finished for r in recs),
        "d2h_bytes": t["d2h"]["bytes"], "d2h_gbps": round(t["d2h"]["gbps"], 2),
        "h2d_bytes": t["h2d"]["bytes"], "h2d_gbps": round(t["h2d"]["gbps"], 2),
        "l3_put_objects": s["l3_put_objects"], "l3_put_dropped": s["l3_put_dropped"],
        "l3_prefetched_pages": s["l3_prefetched_pages"],
        "l3_get_bytes": int(l3c.get("get_bytes", 0)), "l3_put_bytes": int(l3c.get("put_bytes", 0)),
        "device_evicted_pages": s["device_evicted_pages"] + s["device_demoted_pages"],
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
        "device_bytes": cache.pools.plan.device_bytes,
        "host_bytes": cache.pools.plan.host_bytes,
        "retention_interval": cache.config.tree.retention_interval,
        "storage_url": mask_url(cache.config.storage.url),
        "wall_s": round(report.wall_s, 2),
    }
    out.update(_ttft(recs, layout, ecfg, {"transfer": t}))
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
        ["hit rate, last half of requests", f"{s['hit_rate_last_half']:.1%}"],
        ["recomputed tokens", share(s["recomputed_tokens"])],
        ["device -> host", f"{format_bytes(s['d2h_bytes'])} at {s['d2h_gbps']} GB/s"],
        ["host -> device", f"{format_bytes(s['h2d_bytes'])} at {s['h2d_gbps']} GB/s"],
        ["host -> L3 / L3 -> host", f"{format_bytes(s['l3_put_bytes'])} / {format_bytes(s['l3_get_bytes'])}"],
        ["evicted pages device / host", f"{s['device_evicted_pages']:,} / {s['host_evicted_pages']:,}"],
        ["snapshots offered / kept / provisional", f"{s['snapshots_offered']:,} / {s['snapshots_kept']:,} / "
                                                   f"{s['snapshots_provisional']:,}"],
        ["snapshots dropped (retention) / evicted", f"{s['snapshots_dropped_retention']:,} / {s['snapshots_evicted']:,}"],
        ["pages verified / mismatched", f"{s['verified_pages']:,} / {s['mismatched_pages']:,}"],
        ["L3 faults / rejected values", f"{s['l3_errors']:,} / {s['l3_rejected']:,}"],
        ["device / host budget", f"{format_bytes(s['device_bytes'])} / {format_bytes(s['host_bytes'])}"],
    ]
    if "ttft_mean_s_cached" in s:
        rows.append(["est. TTFT mean, cache / none", f"{s['ttft_mean_s_cached']:.3f} s / {s['ttft_mean_s_uncached']:.3f} s"])
    rows.append(["wall time", f"{s['wall_s']} s"])
    print(render_table(["metric", "value"], rows, align="lr", title=title))


def write_requests(path: str, report) -> None:
    """One JSON line per request record (a dataclass), in arrival order."""
    import dataclasses
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
    xs, series = [], {"device": [], "host": [], "L3": []}
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
