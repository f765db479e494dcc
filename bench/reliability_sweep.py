"""A timed random sweep of ``hicache stress`` configurations: the reliability floor's proof.

Each configuration is a ``hicache stress`` command line drawn at random over layouts, write
policies, host tiers, eviction strategies (``adaptive`` among them, switching between its
candidates over a short window, with or without the floor, records of 1 to 4 windows),
retention, snapshot slots, transfer queue sizes (1 to 4096), concurrency, tier sizes, L3
prefetch and injected copy faults. It runs in a worker process exactly as a user would type
it (``hicache.cli.main.main``), so any failure is reproduced by the command line the sweep
prints::

    python bench/reliability_sweep.py --minutes 60 [--jobs 2] [--seed S] [--ops 400] [--json]
                                      [--log FILE.jsonl]

A configuration fails when stress reports an integrity error or a mismatched byte, exits
non-zero, or raises. The summary counts configurations run, operations, pages verified,
injected faults and failures, and names the first failing command. Exit status 1 when any
configuration failed.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import multiprocessing as mp
import random
import sys
import time
import traceback
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # this checkout's hicache

LAYOUTS = ("tiny-hybrid", "tiny-mha", "deepseek-v4-flash", "deepseek-v3", "llama-3.1-8b")
POLICIES = (("write_through", "inclusive"), ("write_through_selective", "inclusive"),
            ("write_back", "inclusive"), ("write_back", "exclusive"))


def draw(rng: random.Random, ops: int) -> list[str]:
    """One random ``hicache stress`` configuration, as command-line arguments."""
    layout = rng.choices(LAYOUTS, weights=(6, 3, 1, 1, 1))[0]
    policy, tier = rng.choice(POLICIES)
    hybrid = layout in ("tiny-hybrid", "deepseek-v4-flash")
    queue = rng.choice([1, 1, 2, 3, 4, 8, 64, 4096, int(2 ** rng.uniform(0, 12))])
    device = rng.randint(6, 24)
    args = ["--config", layout, "--ops", str(ops), "--seed", str(rng.randrange(1 << 31)),
            "--write-policy", policy, "--host-tier", tier,
            "--eviction", rng.choice(["lru", "lfu", "value", "reuse", "reuse-prompt", "reuse-prompt-late",
                                      "probation", "adaptive", "adaptive"]),
            "--max-queued-ops", str(queue), "--max-running", str(rng.randint(1, 4)),
            "--device-pages", str(device), "--host-pages", str(rng.randint(4, 48)),
            "--prefetch", str(rng.choice([0.0, 0.3, 0.6, 0.9])),
            "--fault-rate", str(rng.choice([0.0, 0.0, 0.02, 0.1])),
            "--budget", rng.choice(["split", "shared"]),
            "--adaptive-window", str(rng.choice([4, 16, 64])),
            "--adaptive-floor", rng.choice(["on", "on", "off"]), "--adaptive-record", str(rng.choice([1, 2, 4])),
            "--adaptive-z", rng.choice(["0", "0", "2"]), "--adaptive-trial", rng.choice(["0", "0", "8"]),
            "--adaptive-dead-outputs", rng.choice(["32", "1", "1"])]
    if hybrid:
        page_tokens = 16 if layout == "tiny-hybrid" else 256
        retention = rng.choice(["none", "0", str(page_tokens * rng.randint(1, 4))])
        args += ["--retention", retention, "--device-snapshots", str(rng.randint(1, 8)),
                 "--host-snapshots", str(rng.randint(1, 16))]
    return args


def run_one(args: list[str]) -> dict:
    """Run one stress command in this process; never raises."""
    from hicache.cli.main import main

    out, err = io.StringIO(), io.StringIO()
    t0 = time.perf_counter()
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            rc = main(["stress", *args, "--json"])
        rep = json.loads(out.getvalue())
        failed = rc != 0 or rep["integrity_errors"] or rep["mismatched_pages"]
        error = rep.get("first_error") or (None if not failed else err.getvalue().strip()[-300:] or f"exit {rc}")
    except BaseException:  # a traceback is a failure of the floor, whatever it is
        rep, failed = {}, True
        error = traceback.format_exc(limit=4)[-600:]
    return {"args": args, "failed": bool(failed), "error": error, "seconds": round(time.perf_counter() - t0, 2),
            "ops": rep.get("ops", 0), "verified_pages": rep.get("verified_pages", 0),
            "injected_faults": rep.get("injected_faults", 0), "requests": rep.get("requests", 0)}


def command(args: list[str]) -> str:
    return "hicache stress " + " ".join(args)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--minutes", type=float, default=60.0, help="how long to sweep (default 60)")
    p.add_argument("--jobs", type=int, default=2, help="worker processes (default 2)")
    p.add_argument("--seed", type=int, default=0, help="seed of the configuration draw (default 0)")
    p.add_argument("--ops", type=int, default=400, help="operations per configuration (default 400)")
    p.add_argument("--log", type=Path, help="append one JSON line per configuration")
    p.add_argument("--json", action="store_true", help="print one JSON summary")
    a = p.parse_args(argv)
    if a.minutes <= 0 or a.jobs < 1 or a.ops < 1:
        print("reliability_sweep: error: --minutes, --jobs and --ops must be positive", file=sys.stderr)
        return 2
    log = a.log.open("a") if a.log else None
    rng = random.Random(a.seed)
    deadline = time.monotonic() + a.minutes * 60
    total = {"configs": 0, "failures": 0, "ops": 0, "verified_pages": 0, "injected_faults": 0, "requests": 0}
    first = None
    tty = sys.stderr.isatty()
    by_layout: dict[str, int] = {}
    by_eviction: dict[str, int] = {}
    with mp.get_context("spawn").Pool(a.jobs, maxtasksperchild=20) as pool:
        pending = [pool.apply_async(run_one, (draw(rng, a.ops),)) for _ in range(a.jobs * 2)]
        while pending:
            res = pending.pop(0).get()
            total["configs"] += 1
            total["failures"] += res["failed"]
            for k in ("ops", "verified_pages", "injected_faults", "requests"):
                total[k] += res[k]
            layout = res["args"][1]
            by_layout[layout] = by_layout.get(layout, 0) + 1
            eviction = res["args"][res["args"].index("--eviction") + 1]
            by_eviction[eviction] = by_eviction.get(eviction, 0) + 1
            if res["failed"] and first is None:
                first = {"command": command(res["args"]), "error": res["error"]}
            if log:
                log.write(json.dumps(res) + "\n")
                log.flush()
            left = max(deadline - time.monotonic(), 0)
            if tty or total["configs"] % 50 == 0:
                line = f"sweep: {total['configs']} configs, {total['failures']} failed, {left / 60:.1f} min left"
                print("\r" + line if tty else line, end="" if tty else "\n", file=sys.stderr, flush=True)
            if time.monotonic() < deadline:
                pending.append(pool.apply_async(run_one, (draw(rng, a.ops),)))
    print(file=sys.stderr)
    summary = {**total, "minutes": a.minutes, "seed": a.seed, "by_layout": by_layout, "by_eviction": by_eviction,
               "first_failure": first}
    if a.json:
        print(json.dumps(summary, indent=2))
    else:
        for k, v in summary.items():
            if k != "first_failure":
                print(f"{k:>16}: {v}")
        print(f"{'first_failure':>16}: {first['command'] if first else None}")
        if first:
            print(first["error"])
    if log:
        log.close()
    return 1 if total["failures"] else 0


if __name__ == "__main__":
    sys.exit(main())
