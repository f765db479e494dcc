"""Where a hybrid cache's hits go, without an engine: a trace replayed one request at a time
through ghost caches (``hicache.tree.ghost``: the cache's bookkeeping, the same eviction
orders, no bytes, no tiers, no queue), each a step closer to hicache's real cache.

Why. ``hicache sweep`` compares the whole engine with kvcache-simulator's LRU; when it falls
short, the loss can be the engine (requests in flight, the device / host split, the queue)
or the cache model (what a hybrid cache must hold and where it can resume). This separates
them, one difference at a time, at the bytes of one sweep point.

Snapshots sit where hicache's reference engine offers them: each prompt's end, the point
where a prompt leaves the cached path (``branch``) and, in the ``tails`` rung, each decode's
end (prefill chunk ends are left out: one request at a time, nothing resumes mid-prompt)::

    rung                 resume at       snapshot bytes   decoded tails
    pages-anywhere       any page        none             no       (an attention-only LRU)
    snapshots-free       snapshots       none             no       (the resume rule alone)
    snapshot-bytes       snapshots       charged          no
    tails-dead           snapshots       charged          yes, with no snapshot at their end
    tails                snapshots       charged          yes, each with its snapshot (hicache)

Capacity: ``pages-anywhere`` and ``snapshots-free`` get the simulator's block count (what
``hicache sweep`` gives it: ``sim_blocks`` in its JSON, ``--sim-blocks``); the charged rungs
get the cache's own bytes in pages (``PoolPlan.page_units``), as the real cache's ghosts
do. Measure: last-half hit tokens over the trace's hashed tokens (the simulator's).
This is how the rule fixed in 43a105f was found: on ShareGPT without conversation ids the
``tails`` rung lost 2.4 points to ``tails-dead`` under ``reuse-prompt``, because a repeated
prompt's idle decodes made its resume point look superseded.

    python bench/ghost_decompose.py --trace F.jsonl --device-gib 0.25 --host-gib 0.5 \\
        --sim-blocks 677 --policies lru,reuse-prompt
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from hicache.cli.common import print_json, resolve_config  # noqa: E402
from hicache.config import load_config  # noqa: E402
from hicache.engine.workloads.trace_parse import parse_trace  # noqa: E402
from hicache.errors import HiCacheError  # noqa: E402
from hicache.pools import plan_pools  # noqa: E402
from hicache.tree.eviction import get_strategy  # noqa: E402
from hicache.tree.ghost import GhostCache  # noqa: E402

RUNGS = ("pages-anywhere", "snapshots-free", "snapshot-bytes", "tails-dead", "tails")


def read_trace(path: str) -> list[dict]:
    """The trace's requests, read as kvcache-simulator reads them
    (:func:`hicache.engine.workloads.trace_parse.parse_trace`: what it skips is skipped,
    what it refuses raises ConfigError naming the line)."""
    parsed = parse_trace(path)
    ids: dict[str, int] = {}     # ints, so page keys do not depend on str's per-process hash
    return [{"input_length": r.prompt_len, "output_length": r.output_length, "block_size": parsed.block_size,
             "hash_ids": [ids.setdefault(k, len(ids)) for k in r.keys]} for r in parsed.lines]


def replay(reqs: list[dict], rung: str, policy: str, capacity: float, snapshot_units: float, page: int) -> float:
    """Last-half hit rate of one rung under one eviction order."""
    stateless = rung == "pages-anywhere"
    g = GhostCache(get_strategy(policy), capacity, snapshot_units if rung in RUNGS[2:] else 0.0,
                   stateless=stateless)
    half, hit, total = len(reqs) // 2, 0, 0
    for i, r in enumerate(reqs):
        per = max(1, r["block_size"] // page)
        keys, prev = [], 0
        for h in r["hash_ids"]:            # a page key is its whole prefix
            for j in range(per):
                prev = hash((prev, h, j))
                keys.append(prev)
        prompt = r["input_length"] // page
        keys = keys[:prompt]
        resume = g.lookup(i, keys, prompt)
        cached = 0
        while cached < len(keys) and keys[cached] in g.nodes:
            cached += 1
        if not stateless and resume < cached < prompt:   # a snapshot at the fork, as the engine offers
            g.publish(i, keys[:cached], "branch")
        if i >= half:
            hit += min(resume * page, r["input_length"])
            total += min(len(r["hash_ids"]) * r["block_size"], r["input_length"])
        if keys:
            g.publish(i, keys, "prompt_end", snapshot=not stateless)
        end = (r["input_length"] + r["output_length"]) // page
        if rung in ("tails-dead", "tails") and end > prompt:
            g.publish(i, keys + [hash(("decode", i, j)) for j in range(end - prompt)], "finish",
                      snapshot=rung == "tails")
        g.release(i)
    return hit / total if total else 0.0


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--trace", required=True)
    p.add_argument("--config", default="deepseek-v4-flash")
    p.add_argument("--device-gib", type=float, required=True)
    p.add_argument("--host-gib", type=float, required=True)
    p.add_argument("--sim-blocks", type=int, required=True, help="the simulator's capacity (sweep JSON: sim_blocks)")
    p.add_argument("--policies", default="lru,reuse-prompt")
    p.add_argument("--json", action="store_true")
    a = p.parse_args(argv)
    try:
        layout, cfg = load_config(resolve_config(a.config), device_bytes=int(a.device_gib * 2**30), host_bytes=int(a.host_gib * 2**30))
        units, snap = plan_pools(layout, cfg.pools).page_units()
        reqs = read_trace(a.trace)
        if not reqs:
            raise HiCacheError(f"trace {a.trace}: no requests")
        bad = next((r["block_size"] for r in reqs if r["block_size"] % layout.page_tokens), None)
        if bad is not None:
            raise HiCacheError(f"trace {a.trace}: block_size {bad} is not a multiple of the page ({layout.page_tokens} tokens)")
        policies = [x for x in a.policies.split(",") if x]
        for x in policies:
            get_strategy(x)
    except (HiCacheError, OSError) as exc:
        print(f"ghost_decompose: {exc}", file=sys.stderr)
        return 2
    if a.sim_blocks < 1:
        print(f"ghost_decompose: --sim-blocks {a.sim_blocks}: must be >= 1", file=sys.stderr)
        return 2
    page = layout.page_tokens
    rows = []
    for rung in RUNGS:
        cap = float(a.sim_blocks) * max(1, reqs[0]["block_size"] // page) if rung in RUNGS[:2] else units
        rows.append({"rung": rung, "capacity_pages": round(cap, 1),
                     **{x: round(100 * replay(reqs, rung, x, cap, snap, page), 2) for x in policies}})
        print(f"ghost_decompose: {rung} done", file=sys.stderr)
    if a.json:
        print_json({"trace": a.trace, "snapshot_pages": snap, "rows": rows})
        return 0
    print(f"| rung | capacity (pages) | {' | '.join(policies)} |")
    print("|---|---|" + "---|" * len(policies))
    for r in rows:
        print(f"| {r['rung']} | {r['capacity_pages']:g} | " + " | ".join(f"{r[x]:.2f}" for x in policies) + " |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
