"""Write a workload's requests as a token trace: one JSON object per line with
``input_ids`` (the prompt) and ``output_ids`` (the decoded tokens), in arrival order.

    python bench/token_trace.py sharegpt --conversations 300 --seed 0 --out sharegpt-300.tokens.jsonl

This is the input of ``hicache bench tree --trace`` and of ``bench/sglang_tree_compare.py``,
so both sides see the same token ids. Multi-turn workloads keep "turn k+1's prompt starts
with turn k's prompt + output", which is what makes prefix reuse possible. Bad input prints
one line and exits 2.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from hicache.errors import HiCacheError  # noqa: E402

PROG = "bench/token_trace.py"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog=PROG, description=__doc__.split("\n\n")[0])
    p.add_argument("workload", choices=["sharegpt", "synthetic"])
    p.add_argument("--conversations", type=int, default=300)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--max-prompt-tokens", type=int, default=131_072, help="sharegpt: longest prompt kept")
    p.add_argument("--preset", default="chat", help="synthetic preset")
    p.add_argument("--out", required=True, help="output JSONL path")
    args = p.parse_args(argv)
    try:
        from hicache.engine.workloads import sharegpt, synthetic

        if args.workload == "sharegpt":
            requests = sharegpt(args.conversations, args.seed, args.max_prompt_tokens)
        else:
            requests = synthetic(args.conversations, args.seed, preset=args.preset)
    except HiCacheError as exc:
        print(f"{PROG}: error: {exc}", file=sys.stderr)
        return 2
    tokens = 0
    with open(args.out, "w", encoding="utf-8") as f:
        for r in requests:
            f.write(json.dumps({"input_ids": r.prompt.tolist(), "output_ids": r.output.tolist()},
                               separators=(",", ":")))
            f.write("\n")
            tokens += len(r.prompt) + len(r.output)
    print(json.dumps({"out": args.out, "requests": len(requests), "tokens": tokens}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
