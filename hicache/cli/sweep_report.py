"""What ``hicache sweep`` prints and draws: one policy's points (the table and plot of a
plain sweep), or several policies' side by side (``--policies``), each beside
kvcache-simulator's LRU and optimal at the same bytes and with the share of the
LRU -> optimal gap it closes (:func:`gap_closed`).

The figure compared for a policy is its hit rate over the last half of the requests: the
simulator's own measure (``hit_rate_last_half_sim``, over the prompt tokens a trace hashes)
when the requests came from a trace, else ``hit_rate_last_half`` (every prompt token; a
built workload is written as a trace that hashes them all) -- :func:`measured`. When the
engine rejected requests (longer than the device: no engine runs them, under any policy),
the comparison is over the requests it served: ours is ``hit_rate_last_half_served`` and
the simulator's ``sim_lru_served`` / ``sim_optimal_served``, its run on the trace of those
requests; the figures over every request are in the JSON beside them. Our figures are
rounded to 4 places (``build_summary``), so the simulator's are rounded the same before
they are compared with ours or a gap is taken.
"""

from __future__ import annotations

import math
from pathlib import Path

from hicache.cli.table import render_table
from hicache.errors import ConfigError

PLACES = 4   # build_summary rounds the hit rates to 4 places
# The fields of one replay that each policy's entry in a --policies point carries.
POLICY_KEYS = ("hit_rate", "hit_rate_last_half", "hit_rate_last_half_sim", "hit_rate_last_half_served", "eviction",
               "adaptive_candidates", "adaptive_floor", "adaptive_record", "adaptive_z",
               "adaptive_trial", "adaptive_dead_outputs", "policy_followed", "policy_switches", "policy_trials",
               "policy_regret_pages", "ghost_hit_pages", "rejected_requests",
               "device_hit_tokens", "host_hit_tokens", "l3_hit_tokens", "ttft_p50_s", "ttft_p90_s", "ttft_p99_s",
               "queue_p90_s", "preemptions", "verified_pages", "mismatched_pages", "wall_s")
# The simulator's fields of a point (None where it did not run).
SIM_KEYS = ("sim_gib", "sim_blocks", "sim_status", "sim_lru", "sim_optimal", "ref_block_lru", "ref_hybrid_lru",
            "sim_status_served", "sim_lru_served", "sim_optimal_served")


def gap_closed(ours: float | None, sim_lru: float | None, sim_optimal: float | None) -> float | None:
    """The share of the simulator's LRU -> optimal gap that ``ours`` closes:
    ``(ours - sim_lru) / (sim_optimal - sim_lru)``. 0 is LRU, 1 optimal; negative below
    LRU, over 1 above the simulator's optimal. None without a figure or without a gap
    (optimal not above LRU)."""
    if ours is None or sim_lru is None or sim_optimal is None:
        return None
    gap = sim_optimal - sim_lru
    if not gap > 0:
        return None
    return (ours - sim_lru) / gap


def served(sim: dict) -> bool:
    """Did the simulator run on the served requests (some were rejected)?"""
    return sim.get("sim_status_served") is not None


def measured(summary: dict, sim: dict | None = None) -> tuple[str, float]:
    """(the key, the figure) compared for one replay: over the served requests when some
    were rejected, else the simulator's own measure on a trace, else the last half's hit
    rate (module docstring)."""
    if sim is not None and served(sim):
        return "hit_rate_last_half_served", summary["hit_rate_last_half_served"]
    if summary.get("hit_rate_last_half_sim") is not None:
        return "hit_rate_last_half_sim", summary["hit_rate_last_half_sim"]
    return "hit_rate_last_half", summary["hit_rate_last_half"]


def compared_sim(sim: dict) -> tuple[float | None, float | None]:
    """The simulator's (LRU, optimal) to set beside :func:`measured`, rounded as ours."""
    if served(sim):
        return _rounded(sim.get("sim_lru_served")), _rounded(sim.get("sim_optimal_served"))
    return _rounded(sim.get("sim_lru")), _rounded(sim.get("sim_optimal"))


def _rounded(v: float | None) -> float | None:
    return None if v is None else round(v, PLACES)


def policy_entry(summary: dict, sim: dict) -> dict:
    """One policy at one budget: its replay's figures, the one compared (``measured``),
    the gap it closes and whether it is at least the simulator's LRU (None without it)."""
    key, ours = measured(summary, sim)
    lru, opt = compared_sim(sim)
    gap = gap_closed(ours, lru, opt)
    out = {k: summary[k] for k in POLICY_KEYS if k in summary}
    out.update(measure=key, measured=ours, gap_closed=None if gap is None else round(gap, PLACES),
               at_least_sim_lru=None if lru is None else ours >= lru)
    return out


def policy_points(policies: list[str], by_policy: dict[str, list[dict]], hosts: list[float], device_gib: float,
                  sims: list[dict] | None) -> list[dict]:
    """One point per host budget: its budget fields, the simulator's (None where it did not
    run) and ``policies``: name -> :func:`policy_entry`."""
    points = []
    for i, host in enumerate(hosts):
        first = by_policy[policies[0]][i]
        sim = sims[i] if sims is not None else {}
        point = {"device_gib": device_gib, "host_gib": host, "device_pages": first["device_pages"],
                 "host_pages": first["host_pages"]}
        point.update({k: sim.get(k) for k in SIM_KEYS})
        point["policies"] = {p: policy_entry(by_policy[p][i], sim) for p in policies}
        points.append(point)
    return points


def _pct(v) -> str | None:
    return None if v is None else f"{100 * v:.2f}%"


def _title(out: dict, pts: list[dict]) -> str:
    return (f"hicache sweep: {Path(out['config']).stem}, {out['workload']}, {out['requests']} requests, "
            f"device {pts[0]['device_gib']:g} GiB, {out['write_policy']}"
            + (", policy-only (--bytes none)" if out.get("bytes") == "none" else ""))


def _footer(out: dict, *, hybrid: bool) -> None:
    print(f"ceiling (unlimited memory): {out['ceiling']:.2%} of all prompt tokens, "
          f"{out['ceiling_last_half']:.2%} of the last half")
    if out.get("sim_model"):
        print(f"kvcache-simulator {out['sim_version']}: model {out['sim_model']}, kv {out['sim_kv_precision']}, "
              f"indexer {out['sim_indexer_precision']}, last half measured, its ceiling {out['sim_ceiling']:.2%}; "
              f"rerun one point with: kvcache-simulator run --trace TRACE --model {out['sim_model']} "
              f"--budgets-gib SIM_GIB --policies lru,optimal")
        if hybrid:
            print("hybrid LRU: the simulator's LRU at the same blocks, a hit counted only up to a boundary where a "
                  f"snapshot is offered (request ends, forks, every {out['ref_chunk_blocks']} blocks of prefill; "
                  "snapshots free): what the resume rule costs LRU (hicache ref)")
    else:
        print("kvcache-simulator not run (not installed, or --no-sim)")


def print_table(out: dict) -> None:
    """A plain sweep: one row per host budget."""
    pts = out["points"]
    rows = []
    for p in pts:
        pt = p["device_hit_tokens"] + p["host_hit_tokens"] + p["l3_hit_tokens"]
        _, ours = measured(p, p)
        lru, opt = compared_sim(p)
        status = p.get("sim_status_served" if served(p) else "sim_status")
        rows.append([f"{p['host_gib']:g}", f"{p['device_pages']:,} + {p['host_pages']:,}", _pct(p["hit_rate"]),
                     _pct(p["hit_rate_last_half"]), _pct(ours), _pct(lru) or status, _pct(opt) or status,
                     _pct(p.get("ref_hybrid_lru")),
                     None if p.get("sim_gib") is None else f"{p['sim_gib']:.4f}",
                     f"{p['device_hit_tokens'] / max(pt, 1):.0%} / {p['host_hit_tokens'] / max(pt, 1):.0%} / "
                     f"{p['l3_hit_tokens'] / max(pt, 1):.0%}",
                     None if p["ttft_p50_s"] is None else f"{p['ttft_p50_s']:.3f}", p["mismatched_pages"]])
    print(render_table(["host GiB", "pages dev + host", "hit rate", "last half", "compared", "sim LRU",
                        "sim optimal", "hybrid LRU", "sim GiB", "dev / host / L3", "TTFT p50 s", "mismatched"], rows,
                       title=_title(out, pts)))
    print()
    print(f"compared (with sim LRU and optimal): {MEASURE_NOTES[measured(pts[0], pts[0])[0]]}")
    _served_note(out)
    _footer(out, hybrid=True)


def _served_note(out: dict) -> None:
    if out.get("rejected_requests"):
        print(f"{out['rejected_requests']:,} requests ({out['rejected_prompt_tokens']:,} prompt tokens) are longer "
              "than the device and were rejected, under every policy: the comparison is over the requests served, "
              "the simulator run on their trace (its figures on every request: sim_lru / sim_optimal in --json)")


MEASURE_NOTES = {
    "hit_rate_last_half_sim": "hit_rate_last_half_sim, kvcache-simulator's own measure on the trace: the prompt "
                              "tokens its blocks hash",
    "hit_rate_last_half": "hit_rate_last_half: every prompt token (the workload's trace hashes them all)",
    "hit_rate_last_half_served": "hit_rate_last_half_served: the last half of the requests the engine served "
                                 "(kvcache-simulator's measure on a trace)",
}


def print_policies_table(out: dict) -> None:
    """``--policies``: one row per host budget, the policies side by side."""
    pts, policies = out["points"], out["policies"]
    sim = any(p["sim_lru"] is not None for p in pts)
    rows = []
    for p in pts:
        entries = [p["policies"][name] for name in policies]
        hits = []
        for e in entries:
            mark = {None: "", True: " >=", False: " <"}[e["at_least_sim_lru"]]
            hits.append(f"{_pct(e['measured'])}{mark}")
        lru, opt = compared_sim(p)
        status = p.get("sim_status_served" if served(p) else "sim_status")
        row = [f"{p['host_gib']:g}", f"{p['device_pages']:,} + {p['host_pages']:,}", *hits,
               _pct(lru) or status, _pct(opt) or status,
               *[None if e["gap_closed"] is None else f"{100 * e['gap_closed']:.1f}%" for e in entries]]
        if "adaptive" in policies:
            a = p["policies"]["adaptive"]
            row.append(f"{a['policy_followed']} ({a['policy_switches']})")
        row.append(sum(e["mismatched_pages"] for e in entries))
        rows.append(row)
    headers = ["host GiB", "pages dev + host", *policies, "sim LRU", "sim optimal", *[f"gap {n}" for n in policies]]
    if "adaptive" in policies:
        headers.append("adaptive follows (switches)")
    headers.append("mismatched")
    print(render_table(headers, rows, title=_title(out, pts) + "; hit rate, last half of requests"))
    print()
    print(f"policy columns: {MEASURE_NOTES[out['measure']]}")
    _served_note(out)
    if sim:
        print(">= / <: at or above / below the simulator's LRU at the same bytes (both at the 2 decimals of a "
              "percentage shown)")
        print("gap P: the share of the simulator's LRU -> optimal gap that P closes, (P - LRU) / (optimal - LRU): "
              "0% is LRU, 100% optimal, negative below LRU, over 100% above its optimal (our cache also keeps the "
              "pages a request decodes; the simulator caches prompt blocks only); - where there is no gap or no "
              "figure")
    if "adaptive" in policies:
        print("adaptive follows: the candidate it followed at the end of the run, and its switches over the run")
    print("mismatched: pages read back wrong, all policies together")
    _footer(out, hybrid=False)


def _pyplot(path: str):
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        raise ConfigError("--plot", path, "needs matplotlib: pip install 'hicache[plot]'") from None
    return plt


def write_plot(path: str, out: dict) -> None:
    """A plain sweep: hit rate vs host budget, ours beside the simulator's."""
    plt = _pyplot(path)
    pts = out["points"]
    xs = [p["host_gib"] for p in pts]
    fig, ax = plt.subplots(figsize=(7, 4))
    ax.plot(xs, [measured(p, p)[1] for p in pts], "o-", label="hicache (last half)")
    sims = [compared_sim(p) for p in pts]
    for i, label in ((0, "kvcache-simulator LRU"), (1, "kvcache-simulator optimal")):
        if any(v[i] is not None for v in sims):
            ax.plot(xs, [v[i] for v in sims], "s--", label=label)
    if any(p.get("ref_hybrid_lru") is not None for p in pts) and not served(pts[0]):
        ax.plot(xs, [p.get("ref_hybrid_lru") for p in pts], "s--", label="LRU counted at snapshots (hybrid)")
    ax.axhline(out["ceiling_last_half"], color="grey", linestyle=":", label="ceiling (unlimited memory)")
    ax.set_xlabel(f"host budget, GiB (device {pts[0]['device_gib']:g} GiB)")
    ax.set_ylabel("hit rate, last half of requests")
    ax.set_ylim(0, 1)
    ax.legend(loc="lower right")
    ax.set_title(f"{out['workload']}, {out['requests']} requests")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


MARKERS = ("o", "D", "v", "P", "X", "*", "h")


def write_policies_plot(path: str, out: dict) -> None:
    """``--policies``: hit rate vs host budget, one line per policy, the simulator's LRU and
    optimal dashed, the ceilings dotted; the y axis spans the figures, not 0..1."""
    plt = _pyplot(path)
    pts, policies = out["points"], out["policies"]
    xs = [p["host_gib"] for p in pts]
    fig, ax = plt.subplots(figsize=(10, 5))
    shown: list[float] = []
    for i, name in enumerate(policies):   # a marker each: policies with the same figures overlap
        ys = [p["policies"][name]["measured"] for p in pts]
        shown += ys
        ax.plot(xs, ys, "-", marker=MARKERS[i % len(MARKERS)], label=name, linewidth=1.8, markersize=7 - i % 3)
    for i, label, style in ((0, "kvcache-simulator LRU", "s--"), (1, "kvcache-simulator optimal", "^--")):
        ys = [compared_sim(p)[i] for p in pts]
        key = ("sim_lru", "sim_optimal")[i]
        if any(y is not None for y in ys):
            shown += [y for y in ys if y is not None]
            ax.plot(xs, [math.nan if y is None else y for y in ys], style, color="black" if key == "sim_lru"
                    else "dimgrey", label=label, linewidth=1.4)
    # our ceiling counts every prompt token: on the simulator's measure only its own applies
    sim_measure, sim_ceiling = out["measure"] != "hit_rate_last_half", out.get("sim_ceiling")
    ceilings = []
    if not sim_measure or sim_ceiling is None:
        ceilings.append((out["ceiling_last_half"], "ceiling: unlimited memory"
                         + (" (every prompt token)" if sim_measure else ""), "grey"))
    if sim_ceiling is not None:
        ceilings.append((sim_ceiling, "ceiling: kvcache-simulator's (prompt blocks only)", "darkgrey"))
    for y, label, color in ceilings:
        shown.append(y)
        ax.axhline(y, color=color, linestyle=":", linewidth=1.4, label=label)
    low, high = min(shown), max(shown)
    ax.set_ylim(max(0.0, math.floor((low - 0.02) * 20) / 20), min(1.0, high + 0.02))
    if len(xs) > 1 and max(xs) / min(xs) >= 4:
        ax.set_xscale("log", base=2)
    ax.set_xticks(xs)
    ax.set_xticklabels([f"{x:g}" for x in xs])
    ax.minorticks_off()
    ax.grid(True, alpha=0.3)
    ax.set_xlabel(f"host budget, GiB (device {pts[0]['device_gib']:g} GiB)")
    ax.set_ylabel("hit rate, last half of requests" + (" (simulator's measure)"
                                                        if out["measure"] != "hit_rate_last_half" else ""))
    ax.set_title(f"{out['workload']}, {out['requests']} requests: hit rate by eviction policy\n"
                 f"{Path(out['config']).stem}, device {pts[0]['device_gib']:g} GiB, {out['write_policy']}"
                 + (", policy-only (--bytes none)" if out.get("bytes") == "none" else ""), fontsize=11)
    ax.legend(loc="upper left", bbox_to_anchor=(1.02, 1.0), fontsize="small")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
