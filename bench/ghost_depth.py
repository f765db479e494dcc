"""The ghost model of the value order on a trace: each fixed depth weight, and the tuner.

    python bench/ghost_depth.py TRACE.jsonl [--config deepseek-v4-flash] [--device-gib 0.25]
                                [--host-gib 0.25] [--weights 0,10,30,60] [--window 300] [--json]

Sizes the ghosts as the cache does (``PoolPlan.page_units``: device pages plus host bytes,
in pages; a snapshot its bytes in pages), replays the trace's whole pages (``hash_ids``, one
key per block) in trace order and prints the hit rate over the last half: the bookkeeping
model the cache's depth tuner runs (``hicache/tree/ghost.py``), with no engine, clock or
tiers. It shows what depth is worth on a trace before a full ``hicache sweep``.
"""

from __future__ import annotations

import argparse
import json
import sys

from hicache.cli.common import parse_depth_weights, resolve_config
from hicache.config import load_config
from hicache.errors import ConfigError
from hicache.pools import plan_pools
from hicache.tree import DepthTuner, GhostCache
from hicache.cli.replay_cmd import GiB


def _requests(path: str) -> list[tuple[list, int]]:
    out = []
    with open(path) as f:
        for n, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                r = json.loads(line)
                out.append((r["hash_ids"][: r["input_length"] // r["block_size"]], int(r["input_length"])))
            except (ValueError, KeyError, TypeError) as exc:
                raise ConfigError(f"{path}:{n}", line.strip()[:60], f"is not a trace record ({exc})") from None
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("trace")
    p.add_argument("--config", default="deepseek-v4-flash")
    p.add_argument("--device-gib", type=float, default=0.25)
    p.add_argument("--host-gib", type=float, default=0.25)
    p.add_argument("--weights", default="0,10,30,60")
    p.add_argument("--window", type=int, default=300)
    p.add_argument("--json", action="store_true")
    a = p.parse_args(argv)
    try:
        layout, cfg = load_config(resolve_config(a.config), device_bytes=int(a.device_gib * GiB),
                                  host_bytes=int(a.host_gib * GiB))
        units, snap = plan_pools(layout, cfg.pools).page_units()
        weights = parse_depth_weights("--weights", a.weights)
        reqs = _requests(a.trace)
    except (ConfigError, OSError) as exc:
        print(f"ghost_depth: error: {exc}", file=sys.stderr)
        return 2
    block = layout.page_tokens
    half = len(reqs) // 2
    total = sum(n for _, n in reqs[half:])
    rows = {}
    for w in weights:
        g = GhostCache(units, snap, w)
        hits = [g.step(keys) for keys, _ in reqs]
        rows[f"weight {w:g}"] = sum(hits[half:]) * block / total
    tuner = DepthTuner(units, snap, weights, a.window)
    chosen = []
    for keys, _ in reqs:
        tuner.observe(keys)
        chosen.append(tuner.weight)
    # the tuned run: a ghost whose weight follows the tuner's choice request by request
    g = GhostCache(units, snap, weights[0])
    hits = []
    for (keys, _), w in zip(reqs, [min(weights)] + chosen[:-1]):
        g.weight = w
        hits.append(g.step(keys))
    rows["tuned"] = sum(hits[half:]) * block / total
    out = {"trace": a.trace, "capacity_units": units, "snapshot_units": snap, "hit_rate_last_half": rows,
           "switches": tuner.switches}
    if a.json:
        print(json.dumps(out, indent=2))
    else:
        print(f"{a.trace}: {units:.0f} page units, snapshot {snap:.2f} units, last half")
        for k, v in rows.items():
            print(f"  {k:12s} {100 * v:6.2f}%")
        print(f"  tuner switches: {tuner.switches}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
