"""Replay speed with every byte checked (``--verify full``, the old content path) against
sampled checks (``sample``, the default) and none (``off``), on the same requests, in one run.

    python bench/replay_verify.py [--reps 2] [--json] -- <hicache replay arguments>

The requests are built (or the trace read) once; each mode replays them on a fresh cache,
modes interleaved ``--reps`` times, and the best requests/s of each is kept. No page may
mismatch (exit 1 otherwise). Hit tokens are printed per mode: the contents do not steer
the cache, but its copies and L3 puts complete in wall time, so a run that is faster in
wall time can see a few backups land at other points of the virtual clock (``hits_agree``
says whether they were equal). ``speedup`` is a mode's requests/s over ``full``'s.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from hicache.cli.main import build_parser  # noqa: E402
from hicache.cli.replay_cmd import (budget_overrides, engine_config, load_cache_config, load_requests,  # noqa: E402
                                    replay_once)
from hicache.cli.table import render_table  # noqa: E402
from hicache.errors import HiCacheError  # noqa: E402

MODES = ("full", "sample", "off")
PROG = "bench/replay_verify.py"


def measure(replay_args: list[str], reps: int) -> dict:
    args = build_parser().parse_args(["replay", *replay_args, "--quiet"])
    work = load_requests(args)
    best: dict[str, dict] = {}
    for _ in range(reps):
        for mode in MODES:
            args.verify = mode
            path, layout, cfg = load_cache_config(args, **budget_overrides(args, args.device_gib, args.host_gib))
            summary, _ = replay_once(layout, cfg, engine_config(args, path, work, layout), work, None)
            if mode not in best or summary["requests_per_s"] > best[mode]["requests_per_s"]:
                best[mode] = summary
    base = best["full"]["requests_per_s"]
    rows = {m: {"requests_per_s": s["requests_per_s"], "wall_s": s["wall_s"], "speedup": round(s["requests_per_s"] / base, 2),
                "verified_pages": s["verified_pages"], "mismatched_pages": s["mismatched_pages"],
                "hit_tokens": s["hit_tokens"]} for m, s in best.items()}
    return {"replay_args": replay_args, "workload": work.name, "requests": len(work.requests), "reps": reps,
            "modes": rows, "hits_agree": len({r["hit_tokens"] for r in rows.values()}) == 1,
            "mismatched_pages": sum(r["mismatched_pages"] for r in rows.values())}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog=PROG, description=__doc__.split("\n\n")[0])
    p.add_argument("--reps", type=int, default=2, help="rounds of the three modes (best of, default 2)")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.add_argument("replay_args", nargs=argparse.REMAINDER, help="-- then hicache replay arguments")
    args = p.parse_args(argv)
    rest = [a for a in args.replay_args if a != "--"]
    try:
        out = measure(rest, max(1, args.reps))
    except HiCacheError as exc:
        print(f"{PROG}: error: {exc}", file=sys.stderr)
        return 2
    if args.json:
        print(json.dumps(out, indent=2))
    else:
        rows = [[m, r["requests_per_s"], r["wall_s"], f"{r['speedup']:.2f}x", r["verified_pages"],
                 r["mismatched_pages"], r["hit_tokens"]] for m, r in out["modes"].items()]
        print(render_table(["verify", "requests/s", "wall s", "vs full", "pages verified", "mismatched", "hit tokens"],
                           rows, title=f"{PROG}: {out['workload']}, {out['requests']} requests, best of {out['reps']}"))
    return 0 if out["mismatched_pages"] == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
