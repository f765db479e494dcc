"""``python -m hicache.engine.workloads``: build a workload, describe it, optionally write a trace.

    python -m hicache.engine.workloads sharegpt --conversations 300 --seed 0 \\
        --write-trace sharegpt-300.jsonl --block-size 256 [--full-blocks-only] [--json]

The trace then feeds both ``hicache replay --trace`` and ``bench/kvsim_compare.py``, so the
two see the same requests. Bad input prints one line and exits 2.
"""

from __future__ import annotations

import argparse
import json
import sys
import time

from hicache.engine.workloads import (DEFAULT_SYSTEM_PROMPT, PRESETS, read_trace, sharegpt, summarize, synthetic,
                                      write_trace)
from hicache.errors import ConfigError, HiCacheError

PROG = "python -m hicache.engine.workloads"


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog=PROG, description="Build a replay workload and describe it.")
    p.add_argument("workload", choices=["synthetic", "sharegpt", "trace"])
    p.add_argument("--conversations", type=int, default=100,
                   help="conversations to draw (synthetic, sharegpt)")
    p.add_argument("--seed", type=int, default=0, help="random draw (synthetic, sharegpt)")
    p.add_argument("--preset", default="chat", choices=sorted(PRESETS), help="synthetic preset")
    p.add_argument("--max-prompt-tokens", type=int, default=131_072, help="sharegpt: longest prompt kept")
    p.add_argument("--no-system-prompt", action="store_true",
                   help="sharegpt: no default system prompt (first turns can be shorter than a block)")
    p.add_argument("--trace", metavar="FILE", help="trace to load (workload 'trace')")
    p.add_argument("--page-tokens", type=int, default=256, help="page size for the reuse ceiling")
    p.add_argument("--write-trace", metavar="OUT", help="write the requests as a kvcache-simulator trace")
    p.add_argument("--block-size", type=int, default=256, help="block size of the written trace")
    p.add_argument("--full-blocks-only", action="store_true",
                   help="hash only each prompt's full blocks (short prompts get empty hash_ids, which "
                        "kvcache-simulator skips)")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    return p


def build(args: argparse.Namespace) -> tuple[list, dict]:
    """The requests, and for a trace what its reader passed over."""
    if args.workload == "synthetic":
        return synthetic(args.conversations, args.seed, preset=args.preset), {}
    if args.workload == "sharegpt":
        system_prompt = "" if args.no_system_prompt else DEFAULT_SYSTEM_PROMPT
        return sharegpt(args.conversations, args.seed, args.max_prompt_tokens, system_prompt=system_prompt), {}
    if not args.trace:
        raise ConfigError("--trace", None, "workload 'trace' needs --trace FILE")
    loaded = read_trace(args.trace)
    return loaded.requests, loaded.info()


def run(args: argparse.Namespace) -> int:
    t0 = time.perf_counter()
    print(f"{PROG}: building {args.workload} ...", file=sys.stderr)
    requests, info = build(args)
    stats = summarize(requests, page_tokens=args.page_tokens)
    out = {"workload": args.workload, "stats": stats.as_dict()}
    if info:
        out["trace_read"] = info
    if args.write_trace:
        written = write_trace(requests, args.write_trace, args.block_size, partial_tail=not args.full_blocks_only)
        out["trace_written"] = dict(written.__dict__)
    print(f"{PROG}: done in {time.perf_counter() - t0:.1f}s", file=sys.stderr)
    if args.json:
        print(json.dumps(out, indent=2))
        return 0
    rows = [(k, v) for k, v in out["stats"].items()]
    rows += [(f"read.{k}", v) for k, v in out.get("trace_read", {}).items()]
    rows += [(f"trace.{k}", v) for k, v in out.get("trace_written", {}).items()]
    print(f"workload {args.workload}")
    width = max(len(k) for k, _ in rows)
    for k, v in rows:  # a plain two-column table: this module imports nothing of the cli
        print(f"{k.ljust(width)}  {v:,.4f}" if isinstance(v, float) else f"{k.ljust(width)}  {v}")
    return 0


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return run(args)
    except HiCacheError as exc:
        print(f"{PROG}: error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
