"""``hicache ref TRACE --blocks a,b,c [--chunk-blocks N] [--json]``: kvcache-simulator's LRU on
a trace, counted as an attention-only cache and as a hybrid one (resume only at snapshots).

See :mod:`hicache.engine.hybrid_ref`. ``hicache sweep`` prints the same figures beside its
replays; this command runs them alone, at capacities in blocks.
"""

from __future__ import annotations

import argparse
from dataclasses import asdict

from hicache.cli.common import parse_positive_list, print_json
from hicache.cli.table import render_table


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("ref", help="the simulator's LRU on a trace, attention-only and hybrid",
                       description="Replay a kvcache-simulator trace through its LRU at each capacity and "
                                   "count the last-half hit rate twice: every cached leading block "
                                   "(the simulator's figure) and only up to a boundary with a snapshot "
                                   "(a hybrid model's).")
    p.add_argument("trace", help="kvcache-simulator trace (JSON lines, .gz allowed)")
    p.add_argument("--blocks", required=True, help="capacities in blocks, comma-separated")
    p.add_argument("--chunk-blocks", type=int, default=0,
                   help="a snapshot every N blocks past the resume point, as chunked prefill "
                        "publishes them (default 0: none)")
    p.add_argument("--block-size", type=int, default=None, metavar="TOKENS",
                   help="tokens per hash id for lines without block_size, as kvcache-simulator's --block-size")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from hicache.engine import hybrid_ref

    caps = parse_positive_list(args.blocks, "--blocks", int, "380,571 (blocks)")
    points = hybrid_ref.reference(args.trace, caps, chunk_blocks=args.chunk_blocks, block_size=args.block_size)
    if args.json:
        print_json({"trace": args.trace, "chunk_blocks": args.chunk_blocks, "points": [asdict(p) for p in points]})
        return 0

    def pct(v: float | None) -> str:
        return "underfilled" if v is None else f"{100 * v:.2f}%"

    print(render_table(["blocks", "block LRU (simulator)", "hybrid LRU"],
                       [[p.capacity_blocks, pct(p.block_lru), pct(p.hybrid_lru)] for p in points],
                       title=f"hicache ref: {args.trace}, snapshots at request ends, forks"
                             + (f", every {args.chunk_blocks} blocks of prefill" if args.chunk_blocks else "")))
    return 0
