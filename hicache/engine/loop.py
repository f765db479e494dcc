"""A reference serving loop that embeds ``HiCache`` the way SGLang or vLLM would.

The scheduling (continuous batching, admission, chunked prefill, decode strides, the
virtual clock) is :class:`hicache.engine.scheduler.Scheduler`; this module is what it asks
of the cache, per request::

    arrive:   match -> prefetch from L3 (the lookup runs now; the fetch lands on the clock)
    admit:    finish_prefetch(landed_pages from the clock) -> match -> load (queued)
    step:     one cache.step() for all loads
    prefill:  wait -> verify borrowed pages -> alloc -> compute chunk -> publish (mid-flight)
    decode:   compute stride ... last stride -> publish at finish with a snapshot -> release
    end:      cache.poll()  (waiting for the step's copies: EngineConfig.copy_landing)

"Compute" writes synthetic page and snapshot contents derived from the token prefix
(:mod:`hicache.engine.contents`), so every page a request borrows -- whichever tier it came
from -- is checked (``EngineConfig.verify``: every byte, sampled words, or nothing). A
request whose pages cannot be allocated is preempted (released and re-queued), as engines
do. Copies and L3 reads happen for real; only the time they take is the clock's. On pools
without bytes (``PoolConfig.bytes_mode="none"``: a policy-only replay) nothing is written,
copied or checked (``verify`` must be ``off``) and every decision is the same: the clock
charges the bytes the copies would have moved.

``ReferenceEngine.run`` replays the requests twice: once without any cache (only the
clock runs: the baseline time to first token) and once through the cache.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Sequence

import numpy as np

from hicache.cache import Boundary, HiCache, Lease, Prefetch
from hicache.engine import contents
from hicache.engine.clock import ClockConfig
from hicache.engine.records import (ADMISSION_POLICIES, CopyLanding, EngineConfig, EngineReport, EngineRequest,
                                    Job, NullExecutor, RequestRecord)
from hicache.engine.scheduler import Scheduler
from hicache.errors import ConfigError

__all__ = ["ADMISSION_POLICIES", "CacheExecutor", "EngineConfig", "EngineReport", "ReferenceEngine",
           "RequestRecord"]


@dataclass(eq=False)
class _Held:
    """A running request's hold on the cache."""

    lease: Lease
    tokens: np.ndarray      # prompt + output
    hashes: list[bytes]     # page hashes: the contents' seeds (empty with verify off)


def _held(job: Job) -> _Held:
    """``job``'s hold on the cache (set by :meth:`CacheExecutor.admit`)."""
    held = job.handle
    assert isinstance(held, _Held), f"request {job.req.request_id} was not admitted by a CacheExecutor"
    return held


@dataclass(eq=False)
class _Prefetch:
    pf: Prefetch | None     # the facade's Prefetch, None when there was nothing to fetch
    start_s: float
    pages: int = 0
    page_bytes: int = 0
    state_bytes: int = 0    # > 0 when the plan carries a snapshot (usable only whole)


# Device snapshots one running request may pin at once: the one it resumed from, the newest
# it published, and the one it is capturing before publishing it.
SNAPSHOTS_PER_REQUEST = 3


def snapshot_overhead_pages(cache: HiCache) -> int:
    """Pages' worth of device bytes each running request's pinned snapshots take from the
    page budget: with a shared budget snapshots live in the same arena as pages, so
    admission must count them (or it over-admits and preempts); split pools give snapshots
    their own rows, so nothing."""
    pools = cache.pools.device
    if pools.arena is None or not cache.layout.object_bytes("state"):
        return 0
    page, state = cache.layout.object_bytes("page"), cache.layout.object_bytes("state")
    return -(-SNAPSHOTS_PER_REQUEST * state // page)


def request_slots(cache: HiCache) -> int | None:
    """Requests the device's state rows let run at once (one each), or None for no limit.

    Split pools give snapshots rows of their own, and a running request holds one of them
    for as long as it runs: the newest snapshot it published is its working state (for a
    moment two or three, see ``SNAPSHOTS_PER_REQUEST``). Admitting more requests than there
    are rows does not fail at once, it fails quietly: the next request's load finds no
    free state row for its resume snapshot and falls back to the deepest point already on
    the device (often none: the whole prompt recomputed). On a 0.25 GiB DeepSeek-V4-Flash
    device (13 state rows) 16 running requests cost a ShareGPT trace 2.5 points of hits
    that way (71 fallbacks; none at 13). An arena budget counts the same bytes in
    :func:`snapshot_overhead_pages` instead; layouts without state have nothing to count."""
    pools = cache.pools.device
    if pools.arena is not None or not cache.layout.object_bytes("state"):
        return None
    return max(1, pools.capacity("state"))


class CacheExecutor:
    """The scheduler's requests carried out on a :class:`HiCache`, with the clock deciding
    how much of each L3 prefetch has landed when its request is admitted."""

    def __init__(self, cache: HiCache, verify: contents.VerifyMode, clock: ClockConfig,
                 copy_landing: CopyLanding = "step"):
        if not cache.pools.holds_bytes and verify != "off":
            raise ConfigError("verify", verify, "pools without bytes (a policy-only run) have nothing to "
                                                "write or check: use off")
        self.cache = cache
        self.settle = copy_landing == "step"   # EngineConfig.copy_landing
        self.mode = verify
        self.clock = clock
        self.page_tokens = cache.page_tokens
        self.device_pages = cache.pools.device.capacity("page")
        self.request_overhead_pages = snapshot_overhead_pages(cache)
        self.request_slots = request_slots(cache)
        self.cache_pages = int(cache.pools.plan.page_units()[0])   # device + host bytes, in pages
        self.resume_points: str | None = "snapshots" if cache.layout.has_state else "pages"
        # write_back copies a page to the host when the device evicts it, before the row
        # is reused: on the critical path. Write-through backups run beside the compute.
        self.blocking_d2h = cache.config.write.write_policy == "write_back"
        self.policy = cache.config.storage.prefetch_policy
        self.timeout_s = cache.config.storage.prefetch_timeout_s
        self._prefetches: dict[int, _Prefetch] = {}

    # -- L3 prefetch on the clock -------------------------------------------------------
    def prefetch(self, req: EngineRequest, start_s: float) -> float:
        """Start ``req``'s L3 prefetch as of ``start_s``; returns when the prefetch policy
        lets it be admitted (best_effort: any time; wait_complete: when the whole fetch has
        landed; timeout: that, or ``prefetch_timeout_s`` after the start)."""
        pf = self.cache.prefetch(self.cache.match(np.asarray(req.prompt, np.int32)))
        p = _Prefetch(pf, start_s)
        self._prefetches[req.request_id] = p
        plan = None
        if pf is not None:
            pf.op.wait_planned()  # the lookup, for real; the clock charges it a round trip
            plan = pf.op.plan
        if plan is None:
            return start_s
        p.pages, p.page_bytes = plan.pages, plan.page_bytes
        p.state_bytes = plan.state_bytes if plan.state_index is not None else 0
        land = start_s + self.clock.fetch_s(plan.nbytes)
        if self.policy == "wait_complete":
            return land
        if self.policy == "timeout":
            return min(land, start_s + self.timeout_s)
        return start_s

    def forget(self, req: EngineRequest) -> None:
        self.forget_id(req.request_id)

    def expect(self, req: EngineRequest) -> None:
        self.cache.expect(req.prompt)

    def drop_prefetches(self) -> list[int]:
        """Cancel every prefetch of a queued request (they pin prefixes); their ids."""
        dropped = list(self._prefetches)
        for rid in dropped:
            self.forget_id(rid)
        return dropped

    def forget_id(self, rid: int) -> None:
        p = self._prefetches.pop(rid, None)
        if p is not None and p.pf is not None:
            self.cache.cancel_prefetch(p.pf)

    def _finish_prefetch(self, job: Job, now: float) -> None:
        p = self._prefetches.pop(job.req.request_id, None)
        if p is None or p.pf is None:
            return
        landed = self.clock.landed_pages(now - p.start_s, p.pages, p.page_bytes, p.state_bytes)
        if job.record.l3_planned_pages == 0:
            job.record.l3_planned_pages, job.record.l3_landed_pages = p.pages, landed
        if landed == 0:
            self.cache.cancel_prefetch(p.pf)  # nothing would have arrived: read nothing
        else:
            self.cache.finish_prefetch(p.pf, landed_pages=landed)

    # -- per request --------------------------------------------------------------------
    def admit(self, job: Job, now: float, first: bool) -> int:
        self._finish_prefetch(job, now)
        req, rec = job.req, job.record
        prompt = np.asarray(req.prompt, np.int32)
        tokens = np.concatenate([prompt, np.asarray(req.output, np.int32)])
        hashes = self.cache.page_hashes(tokens) if self.mode != "off" else []   # the contents' seeds
        match = self.cache.match(prompt)
        job.branch = match.branch_tokens
        lease = self.cache.load(match, start=False)
        job.handle = _Held(lease, tokens, hashes)
        hit = lease.resume_tokens
        if first:
            # Hits are what the cache offered when the request arrived. A preempted request
            # re-admitted later resumes from pages it published itself; counting that as a
            # hit would reward preemption, so it only adds to the recomputed work.
            rec.hit_tokens = hit
            rec.l3_hit_tokens = lease.l3_tokens
            rec.host_hit_tokens = lease.loaded_tokens - lease.l3_tokens
            rec.device_hit_tokens = hit - lease.loaded_tokens
            rec.recomputed_tokens = len(prompt) - hit
        else:
            rec.readmission_recomputed_tokens += len(prompt) - hit
        return hit

    def verify(self, job: Job) -> bool:
        """Wait for the request's loads and check its borrowed pages; False if a load failed."""
        held = _held(job)
        if not held.lease.wait():
            return False
        good, bad, sgood, sbad = contents.verify_prefix(self.cache, held.lease, held.hashes, self.mode)
        job.record.verified_pages += good + sgood
        job.record.mismatched_pages += bad + sbad
        return True

    def compute(self, job: Job, upto: int) -> bool:
        held = _held(job)
        return contents.compute(self.cache, held.lease, held.hashes, job.done, upto, self.mode)

    def publish(self, job: Job, why: Boundary) -> None:
        held = _held(job)
        if why is Boundary.PREFILL and job.done // self.page_tokens <= held.lease.published_pages:
            return
        contents.publish(self.cache, held.lease, held.tokens, job.done, held.hashes, why, self.mode)

    def release(self, job: Job) -> None:
        self.cache.release(_held(job).lease)

    # -- the cache's own pace -----------------------------------------------------------
    def step(self) -> None:
        self.cache.step()

    def poll(self, now: float) -> None:
        """The step's end: copies land (per ``copy_landing``); L3 admission is paced by the
        virtual clock ``now``, so a replay's L3 writes repeat exactly."""
        self.cache.poll(wait=self.settle, now=now)

    def drain(self) -> None:
        self.cache.drain()

    def moved(self) -> tuple[int, int]:
        """Bytes of the host -> device and device -> host copies launched so far (counted
        at launch, which happens at fixed points of the replay, not when a copy thread
        finishes: the clock does not depend on thread timing)."""
        t = self.cache.transfer_stats()
        return t["h2d"]["launched_bytes"], t["d2h"]["launched_bytes"]

    def close(self) -> None:
        self.drop_prefetches()


class ReferenceEngine:
    """Runs requests (objects with ``request_id``, ``conversation_id``, ``turn``,
    ``arrival_s``, ``prompt``, ``output``) through a :class:`HiCache` on the virtual clock,
    and the same requests without any cache for the baseline time to first token."""

    def __init__(self, cache: HiCache, cfg: EngineConfig = EngineConfig(),
                 progress: Callable[[int, int], None] | None = None):
        self.cache = cache
        self.cfg = cfg
        self.progress = progress

    def run(self, requests: Sequence) -> EngineReport:
        ex = CacheExecutor(self.cache, self.cfg.verify, self.cfg.clock, self.cfg.copy_landing)
        # The baseline admits on the same device budget: pages, snapshots' overhead, slots.
        null = NullExecutor(ex.page_tokens, ex.device_pages, ex.request_overhead_pages, ex.request_slots)
        baseline = Scheduler(null, self.cfg).run(requests)
        report = Scheduler(ex, self.cfg, self.progress).run(requests)
        uncached = {r.request_id: r.ttft_s for r in baseline.records}
        for r in report.records:
            r.ttft_uncached_s = uncached.get(r.request_id)
        report.wall_s += baseline.wall_s
        return report
