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
connection, as separate processes would -- and with :mod:`hicache.engine.fleet_proc`
they are separate processes: the same driver over :class:`FleetEngine` s that each live in
an OS process of their own, in lock step on the one clock.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Callable, Protocol, Sequence

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


class FleetEngine(Protocol):
    """One engine as the driver sees it: a scheduler over a cache, here or in a process
    of its own (:mod:`hicache.engine.fleet_proc`)."""

    @property
    def now(self) -> float:
        """The engine's virtual clock."""

    def begin(self, requests: Sequence) -> None: ...
    def add(self, req) -> None: ...
    def busy_now(self) -> bool: ...
    def advance(self) -> list:
        """One scheduler iteration; the turns that ended in it, as ``(request, clock)``."""
    def finish(self) -> tuple[EngineReport, dict]:
        """Drain the cache; its report and its cache stats."""


class LocalEngine:
    """A :class:`FleetEngine` in this process: a :class:`Scheduler` over ``cache``."""

    def __init__(self, cache: HiCache, cfg: EngineConfig):
        self.cache = cache
        self.sched = Scheduler(CacheExecutor(cache, cfg.verify, cfg.clock, cfg.copy_landing), cfg)
        self._ended: list = []
        self.sched.on_turn_end = lambda req, now: self._ended.append((req, now))

    @property
    def now(self) -> float:
        return self.sched.now

    def begin(self, requests: Sequence) -> None:
        self.sched.begin(requests)

    def add(self, req) -> None:
        self.sched.add(req)

    def busy_now(self) -> bool:
        return self.sched.busy_now()

    def advance(self) -> list:
        self.sched.advance()
        ended, self._ended = self._ended, []
        return ended

    def finish(self) -> tuple[EngineReport, dict]:
        self.sched.end()
        return self.sched.report, self.cache.stats()


def run_fleet(caches: Sequence[HiCache], cfg: EngineConfig, requests: Sequence, routing: str,
              progress: Callable[[int, int], None] | None = None) -> FleetRun:
    """Serve ``requests`` on ``caches`` (one engine each, in this process) as a router
    would (module doc). The caches stay open (their stats are read here); the caller
    closes them."""
    return drive([LocalEngine(c, cfg) for c in caches], requests, routing, progress)


def drive(engines: Sequence[FleetEngine], requests: Sequence, routing: str,
          progress: Callable[[int, int], None] | None = None) -> FleetRun:
    """Route ``requests`` over ``engines`` and run them on one virtual clock: always the
    engine furthest behind advances one iteration; a conversation's next turn goes to its
    engine when the previous turn ends, arriving no earlier than that end."""
    n = len(engines)
    where = assign(requests, n, routing)
    turns: dict[str, list] = {}
    for req in sorted(requests, key=lambda r: (int(r.turn), r.arrival_s, r.request_id)):
        turns.setdefault(str(req.conversation_id), []).append(req)
    done = 0
    first: list[list] = [[] for _ in range(n)]
    for conv, reqs in turns.items():
        head = reqs.pop(0)
        first[where[head.request_id]].append(head)
    for e, reqs in zip(engines, first):
        e.begin(reqs)
    try:
        while True:
            live = [e for e in engines if e.busy_now()]
            if not live:
                break
            for req, now in min(live, key=lambda e: e.now).advance():
                done += 1
                if progress is not None:
                    progress(done, len(requests))
                rest = turns.get(str(req.conversation_id))
                if rest:
                    nxt = rest.pop(0)
                    engines[where[nxt.request_id]].add(_later(nxt, now))
    except BaseException:
        for e in engines:          # drain what can be drained; the first failure is what counts
            try:
                e.finish()
            except Exception:
                pass
        raise
    results = [e.finish() for e in engines]
    reports = [r for r, _ in results]
    return FleetRun(reports, [st for _, st in results], routing,
                    wall_s=max((r.wall_s for r in reports), default=0.0))
