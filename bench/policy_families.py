"""Every trace family, fresh seeds, every policy beside kvcache-simulator's LRU and optimal.

    python bench/policy_families.py --seeds 102,103 --out DIR [--families F,...]
        [--config deepseek-v4-flash] [--device-gib 0.25] [--host-gib 0.25,0.5,1]
        [--policies lru,adaptive] [--bytes none|real] [--jobs 2] [--report-only] [--json] [--plot F.png]
    python bench/policy_families.py --shapes --seeds 2101 --out DIR [--families S,...] ...

For each family and seed it writes the trace (``python -m hicache.engine.workloads ...
--write-trace``, kvcache-simulator's format) and runs ``hicache sweep --trace`` on it with
the given policies, keeping both under ``DIR`` (a sweep whose JSON is already there is not
run again: ``--report-only`` only reads them). The table has one row per (family, seed,
host budget): each policy's last-half hit rate on the simulator's measure, the simulator's
LRU and optimal at the same bytes (over the served requests when some were too long for
the device), the share of the LRU -> optimal gap the *last* policy closes (n/a where that
gap is under one point), the candidate it
followed at the end, and ``floor``: ``ok`` when the last policy is at least the simulator's
LRU and every other policy named (``lru``: hicache's own) at that budget. The summary line
counts the points below either floor. Nothing is asserted: a family below its floor is
reported, not hidden.

Families (``N``: what the generator counts; the dev seeds were 0 and 1):

    sharegpt-nosys          400 conversations, conversation ids in the trace
    sharegpt-nosys-noconv   the same requests, no conversation ids (block hashes only)
    reasoning, agentic, rag, mix, mix-poisson    100 units each
    production              3,000 requests, 512-token blocks

``--shapes`` runs ``SHAPES`` instead: 22 sizes and shapes no rule was tuned on (other unit
counts, 16- to 128-token blocks, every family without conversation ids, larger devices),
each at its own device and host budgets; the table then has a device column.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
FAMILIES: dict[str, list[str]] = {
    "sharegpt-nosys": ["sharegpt-nosys", "--conversations", "400", "--block-size", "256"],
    "sharegpt-nosys-noconv": ["sharegpt-nosys", "--conversations", "400", "--block-size", "256",
                              "--no-conversation-ids"],
    "reasoning": ["reasoning", "--conversations", "100", "--block-size", "256"],
    "agentic": ["agentic", "--conversations", "100", "--block-size", "256"],
    "rag": ["rag", "--conversations", "100", "--block-size", "256"],
    "mix": ["mix", "--conversations", "100", "--block-size", "256"],
    "mix-poisson": ["mix-poisson", "--conversations", "100", "--block-size", "256"],
    "production": ["production", "--requests", "3000", "--block-size", "512"],
}


# --shapes: sizes and shapes no policy rule was tuned on -- unit counts the families above do
# not use, block sizes from 16 to 512 tokens, traces without conversation ids for every
# family that has them, larger devices -- each at its own device and host budgets (GiB).
SHAPES: dict[str, tuple[list[str], str, str]] = {
    "sharegpt-nosys-noconv-b16": (["sharegpt-nosys", "--conversations", "150", "--block-size", "16",
                                   "--no-conversation-ids"], "0.25", "0.5"),
    "sharegpt-nosys-150": (["sharegpt-nosys", "--conversations", "150", "--block-size", "256"], "0.25", "0.25"),
    "sharegpt-sys-noconv": (["sharegpt", "--conversations", "200", "--block-size", "256", "--no-conversation-ids"],
                            "0.25", "0.25,0.5"),
    "reasoning-40": (["reasoning", "--conversations", "40", "--block-size", "256"], "0.25", "0.25"),
    "reasoning-250": (["reasoning", "--conversations", "250", "--block-size", "256"], "0.25", "1"),
    "reasoning-noconv": (["reasoning", "--conversations", "100", "--block-size", "256", "--no-conversation-ids"],
                         "0.25", "0.5"),
    "agentic-50": (["agentic", "--conversations", "50", "--block-size", "256"], "0.25", "0.25"),
    "agentic-250": (["agentic", "--conversations", "250", "--block-size", "256"], "0.25", "0.5"),
    "agentic-250-d0.5": (["agentic", "--conversations", "250", "--block-size", "256"], "0.5", "1"),
    "agentic-noconv": (["agentic", "--conversations", "100", "--block-size", "256", "--no-conversation-ids"],
                       "0.25", "0.25,0.5,1"),
    "rag-50": (["rag", "--conversations", "50", "--block-size", "256"], "0.25", "1"),
    "rag-250": (["rag", "--conversations", "250", "--block-size", "256"], "0.25", "0.5"),
    "mix-250": (["mix", "--conversations", "250", "--block-size", "256"], "0.25", "0.5"),
    "mix-250-d0.5": (["mix", "--conversations", "250", "--block-size", "256"], "0.5", "2"),
    "mix-noconv": (["mix", "--conversations", "100", "--block-size", "256", "--no-conversation-ids"], "0.25", "0.5"),
    "mix-poisson-50": (["mix-poisson", "--conversations", "50", "--block-size", "256"], "0.25", "1"),
    "mix-poisson-250": (["mix-poisson", "--conversations", "250", "--block-size", "256"], "0.25", "0.25"),
    "mix-poisson-noconv": (["mix-poisson", "--conversations", "100", "--block-size", "256",
                            "--no-conversation-ids"], "0.25", "0.5"),
    "production-b64": (["production", "--requests", "3000", "--block-size", "64"], "0.25", "0.5"),
    "production-b128": (["production", "--requests", "4000", "--block-size", "128"], "0.25", "0.25"),
    "production-6k-d0.5": (["production", "--requests", "6000", "--block-size", "512"], "0.5", "2"),
    "multi-turn-noconv": (["multi-turn", "--conversations", "150", "--block-size", "256", "--no-conversation-ids"],
                          "0.25", "0.5"),
}


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="bench/policy_families.py", description=__doc__.split("\n")[0])
    p.add_argument("--seeds", default="100,101")
    p.add_argument("--families", help=f"default: every family ({','.join(FAMILIES)}); with --shapes, every shape")
    p.add_argument("--shapes", action="store_true",
                   help="run the SHAPES table instead (each at its own device and host budgets)")
    p.add_argument("--out", required=True, help="directory for the traces and the sweeps' JSON")
    p.add_argument("--config", default="deepseek-v4-flash")
    p.add_argument("--device-gib", default="0.25")
    p.add_argument("--host-gib", default="0.25,0.5,1")
    p.add_argument("--policies", default="lru,adaptive")
    p.add_argument("--bytes", choices=("none", "real"), default="none")
    p.add_argument("--jobs", type=int, default=2)
    p.add_argument("--report-only", action="store_true", help="only read sweeps already in --out")
    p.add_argument("--json", action="store_true")
    p.add_argument("--plot", metavar="FILE.png", help="one panel per family: every policy and the simulator's "
                                                       "LRU and optimal against the host budget, a line style per seed")
    args = p.parse_args(argv)
    table = SHAPES if args.shapes else FAMILIES
    if args.families is None:
        args.families = ",".join(table)
    unknown = [f for f in args.families.split(",") if f not in table]
    if unknown:
        kind = "shape" if args.shapes else "family"
        p.error(f"--families: unknown {kind} {unknown[0]!r} (known: {', '.join(table)})")
    try:
        args.seed_list = [int(s) for s in args.seeds.split(",")]
    except ValueError:
        p.error(f"--seeds: not a comma-separated list of integers: {args.seeds!r}")
    return args


def run_one(args: argparse.Namespace, out: Path, family: str, seed: int) -> Path | None:
    tag = f"{args.config}-{family}-s{seed}"
    trace = out / f"{family}-s{seed}.jsonl"
    result = out / f"{tag}.json"
    if result.exists() or args.report_only:
        return result if result.exists() else None
    py = [sys.executable, "-m"]
    if not trace.exists():
        spec = SHAPES[family][0] if args.shapes else FAMILIES[family]
        gen = py + ["hicache.engine.workloads", *spec, "--seed", str(seed), "--write-trace", str(trace)]
        subprocess.run(gen, check=True, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    device, host = SHAPES[family][1:] if args.shapes else (args.device_gib, args.host_gib)
    sweep = py + ["hicache.cli.main", "sweep", "--config", args.config, "--trace", str(trace),
                  "--device-gib", device, "--host-gib", host, "--bytes", args.bytes,
                  "--jobs", str(args.jobs), "--policies", args.policies, "--json", "--quiet"]
    start = time.monotonic()
    done = subprocess.run(sweep, cwd=ROOT, capture_output=True, text=True)
    if done.returncode != 0:
        print(f"{tag}: sweep failed (exit {done.returncode}): {done.stderr.strip()[-300:]}", file=sys.stderr)
        return None
    data = json.loads(done.stdout)
    data["bench_wall_s"] = round(time.monotonic() - start, 1)
    result.write_text(json.dumps(data, indent=1))
    print(f"{tag}: {data['bench_wall_s']:.0f} s", file=sys.stderr, flush=True)
    return result


def rows_of(family: str, seed: int, data: dict, policies: list[str]) -> list[dict]:
    rows = []
    for p in data["points"]:
        served = p.get("sim_status_served") is not None
        lru = p["sim_lru_served"] if served else p["sim_lru"]
        opt = p["sim_optimal_served"] if served else p["sim_optimal"]
        pol = {name: p["policies"][name] for name in policies}
        last = pol[policies[-1]]
        ours = {name: v["measured"] for name, v in pol.items()}
        floor_sim = lru is None or ours[policies[-1]] >= round(lru, 4)
        floor_own = all(ours[policies[-1]] >= v for v in ours.values())
        # a gap under one point is not a gap to close (the share would only amplify noise)
        gap = None if lru is None or opt is None or opt - lru < 0.01 else (ours[policies[-1]] - lru) / (opt - lru)
        rows.append({"family": family, "seed": seed, "device_gib": p["device_gib"], "host_gib": p["host_gib"],
                     "rejected": data.get("rejected_requests", 0),
                     **{f"{n}": ours[n] for n in policies}, "sim_lru": lru, "sim_optimal": opt, "served_only": served,
                     "gap_closed": gap, "followed": last.get("policy_followed"), "switches": last.get("policy_switches"),
                     "below_sim_lru": not floor_sim, "below_own": not floor_own, "wall_s": last.get("wall_s"),
                     # every request counted (a rejected one a miss) against the simulator on the whole trace
                     "all_requests": last.get("hit_rate_last_half_sim"), "sim_lru_all": p["sim_lru"],
                     "rejected_prompt_tokens": data.get("rejected_prompt_tokens", 0)})
    return rows


def plot(rows: list[dict], policies: list[str], path: str) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    families = list(dict.fromkeys(r["family"] for r in rows))
    seeds = list(dict.fromkeys(r["seed"] for r in rows))
    cols = min(4, len(families))
    fig, axes = plt.subplots((len(families) + cols - 1) // cols, cols, figsize=(4 * cols, 3.8 * ((len(families) + cols - 1) // cols)),
                             squeeze=False)
    lines = [*((n, n if n != "lru" else "hicache lru") for n in policies), ("sim_lru", "sim LRU"), ("sim_optimal", "sim optimal")]
    for ax, family in zip(axes.flat, families):
        for seed, style in zip(seeds, ("-", "--", ":", "-.")):
            rr = sorted((r for r in rows if r["family"] == family and r["seed"] == seed), key=lambda r: r["host_gib"])
            for i, (key, label) in enumerate(lines):
                ys = [None if r[key] is None else 100 * r[key] for r in rr]
                ax.plot([r["host_gib"] for r in rr], ys, style, color=f"C{i}", marker="o", ms=3, label=f"{label} s{seed}")
        ax.set_title(family)
        ax.set_xscale("log", base=2)
        hosts = sorted({r["host_gib"] for r in rows if r["family"] == family})
        ax.set_xticks(hosts)
        ax.set_xticklabels([f"{h:g}" for h in hosts])
        ax.set_xlabel("host GiB")
        ax.set_ylabel("last-half hit rate %")
        ax.grid(alpha=0.3)
    for ax in list(axes.flat)[len(families):]:
        ax.set_visible(False)
    axes.flat[0].legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=90)


def pct(v: float | None) -> str:
    return "n/a" if v is None else f"{100 * v:.1f}"


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    policies = args.policies.split(",")
    rows: list[dict] = []
    for seed in args.seed_list:
        for family in args.families.split(","):
            path = run_one(args, out, family, seed)
            if path is None:
                continue
            try:
                rows += rows_of(family, seed, json.loads(path.read_text()), policies)
            except (ValueError, KeyError) as e:
                print(f"{path}: not a finished sweep with policies {','.join(policies)} ({e!r}); skipped",
                      file=sys.stderr)
    below = [r for r in rows if r["below_sim_lru"] or r["below_own"]]
    if args.plot and rows:
        plot(rows, policies, args.plot)
    if args.json:
        print(json.dumps({"config": args.config, "policies": policies, "rows": rows, "points": len(rows),
                          "below_floor": len(below)}, indent=1))
        return 0
    device_col = ["device GiB"] if args.shapes else []
    head = ["shape" if args.shapes else "family", "seed", *device_col, "host GiB", *policies, "sim LRU", "optimal",
            "gap closed", "followed", "floor"]
    print("| " + " | ".join(head) + " |")
    print("|" + "---|" * len(head))
    for r in rows:
        floor = "ok" if not (r["below_sim_lru"] or r["below_own"]) else \
            ("below sim LRU" if r["below_sim_lru"] else "below own")
        star = "*" if r["served_only"] else ""
        gap = "n/a" if r["gap_closed"] is None else f"{100 * r['gap_closed']:.0f}%"
        cells = [r["family"], str(r["seed"]), *([f"{r['device_gib']:g}"] if device_col else []), f"{r['host_gib']:g}",
                 *(pct(r[n]) for n in policies),
                 pct(r["sim_lru"]) + star, pct(r["sim_optimal"]) + star, gap, f"{r['followed']}", floor]
        print("| " + " | ".join(cells) + " |")
    served = [r for r in rows if r["served_only"]]
    if served:
        print(f"\n* some requests were too long for the device; the simulator then also ran on the served "
              f"requests, and the row compares over those. Counting every request (a rejected one a miss) "
              f"against the simulator on the whole trace, {policies[-1]} / sim LRU:")
        for r in served:
            print(f"  {r['family']} s{r['seed']} host {r['host_gib']:g}: {pct(r['all_requests'])} / "
                  f"{pct(r['sim_lru_all'])} ({r['rejected']} requests rejected)")
    print(f"\n{len(rows)} points, {len(below)} below a floor (sim LRU or {', '.join(policies[:-1])})"
          )
    return 0


if __name__ == "__main__":
    sys.exit(main())
