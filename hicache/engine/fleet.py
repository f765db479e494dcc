"""Several engines sharing one L3 store, driven on one virtual clock (issue 26 part 3).

A router in front of N engines sends each request to one of them: ``round-robin`` (every
request to the next engine, so a conversation's turns land on different engines and only
L3 carries a prefix from one to the next) or ``conversation`` (sticky: a conversation's
turns stay on the engine its first turn went to; L3 carries only prefixes that
conversations share, such as system prompts). Each engine has its own :class:`HiCache`
(its own device and host budgets, its own connection to the store) and its own scheduler.

Why one driver rather than N free-running processes: a router sends turn k+1 once turn k
has been answered, and on a virtual clock "once" means the driver must know when each
engine's turn ended. The driver always advances the engine whose clock is furthest behind
(one scheduler iteration), and routes a conversation's next turn when its previous turn
ends, arriving at ``max(its own arrival, that end)``. Free-running processes would make
whether engine B finds engine A's pages in L3 depend on the machines' wall-clock speed,
not on the workload. The L3 traffic is real: every engine writes (L3 admission) and
fetches (its prefetch, landing when the clock says the bytes have arrived) through its own
connection, as separate processes would.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Callable, Sequence

from hicache.cache import HiCache
from hicache.engine.loop import CacheExecutor
from hicache.engine.records import EngineConfig, EngineReport
from hicache.engine.scheduler import Scheduler
from hicache.errors import ConfigError

ROUTINGS = ("round-robin", "conversation")


def _later(req, arrival: float):
    """``req`` arriving no earlier than ``arrival`` (a copy when it must move)."""
    if req.arrival_s >= arrival:
        return req
    if dataclasses.is_dataclass(req) and not isinstance(req, type):
        return dataclasses.replace(req, arrival_s=arrival)
    raise ConfigError("fleet", type(req).__name__, "requests must be dataclasses to be routed across engines")


def assign(requests: Sequence, engines: int, routing: str) -> dict[int, int]:
    """Request id -> engine index, as the router would send them (arrival order)."""
    if routing not in ROUTINGS:
        raise ConfigError("--routing", routing, f"must be one of {list(ROUTINGS)}")
    order = sorted(requests, key=lambda r: (r.arrival_s, r.request_id))
    out: dict[int, int] = {}
    sticky: dict[str, int] = {}
    for i, req in enumerate(order):
        if routing == "round-robin":
            out[req.request_id] = i % engines
        else:
            conv = str(req.conversation_id)
            out[req.request_id] = sticky.setdefault(conv, len(sticky) % engines)
    return out


@dataclass
class FleetRun:
    """Per engine, its report (records carry hits per tier and TTFT) and its cache stats."""

    reports: list[EngineReport]
    stats: list[dict]
    routing: str
    wall_s: float = 0.0


def run_fleet(caches: Sequence[HiCache], cfg: EngineConfig, requests: Sequence, routing: str,
              progress: Callable[[int, int], None] | None = None) -> FleetRun:
    """Serve ``requests`` on ``caches`` (one engine each) as a router would (module doc).
    The caches stay open (their stats are read here); the caller closes them."""
    n = len(caches)
    where = assign(requests, n, routing)
    turns: dict[str, list] = {}
    for req in sorted(requests, key=lambda r: (int(r.turn), r.arrival_s, r.request_id)):
        turns.setdefault(str(req.conversation_id), []).append(req)
    scheds = [Scheduler(CacheExecutor(c, cfg.verify, cfg.clock, cfg.copy_landing), cfg) for c in caches]
    done = [0]

    def turn_ended(req, now: float) -> None:
        done[0] += 1
        if progress is not None:
            progress(done[0], len(requests))
        rest = turns.get(str(req.conversation_id))
        if rest:
            nxt = rest.pop(0)
            scheds[where[nxt.request_id]].add(_later(nxt, now))

    first: list[list] = [[] for _ in range(n)]
    for conv, reqs in turns.items():
        head = reqs.pop(0)
        first[where[head.request_id]].append(head)
    for s, reqs in zip(scheds, first):
        s.on_turn_end = turn_ended
        s.begin(reqs)
    try:
        while True:
            live = [s for s in scheds if s.busy_now()]
            if not live:
                break
            min(live, key=lambda s: s.now).advance()
    finally:
        for s in scheds:
            s.end()
    return FleetRun([s.report for s in scheds], [c.stats() for c in caches], routing,
                    wall_s=max((s.report.wall_s for s in scheds), default=0.0))
