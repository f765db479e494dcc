"""A fleet of engines on a 3-node Redis Cluster (issue 26 "Must show"), with a node killed
midway if asked.

Starts its own 3-node cluster on loopback ports (tests/redis_server.py; stopped by PID at
the end) unless ``--url`` names a store, then runs ``hicache fleet`` for each engine count
and prints per run: the fleet's hit rate, the same fleet without L3, one engine holding the
summed budgets, the points between them, mean TTFT with and without the store, and
mismatched pages. ``--kill-after S`` kills one cluster node S wall seconds into each run
(baselines off): every engine must finish with 0 mismatched pages.

    python bench/fleet_cluster.py --engines 2 4 --workload sharegpt --conversations 60
    python bench/fleet_cluster.py --engines 4 --kill-after 20
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import threading
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def fleet(url: str, engines: int, args: argparse.Namespace, baselines: bool) -> dict:
    cmd = [sys.executable, "-m", "hicache.cli.main", "fleet", "--engines", str(engines), "--config", args.config,
           "--workload", args.workload, "--conversations", str(args.conversations), "--seed", str(args.seed),
           "--routing", args.routing, "--storage", url, "--json", "--quiet", *args.extra]
    if not baselines:
        cmd.append("--no-baselines")
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    out = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=3600)
    if out.returncode not in (0, 1):
        raise SystemExit(f"fleet failed ({out.returncode}): {out.stderr.strip()[-600:]}")
    return json.loads(out.stdout)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--engines", type=int, nargs="+", default=[2, 4])
    ap.add_argument("--config", default="configs/deepseek-v4-flash.yaml")
    ap.add_argument("--workload", default="sharegpt")
    ap.add_argument("--conversations", type=int, default=60)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--routing", default="round-robin")
    ap.add_argument("--url", help="a store to use instead of a fresh 3-node cluster")
    ap.add_argument("--kill-after", type=float, help="kill one cluster node this many seconds into each run")
    ap.add_argument("--extra", nargs=argparse.REMAINDER, default=[], help="more hicache fleet flags")
    args = ap.parse_args()
    cluster = None
    if args.url is None:
        from tests.redis_server import RedisCluster

        cluster = RedisCluster(3)
    url = args.url or cluster.url
    try:
        for n in args.engines:
            timer = None
            if args.kill_after is not None and cluster is not None:
                victim = cluster.nodes[0]
                timer = threading.Timer(args.kill_after, victim.kill)
                timer.start()
            out = fleet(url, n, args, baselines=args.kill_after is None)
            if timer is not None:
                timer.cancel()
                cluster.nodes[0].start()
            f = out["fleet"]["total"]
            row = {"engines": n, "routing": args.routing, "fleet_hit_rate": f["hit_rate"],
                   "fleet_l3_share": round(f["l3_hit_tokens"] / max(f["prompt_tokens"], 1), 4),
                   "fleet_ttft_mean_s": f["ttft_mean_s"], "mismatched": f["mismatched_pages"],
                   "l3_errors": f["l3_errors"],
                   "finished_per_engine": [e["requests"] for e in out["fleet"]["per_engine"]]}
            if "single" in out:
                s, nl = out["single"]["total"], out["fleet_no_l3"]["total"]
                row.update({"no_l3_hit_rate": nl["hit_rate"], "single_hit_rate": s["hit_rate"],
                            "points_below_single": round(100 * (s["hit_rate"] - f["hit_rate"]), 1),
                            "no_l3_ttft_mean_s": nl["ttft_mean_s"], "single_ttft_mean_s": s["ttft_mean_s"],
                            "mismatched": row["mismatched"] + nl["mismatched_pages"] + s["mismatched_pages"]})
            print(json.dumps(row), flush=True)
    finally:
        if cluster is not None:
            cluster.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
