"""A policy-only replay (``--bytes none``) against the byte replay of the same requests, in
one run: wall and CPU time of each, their ratio, and whether every decision agreed.

    python bench/policy_only.py [--reps 1] [--modes real,none] [--json] -- <hicache replay arguments>

The requests are built (or the trace read) once; each mode replays them on a fresh cache,
modes interleaved ``--reps`` times, and each mode's fastest round is kept. ``real`` is the
byte replay as the arguments say (``--verify`` as given, ``sample`` by default); ``none``
the same with ``--bytes none`` (nothing verified). Wall time is the replay's (the no-cache
baseline pass of the virtual clock included); CPU time is the process's over the replay,
copy threads included, which a loaded machine distorts less. ``records_equal`` compares
every per-request record (hits per tier, recomputed tokens, preemptions, queueing, TTFT;
not the pages verified) between the modes; ``speedup`` is ``real`` over ``none``. Nothing
here asserts a time. Give ``--storage none://``: a policy-only run has no L3.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from hicache.cli.main import build_parser  # noqa: E402
from hicache.cli.replay_cmd import (budget_overrides, engine_config, load_cache_config, load_requests,  # noqa: E402
                                    replay_once)
from hicache.cli.table import render_table  # noqa: E402
from hicache.errors import ConfigError, HiCacheError  # noqa: E402

PROG = "bench/policy_only.py"
BYTE_ONLY = {"verified_pages", "mismatched_pages"}


def one(args: argparse.Namespace, work, mode: str) -> tuple[dict, list[dict], float]:
    """One replay in ``mode``: (summary, records without byte-only fields, CPU seconds)."""
    args.bytes = mode
    path, layout, cfg = load_cache_config(args, **budget_overrides(args, args.device_gib, args.host_gib))
    cpu = time.process_time()
    summary, report = replay_once(layout, cfg, engine_config(args, path, work, layout), work, None)
    cpu = time.process_time() - cpu
    records = [{k: v for k, v in dataclasses.asdict(r).items() if k not in BYTE_ONLY} for r in report.records]
    return summary, records, cpu


def measure(replay_args: list[str], reps: int, modes: list[str]) -> dict:
    args = build_parser().parse_args(["replay", *replay_args, "--quiet"])
    t = time.perf_counter()
    work = load_requests(args)
    load_s = time.perf_counter() - t
    best: dict[str, dict] = {}
    records: dict[str, list[dict]] = {}
    verify = args.verify
    for _ in range(reps):
        for mode in modes:
            args.verify = verify if mode == "real" else None
            summary, recs, cpu = one(args, work, mode)
            records[mode] = recs
            row = {"wall_s": summary["wall_s"], "cpu_s": round(cpu, 2), "requests_per_s": summary["requests_per_s"],
                   "hit_rate": summary["hit_rate"], "verify": summary["verify"],
                   "verified_pages": summary["verified_pages"], "mismatched_pages": summary["mismatched_pages"],
                   "d2h_bytes": summary["d2h_bytes"], "h2d_bytes": summary["h2d_bytes"],
                   "compaction_moves": summary["compaction_moves"], "virtual_s": summary["virtual_s"]}
            if mode not in best or row["wall_s"] < best[mode]["wall_s"]:
                best[mode] = row
    out: dict = {"replay_args": replay_args, "workload": work.name, "requests": len(work.requests),
                 "prompt_tokens": sum(len(r.prompt) for r in work.requests), "load_s": round(load_s, 2),
                 "reps": reps, "modes": best}
    if "real" in best and "none" in best:
        out["records_equal"] = records["real"] == records["none"]
        out["speedup_wall"] = round(best["real"]["wall_s"] / max(best["none"]["wall_s"], 1e-9), 2)
        out["speedup_cpu"] = round(best["real"]["cpu_s"] / max(best["none"]["cpu_s"], 1e-9), 2)
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog=PROG, description=__doc__.split("\n\n")[0])
    p.add_argument("--reps", type=int, default=1, help="rounds of the modes (fastest of, default 1)")
    p.add_argument("--modes", default="real,none", help="which replays, in order (default real,none)")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.add_argument("replay_args", nargs=argparse.REMAINDER, help="-- then hicache replay arguments")
    args = p.parse_args(argv)
    replay_args = args.replay_args[1:] if args.replay_args[:1] == ["--"] else args.replay_args
    modes = [m.strip() for m in args.modes.split(",") if m.strip()]
    try:
        if not modes or any(m not in ("real", "none") for m in modes):
            raise ConfigError("--modes", args.modes, "must list real and/or none")
        if args.reps < 1:
            raise ConfigError("--reps", args.reps, "must be >= 1")
        out = measure(replay_args, args.reps, modes)
    except HiCacheError as exc:
        print(f"{PROG}: error: {exc}", file=sys.stderr)
        return 2
    if args.json:
        print(json.dumps(out, indent=2))
    else:
        rows = [[m, f"{r['wall_s']:.2f}", f"{r['cpu_s']:.2f}", f"{r['requests_per_s']}", f"{r['hit_rate']:.4f}",
                 f"{r['verified_pages']:,}"] for m, r in out["modes"].items()]
        print(render_table(["bytes", "wall s", "CPU s", "requests/s", "hit rate", "pages verified"], rows,
                           title=f"{PROG}: {out['workload']}, {out['requests']:,} requests, "
                                 f"{out['prompt_tokens']:,} prompt tokens"))
        if "speedup_wall" in out:
            print(f"speedup (real / none): wall {out['speedup_wall']}x, CPU {out['speedup_cpu']}x; "
                  f"records equal: {out['records_equal']}")
    return 0 if all(r["mismatched_pages"] == 0 for r in out["modes"].values()) else 1


if __name__ == "__main__":
    sys.exit(main())
