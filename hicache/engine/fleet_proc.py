"""Fleet engines as separate OS processes, driven in lock step (``hicache fleet --processes``).

Each engine -- its :class:`~hicache.cache.HiCache` (device and host pools, transfer threads,
its own connection to the L3 store) and its scheduler -- lives in a process of its own,
started with ``spawn`` (no state inherited from the driver). The driver in this process
keeps the one virtual clock (:func:`hicache.engine.fleet.drive`); each engine answers over
a pipe::

    driver                          engine process
    ------                          --------------
    ("begin", requests)   ------>   Scheduler.begin
    ("add", request)      ------>   Scheduler.add
    ("advance",)          ------>   one iteration
                          <------   ("ok", (clock, busy, turns ended))
    ("finish",)           ------>   Scheduler.end, HiCache.stats, HiCache.close
                          <------   ("ok", (report, stats)); the process exits

Every reply carries the engine's clock and whether it has work left, so the driver's loop
costs one round trip per iteration. The decisions are those of the in-process fleet: the
same driver, the same routing, the same scheduler; only the caches are apart, so what one
engine finds of another's work goes through the store for real (a store that lives in one
process, ``memory://``, cannot be shared and is refused). An engine that raises answers
``("error", one line)``; one that dies is reported by the driver as a
:class:`~hicache.errors.HiCacheError` naming it, and the others are stopped.
"""

from __future__ import annotations

import multiprocessing as mp
from typing import Any, Callable, Sequence

from hicache.config import HiCacheConfig
from hicache.engine.fleet import FleetRun, drive
from hicache.engine.records import EngineConfig, EngineReport
from hicache.errors import ConfigError, HiCacheError
from hicache.layout import CacheLayout
from hicache.storage import memory_store_name

REPLY_TIMEOUT_S = 600.0     # one iteration (or a drain) taking longer means a hung engine


def _serve(conn, layout: CacheLayout, cfg: HiCacheConfig, ecfg: EngineConfig) -> None:
    """The engine process: build the cache, then answer the driver until ``finish``."""
    from hicache.cache import HiCache
    from hicache.engine.fleet import LocalEngine

    cache = None
    try:
        cache = HiCache(layout, cfg)
        engine = LocalEngine(cache, ecfg)
        conn.send(("ok", None))
        while True:
            op, args = conn.recv()
            if op == "finish":
                report, stats = engine.finish()
                conn.send(("ok", (report, stats)))
                return
            ended: list = []
            if op == "begin":
                engine.begin(args[0])
            elif op == "add":
                engine.add(args[0])
            elif op == "advance":
                ended = engine.advance()
            else:
                raise AssertionError(f"unknown op {op!r}")
            conn.send(("ok", (engine.now, engine.busy_now(), ended)))
    except BaseException as exc:     # the driver names the engine and stops the others
        try:
            conn.send(("error", f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"))
        except (OSError, ValueError):
            pass
    finally:
        if cache is not None:
            cache.close()
        conn.close()


class ProcessEngine:
    """A :class:`~hicache.engine.fleet.FleetEngine` in its own OS process (module doc)."""

    def __init__(self, index: int, layout: CacheLayout, cfg: HiCacheConfig, ecfg: EngineConfig,
                 ctx: Any = None):
        ctx = ctx or mp.get_context("spawn")
        self.index = index
        self.conn, child = ctx.Pipe()
        self.proc = ctx.Process(target=_serve, args=(child, layout, cfg, ecfg), name=f"hicache-engine-{index}",
                                daemon=True)
        self.proc.start()
        child.close()
        self.now, self._busy = 0.0, False
        # broken: a call failed or was interrupted between its send and its reply, so the
        # pipe's next message is not the answer to the next call; nothing more is asked
        self.broken = True
        try:
            self._reply()        # the cache is built (or its error is raised here)
        except BaseException:
            self.stop()
            raise

    def _reply(self) -> Any:
        if not self.conn.poll(REPLY_TIMEOUT_S):
            raise HiCacheError(f"fleet engine #{self.index} (pid {self.proc.pid}) did not answer in "
                               f"{REPLY_TIMEOUT_S:.0f} s")
        try:
            status, value = self.conn.recv()
        except (EOFError, OSError):
            self.proc.join(5)
            raise HiCacheError(f"fleet engine #{self.index} (pid {self.proc.pid}) exited "
                               f"(exit code {self.proc.exitcode})") from None
        if status == "error":
            raise HiCacheError(f"fleet engine #{self.index}: {value}")
        self.broken = False
        return value

    def _call(self, op: str, *args: Any) -> Any:
        if self.broken:
            raise HiCacheError(f"fleet engine #{self.index} (pid {self.proc.pid}) failed earlier; not asked again")
        self.broken = True
        try:
            self.conn.send((op, args))
        except (BrokenPipeError, OSError):
            raise HiCacheError(f"fleet engine #{self.index} (pid {self.proc.pid}) exited "
                               f"(exit code {self.proc.exitcode})") from None
        return self._reply()

    def _state(self, op: str, *args: Any) -> list:
        self.now, self._busy, ended = self._call(op, *args)
        return ended

    def begin(self, requests: Sequence) -> None:
        self._state("begin", list(requests))

    def add(self, req) -> None:
        self._state("add", req)

    def busy_now(self) -> bool:
        return self._busy

    def advance(self) -> list:
        return self._state("advance")

    def finish(self) -> tuple[EngineReport, dict]:
        report, stats = self._call("finish")
        self.proc.join(30)
        return report, stats

    def stop(self) -> None:
        """End the process whatever its state (after a failure elsewhere)."""
        if self.proc.is_alive():
            self.proc.kill()
        self.proc.join(10)
        self.conn.close()


def check_shareable(url: str) -> None:
    """Refuse a store engine processes cannot share: ``memory://`` lives in one process
    (each would get a private store, silently)."""
    if memory_store_name(url) is not None:
        raise ConfigError("--storage", url.split("?")[0], "a memory:// store lives inside one process; engine "
                          "processes (--processes) share redis://, file:// or none://")


def run_fleet_processes(layout: CacheLayout, cfg: HiCacheConfig, engines: int, ecfg: EngineConfig,
                        requests: Sequence, routing: str,
                        progress: Callable[[int, int], None] | None = None) -> FleetRun:
    """Serve ``requests`` on ``engines`` engine processes, each with ``cfg``'s budgets and
    its own connection to ``cfg.storage.url`` (which must be shared: Redis, a cluster,
    ``file://``, or ``none://`` for a fleet without L3)."""
    url = cfg.storage.url
    check_shareable(url)
    procs: list[ProcessEngine] = []
    try:
        for i in range(engines):
            procs.append(ProcessEngine(i, layout, cfg, ecfg))
        run = drive(procs, requests, routing, progress)
    finally:
        for p in procs:
            p.stop()
    return run
