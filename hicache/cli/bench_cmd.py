"""``hicache bench NAME ...``: speed measurements, each a ratio to a same-run baseline.

Each benchmark lives in its own module exposing ``add_arguments(parser)`` and
``run(args) -> int``; register it in :data:`BENCHES` (name -> module path).
"""

from __future__ import annotations

import argparse
import importlib

# name -> (module, one-line help). Modules are imported lazily so a missing optional
# dependency of one benchmark never breaks the others.
BENCHES: dict[str, tuple[str, str]] = {
    "tree": ("hicache.cli.bench_tree", "match / load / publish cost of the radix tree for long prompts"),
    "storage": ("hicache.cli.bench_storage", "L3 put/get GB/s against redis-benchmark, memcpy or plain files"),
    "transfer": ("hicache.cli.bench_transfer",
                 "batched D2H/H2D copies vs a contiguous memcpy and a naive per-page loop"),
    "overlap": ("hicache.cli.bench_overlap",
                "share of a per-layer load hidden behind a stand-in layer compute"),
}


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("bench", help="measure copy / storage / tree speed against a baseline",
                       description="Speed measurements; every figure is reported next to a "
                                   "baseline measured in the same run.")
    benches = p.add_subparsers(dest="bench", metavar="NAME")
    benches.required = True
    for name, (module, help_text) in BENCHES.items():
        mod = importlib.import_module(module)
        bp = benches.add_parser(name, help=help_text, description=help_text)
        mod.add_arguments(bp)
        bp.set_defaults(func=mod.run)
