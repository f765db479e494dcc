"""How long the requests that lost to LRU had waited in the engine's queue.

    hicache replay --config deepseek-v4-flash --trace T.jsonl --device-gib 0.25 --host-gib 0.25 \\
        --storage none:// --no-expect-queued --requests-out R.jsonl
    python bench/queue_waits.py T.jsonl R.jsonl 464 [--json]

Replays the trace's blocks (``hash_ids``) through a block LRU of CAPACITY blocks (a new
block evicts the least recently used one; kvcache-simulator evicts the least recently used
*leaf*, which this approximates) and compares each follow-up turn of the last half with
the replay's record: how many lost tokens to it, and their queue waits (``queue_s``) beside
every follow-up's. Diagnostic, not a must-show figure (docs/policy.md, "The waiting
queue's head kept warm").
"""

from __future__ import annotations

import argparse
import json
from collections import OrderedDict

import numpy as np


def _rows(path: str) -> list[dict]:
    """The JSON objects of a JSON-lines file; a one-line error on anything else."""
    try:
        with open(path) as f:
            lines = [(n, line) for n, line in enumerate(f, 1) if line.strip()]
    except OSError as exc:
        raise SystemExit(f"queue_waits: cannot read {path}: {exc.strerror}") from None
    rows = []
    for n, line in lines:
        try:
            row = json.loads(line)
        except ValueError:
            raise SystemExit(f"queue_waits: {path} line {n} is not JSON") from None
        if not isinstance(row, dict):
            raise SystemExit(f"queue_waits: {path} line {n} is not a JSON object")
        rows.append(row)
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("trace")
    ap.add_argument("records", help="hicache replay --requests-out file of the same trace")
    ap.add_argument("capacity", type=int, help="LRU capacity in blocks (e.g. hicache sweep's sim_blocks)")
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args()
    if a.capacity < 1:
        raise SystemExit(f"queue_waits: capacity={a.capacity} must be >= 1")
    reqs = _rows(a.trace)
    ours = {r.get("request_id"): r for r in _rows(a.records)
            if r.get("queue_s") is not None}   # rejected requests never queued to a start
    lru: OrderedDict = OrderedDict()
    lost, waits_lost, waits_all = 0, [], []
    half = len(reqs) // 2
    for i, r in enumerate(reqs):
        h, k = r.get("hash_ids") or [], 0
        while k < len(h) and h[k] in lru:
            lru.move_to_end(h[k])
            k += 1
        for key in h[k:]:
            lru[key] = True
            if len(lru) > a.capacity:
                lru.popitem(last=False)
        rec = ours.get(r.get("request_id"))
        if i < half or r.get("turn", 0) == 0 or rec is None:
            continue
        waits_all.append(rec["queue_s"])
        lru_hit = min(k * r.get("block_size", 256), r["input_length"])
        if lru_hit > rec["hit_tokens"]:
            lost += lru_hit - rec["hit_tokens"]
            waits_lost.append(rec["queue_s"])

    def pct(v):
        return [round(float(np.percentile(v, p)), 1) for p in (10, 50, 90)] if v else None
    out = {"follow_ups": len(waits_all), "follow_ups_lost": len(waits_lost), "tokens_lost": lost,
           "queue_s_p10_p50_p90_lost": pct(waits_lost), "queue_s_p10_p50_p90_all": pct(waits_all)}
    if a.json:
        print(json.dumps(out))
        return
    print(f"follow-up turns of the last half: {out['follow_ups']}; hit less than LRU: {out['follow_ups_lost']} "
          f"({lost:,} tokens)")
    print(f"queue wait p10 / p50 / p90 (s): those {out['queue_s_p10_p50_p90_lost']}, "
          f"all {out['queue_s_p10_p50_p90_all']}")


if __name__ == "__main__":
    main()
