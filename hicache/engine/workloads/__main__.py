"""``python -m hicache.engine.workloads``: build a workload, describe it, optionally write a trace.

    python -m hicache.engine.workloads sharegpt --conversations 300 --seed 0 \\
        --write-trace sharegpt-300.jsonl --block-size 256 [--full-blocks-only] [--no-conversation-ids] [--json]
    python -m hicache.engine.workloads reasoning|rag|mix|mix-poisson|agentic|sharegpt-nosys|... --seed 1
    python -m hicache.engine.workloads production --requests 12000 --seed 0 --write-trace F --block-size 512

The trace then feeds both ``hicache replay --trace`` and ``bench/kvsim_compare.py``, so the
two see the same requests. ``production`` is written straight from its block ids (no
tokens are made) and never has conversation ids. Bad input prints one line and exits 2.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

from hicache.engine.workloads import (DEFAULT_SYSTEM_PROMPT, FAMILIES, PRESETS, build_family, read_trace, sharegpt,
                                      summarize, synthetic, write_production_trace, write_trace)
from hicache.errors import ConfigError, HiCacheError

PROG = "python -m hicache.engine.workloads"
DEFAULT_CONVERSATIONS, DEFAULT_REQUESTS = 100, 12_000


def build_parser() -> argparse.ArgumentParser:
    rows = "\n".join(f"  {f.name:<15} N = {f.unit:<13} resumes {f.resumes}" for f in FAMILIES.values())
    p = argparse.ArgumentParser(prog=PROG, description="Build a replay workload and describe it.",
                                formatter_class=argparse.RawDescriptionHelpFormatter,
                                epilog=f"families (docs/workloads.md, 'Trace families'):\n{rows}")
    p.add_argument("workload", choices=["synthetic", "trace", *sorted(FAMILIES)],
                   help="a family (see docs/workloads.md), 'synthetic' with --preset, or 'trace' with --trace")
    p.add_argument("--conversations", type=int, default=None,
                   help=f"units to draw (default {DEFAULT_CONVERSATIONS}): conversations; agentic: tasks; "
                        "rag: sessions; mix: units")
    p.add_argument("--requests", type=int, default=None,
                   help=f"production: requests in the trace (default {DEFAULT_REQUESTS:,})")
    p.add_argument("--seed", type=int, default=0, help="random draw")
    p.add_argument("--preset", default="chat", choices=sorted(PRESETS), help="synthetic preset")
    p.add_argument("--max-prompt-tokens", type=int, default=131_072, help="sharegpt: longest prompt kept")
    p.add_argument("--no-system-prompt", action="store_true",
                   help="sharegpt: no default system prompt (= workload sharegpt-nosys; first turns can be "
                        "shorter than a block)")
    p.add_argument("--trace", metavar="FILE", help="trace to load (workload 'trace')")
    p.add_argument("--page-tokens", type=int, default=None,
                   help="page size for the reuse ceiling (default 256; production: the block size)")
    p.add_argument("--write-trace", metavar="OUT", help="write the requests as a kvcache-simulator trace")
    p.add_argument("--block-size", type=int, default=256, help="block size of the written trace")
    p.add_argument("--full-blocks-only", action="store_true",
                   help="hash only each prompt's full blocks (short prompts get empty hash_ids, which "
                        "kvcache-simulator skips)")
    p.add_argument("--no-conversation-ids", action="store_true",
                   help="write no conversation_id / turn / request_id: the replay sees independent requests "
                        "(production never writes them)")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    return p


def _check_sizes(args: argparse.Namespace) -> None:
    if args.workload == "production":
        if args.conversations is not None:
            raise ConfigError("--conversations", args.conversations, "production counts --requests")
        if args.page_tokens is not None and args.page_tokens != args.block_size:
            raise ConfigError("--page-tokens", args.page_tokens,
                              f"production counts reuse in trace blocks: it must equal --block-size ({args.block_size})")
    elif args.requests is not None:
        raise ConfigError("--requests", args.requests, "only for production; other workloads count --conversations")
    if args.write_trace and not Path(args.write_trace).resolve().parent.is_dir():
        raise ConfigError("--write-trace", args.write_trace, "its directory does not exist")
    if args.no_system_prompt and args.workload != "sharegpt":
        raise ConfigError("--no-system-prompt", True, "only for sharegpt (sharegpt-nosys implies it)")


def build(args: argparse.Namespace) -> tuple[list, dict]:
    """The requests, and for a trace what its reader passed over."""
    n = args.conversations if args.conversations is not None else DEFAULT_CONVERSATIONS
    if args.workload == "synthetic":
        return synthetic(n, args.seed, preset=args.preset), {}
    if args.workload in ("sharegpt", "sharegpt-nosys"):
        nosys = args.no_system_prompt or args.workload == "sharegpt-nosys"
        system_prompt = "" if nosys else DEFAULT_SYSTEM_PROMPT
        return sharegpt(n, args.seed, args.max_prompt_tokens, system_prompt=system_prompt), {}
    if args.workload != "trace":
        return build_family(args.workload, n, args.seed), {}
    if not args.trace:
        raise ConfigError("--trace", None, "workload 'trace' needs --trace FILE")
    loaded = read_trace(args.trace)
    return loaded.requests, loaded.info()


def describe(args: argparse.Namespace) -> dict:
    """Build (or, for production, generate and write) the workload; the report as a dict."""
    if args.workload == "production":
        n = args.requests if args.requests is not None else DEFAULT_REQUESTS
        written = write_production_trace(args.write_trace, n, args.seed, block_size=args.block_size,
                                         partial_tail=not args.full_blocks_only)
        out: dict = {"workload": args.workload, "stats": written.stats.as_dict()}
        if args.write_trace:
            out["trace_written"] = {k: v for k, v in written.__dict__.items() if k != "stats"}
        return out
    requests, info = build(args)
    stats = summarize(requests, page_tokens=args.page_tokens if args.page_tokens is not None else 256)
    out = {"workload": args.workload, "stats": stats.as_dict()}
    if info:
        out["trace_read"] = info
    if args.write_trace:
        trace = write_trace(requests, args.write_trace, args.block_size, partial_tail=not args.full_blocks_only,
                            conversation_ids=not args.no_conversation_ids)
        out["trace_written"] = dict(trace.__dict__)
    return out


def run(args: argparse.Namespace) -> int:
    t0 = time.perf_counter()
    _check_sizes(args)
    print(f"{PROG}: building {args.workload} ...", file=sys.stderr)
    out = describe(args)
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
