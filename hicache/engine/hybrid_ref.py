"""A reference LRU for hybrid models: kvcache-simulator's block LRU, resumed only at snapshots.

kvcache-simulator models an attention-only prefix cache: a request hits every leading block
still cached, so a conversation whose newest blocks were evicted still hits its older ones.
A hybrid model (DeepSeek-V4's sliding-window and compressor state) can resume only at a
boundary whose state snapshot is cached, so the same cache contents serve fewer tokens.
This module measures that cost on a simulator trace, with the simulator's own LRU and
measurement rules (every block of a request touched, blocks of the running request never
evicted, hit tokens / prompt tokens over the last half of the requests)::

    block LRU    hit = the leading blocks still cached, a partial last block's tokens
                 included                                       (= kvcache-simulator LRU)
    hybrid LRU   hit = the same, cut back to the deepest boundary with a snapshot
                 snapshots: at the end of every earlier request's whole blocks, at the
                 point where a request left a cached path (the fork; hicache's engine
                 publishes one there, ``Boundary.BRANCH``), and with ``chunk_blocks`` at
                 every prefill chunk end (each ``chunk_blocks`` blocks past the resume
                 point, as the engine's chunked prefill publishes them); they cost no
                 bytes, and one goes when the block it ends goes

So the hybrid LRU is an upper bound for any cache that orders pages by LRU and needs a
snapshot to resume -- its snapshots are free -- and the block LRU minus the hybrid LRU is
what the resume rule alone costs at that capacity. ``hicache sweep`` reports it beside the
simulator's figures (``ref_hybrid_lru``, with the engine's chunk size). Run standalone::

    python -m hicache.engine.hybrid_ref TRACE.jsonl --blocks 380,571,952 [--chunk-blocks 16] [--json]
"""

from __future__ import annotations

import argparse
import heapq
import json
import sys
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Sequence

from hicache.errors import ConfigError
from hicache.units import check_int


@dataclass(frozen=True)
class Request:
    """One trace line: its block hashes (one per ``block_size`` tokens, prefix-unique) and length."""

    hash_ids: tuple[int, ...]
    input_length: int
    block_size: int


@dataclass(frozen=True)
class RefPoint:
    """Last-half hit rates of both LRUs at one capacity."""

    capacity_blocks: int
    block_lru: float
    hybrid_lru: float


def load_trace(path: str | Path) -> list[Request]:
    """The requests of a kvcache-simulator trace (JSON lines with ``hash_ids``, ``input_length``,
    ``block_size``); a bad line is one ConfigError naming it."""
    p = Path(path)
    if not p.is_file():
        raise ConfigError("trace", str(path), "no such file")
    out = []
    with p.open() as f:
        for no, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                r = json.loads(line)
                out.append(Request(tuple(int(h) for h in r["hash_ids"]), int(r["input_length"]), int(r["block_size"])))
            except (ValueError, KeyError, TypeError) as exc:
                raise ConfigError("trace", f"{path}:{no}", f"not a simulator trace line ({exc})") from None
    return out


def hit_rate(requests: Sequence[Request], capacity_blocks: int, *, hybrid: bool, chunk_blocks: int = 0) -> float:
    """Last-half hit rate of an LRU block cache holding ``capacity_blocks`` (module docstring)."""
    check_int("capacity_blocks", capacity_blocks, minimum=1, reason="must be a positive integer")
    check_int("chunk_blocks", chunk_blocks, minimum=0, reason="must be 0 (no chunk snapshots) or a block count")
    key: dict[int, tuple[int, int]] = {}    # cached block -> its LRU key (request index, -position)
    heap: list[tuple[tuple[int, int], int]] = []
    snapshots: set[int] = set()             # blocks that end a boundary with a snapshot
    half = len(requests) // 2
    hit = total = 0
    for i, r in enumerate(requests):
        h, whole = r.hash_ids, r.input_length // r.block_size
        k = 0
        while k < len(h) and h[k] in key:
            k += 1
        # the simulator counts a cached partial last block's tokens; a hybrid resume point
        # is a whole-block boundary
        got = min(k * r.block_size, r.input_length)
        k = min(k, whole)
        fork = k
        if hybrid:
            while k > 0 and h[k - 1] not in snapshots:
                k -= 1
            got = k * r.block_size
        if i >= half:
            hit += got
            total += r.input_length
        for j, b in enumerate(h):
            key[b] = (i, -j)
            heapq.heappush(heap, ((i, -j), b))
        if whole:
            snapshots.add(h[whole - 1])
        if 0 < fork < whole:
            snapshots.add(h[fork - 1])
        if chunk_blocks:
            snapshots.update(h[q - 1] for q in range(k + chunk_blocks, whole, chunk_blocks))
        running, held = set(h), []
        while len(key) > capacity_blocks and heap:
            entry = heapq.heappop(heap)
            b = entry[1]
            if key.get(b) != entry[0]:
                continue                    # stale: the block was touched again since
            if b in running:
                held.append(entry)          # the running request's blocks stay
                continue
            del key[b]
            snapshots.discard(b)
        for entry in held:
            heapq.heappush(heap, entry)
    return hit / total if total else 0.0


def reference(path: str | Path, capacities_blocks: Sequence[int], *, chunk_blocks: int = 0) -> list[RefPoint]:
    """Both LRUs at each capacity (the hybrid one with chunk-end snapshots every ``chunk_blocks``)."""
    requests = load_trace(path)
    return [RefPoint(c, hit_rate(requests, c, hybrid=False),
                     hit_rate(requests, c, hybrid=True, chunk_blocks=chunk_blocks)) for c in capacities_blocks]


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m hicache.engine.hybrid_ref", description=__doc__.split("\n")[0])
    ap.add_argument("trace", help="kvcache-simulator trace (JSON lines)")
    ap.add_argument("--blocks", required=True, help="capacities in blocks, comma-separated")
    ap.add_argument("--chunk-blocks", type=int, default=0,
                    help="a snapshot every N blocks past the resume point (prefill chunk ends); 0: none")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args(argv)
    try:
        caps = [int(c) for c in args.blocks.split(",")]
    except ValueError:
        print(f"error: --blocks {args.blocks!r}: must be comma-separated integers", file=sys.stderr)
        return 2
    try:
        points = reference(args.trace, caps, chunk_blocks=args.chunk_blocks)
    except ConfigError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    if args.json:
        print(json.dumps([asdict(p) for p in points], indent=2))
    else:
        print(f"{'blocks':>8} {'block LRU':>10} {'hybrid LRU':>11}")
        for p in points:
            print(f"{p.capacity_blocks:>8} {100 * p.block_lru:>9.1f}% {100 * p.hybrid_lru:>10.1f}%")
    return 0


if __name__ == "__main__":
    sys.exit(main())
