"""How faithful the ghosts are, per kind of conversation: a replay that follows one order
throughout, each request's real resume beside what every candidate's ghost resumed.

Why. The selector follows the candidate whose ghost hit most, so a ghost that misjudges one
kind of traffic biases every choice on a mix of it. The replay's ``policy_ghost_hit_tokens``
is one number for the whole run, and a ghost 22% under the cache on one kind and a few
percent over on the others sums to 0.99. Split by kind it shows: on mix-poisson s133 at host
0.25 GiB, following LRU, the reasoning turns hit 6,315 pages in the cache and 4,942 in the
LRU ghost, which let go of a request's snapshots before making room for its published
pages (fixed at the seventeenth freeze; ``docs/policy.md``, "Ghosts")::

    python bench/ghost_fidelity.py [--follow lru] [--json] -- <hicache replay arguments>

The replay runs policy-only (``--bytes none --storage none://``) with ``--eviction
adaptive``, ``--follow`` first among the candidates and a window no run reaches, so the
cache ranks by that order throughout (the floor's second order included, when it is
``lru``, whose column it stays in) while every candidate's ghost is fed its events. A
request's kind is its conversation id up to the first ``-`` or digit (the mix's ``agent``,
``rag``, ``reason``, ``syn``); a trace without conversation ids is one kind. Each admission counts, a preempted
request's re-admission too. ``ratio`` is the followed ghost's pages over the cache's:
above 1 the ghost promises hits the cache does not get. Nothing is asserted.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import re
import sys
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from hicache.cli.common import print_json  # noqa: E402
from hicache.cli.main import main as hicache_main  # noqa: E402
from hicache.config import DEFAULT_CANDIDATES  # noqa: E402
from hicache.engine.loop import CacheExecutor  # noqa: E402
from hicache.tree.selector import PolicySelector  # noqa: E402

NEVER = "100000000"   # an adaptive window no replay fills: the first candidate throughout


def kind_of(conversation_id: object) -> str:
    """A conversation id's leading letters (``reason-12`` -> ``reason``); ``-`` if none."""
    m = re.match(r"[A-Za-z_]+", str(conversation_id))
    return m.group(0).rstrip("_") if m else "-"


class Recorder:
    """Each admission's real resume (pages) beside every ghost's, by the request's kind.

    The selector sees a lease id; the engine's admission sees the request and its lease.
    Both are wrapped for the run: the selector's lookup keeps each lease's ghost hits, and
    the admission that opened the lease files them with the real resume under its kind."""

    def __init__(self) -> None:
        self.names: tuple[str, ...] = ()
        self._pending: dict[object, tuple[int, ...]] = {}
        self.rows: dict[str, dict[str, int]] = defaultdict(lambda: defaultdict(int))

    @contextlib.contextmanager
    def attached(self):
        lookup, admit = PolicySelector.lookup, CacheExecutor.admit
        rec = self

        def on_lookup(sel, request, keys, prompt_pages=None):
            changed = lookup(sel, request, keys, prompt_pages)
            if not rec.names:   # as named at the start: the floor's second order counts as lru
                rec.names = tuple(c.name for c in sel.candidates)
            rec._pending[request] = sel._recent[-1]
            return changed

        def on_admit(ex, job, now, first):
            hit = admit(ex, job, now, first)
            lease = job.handle.lease
            ghosts = rec._pending.pop(lease.lease_id, None)
            if ghosts is not None:
                row = rec.rows[kind_of(job.req.conversation_id)]
                row["lookups"] += 1
                row["pages"] += len(job.req.prompt) // ex.page_tokens
                row["real"] += lease.resume_tokens // ex.page_tokens
                for name, h in zip(rec.names, ghosts):
                    row[name] += h
            return hit

        PolicySelector.lookup, CacheExecutor.admit = on_lookup, on_admit   # type: ignore[method-assign]
        try:
            yield self
        finally:
            PolicySelector.lookup, CacheExecutor.admit = lookup, admit   # type: ignore[method-assign]


def run(follow: str, replay_args: list[str]) -> tuple[int, dict, Recorder]:
    """One replay following ``follow`` (its progress line on stderr, as ``hicache replay``
    prints it); returns its exit status, its summary (empty unless 0) and the recorder."""
    candidates = [follow] + [c for c in DEFAULT_CANDIDATES if c != follow]
    argv = ["replay", *replay_args, "--bytes", "none", "--storage", "none://", "--eviction", "adaptive",
            "--candidates", ",".join(candidates), "--adaptive-window", NEVER, "--json"]
    rec = Recorder()
    out = io.StringIO()
    with rec.attached(), contextlib.redirect_stdout(out):
        rc = hicache_main(argv) or 0
    return rc, (json.loads(out.getvalue()) if rc == 0 else {}), rec


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    split = argv.index("--") if "--" in argv else len(argv)
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--follow", default="lru", help="the order the cache follows throughout (default lru)")
    p.add_argument("--json", action="store_true")
    a = p.parse_args(argv[:split])
    if a.follow not in DEFAULT_CANDIDATES:
        print(f"ghost_fidelity: --follow {a.follow}: not a candidate ({', '.join(DEFAULT_CANDIDATES)})",
              file=sys.stderr)
        return 2
    rc, summary, rec = run(a.follow, argv[split + 1:])
    if rc:
        return rc   # the replay named what was wrong, in one line on stderr
    kinds = sorted(rec.rows)
    rows = [{"kind": k, **rec.rows[k], "ratio": round(rec.rows[k][a.follow] / max(rec.rows[k]["real"], 1), 3)}
            for k in kinds]
    if a.json:
        print_json({"follow": a.follow, "candidates": list(rec.names), "rows": rows, "replay": summary})
        return 0
    names = list(rec.names)
    print(f"following {a.follow}: hit pages per kind, the cache's and each ghost's "
          f"(last-half hit rate {summary.get('hit_rate_last_half')})")
    print("| kind | lookups | pages | cache | " + " | ".join(names) + f" | {a.follow} / cache |")
    print("|---|---|---|---|" + "---|" * (len(names) + 1))
    for r in rows:
        print(f"| {r['kind']} | {r['lookups']} | {r['pages']} | {r['real']} | "
              + " | ".join(str(r[n]) for n in names) + f" | {r['ratio']} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
