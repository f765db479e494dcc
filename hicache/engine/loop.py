"""A reference serving loop that embeds ``HiCache`` the way SGLang or vLLM would.

Continuous batching: each step admits arrived requests up to ``max_running``, gives every
running request a page-aligned prefill chunk or a decode stride within a token budget,
and publishes what it computed::

    admit:    match -> (L3 prefetch) -> load (queued) ...... one cache.step() for all loads
    prefill:  wait -> verify borrowed pages -> alloc -> compute chunk -> publish (mid-flight)
    decode:   compute stride ... last stride -> publish at finish with a snapshot -> release
    end:      cache.poll()

"Compute" writes synthetic page and snapshot contents derived from the token prefix
(:mod:`hicache.engine.contents`), so every page a request borrows -- whichever tier it came
from -- is checked byte for byte. A request whose pages cannot be allocated is preempted
(released and re-queued), as engines do.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Callable, Sequence

import numpy as np

from hicache.cache import Boundary, HiCache, Lease
from hicache.engine import contents
from hicache.errors import ConfigError


ADMISSION_POLICIES = ("reserve", "greedy")


@dataclass(frozen=True)
class EngineConfig:
    """Scheduling knobs of the reference engine.

    ``admission``: ``reserve`` (default) admits a request only while the device pages that
    running requests will hold at their finish (prompt + output each, counted whole) plus
    its own fit the device pool, first come first served; cached prefixes fill the rest and
    are evicted as requests grow, so no request is preempted for room. ``greedy`` admits up
    to ``max_running`` and preempts the youngest requests when pages run out (what an
    engine without a memory-aware scheduler does; on a small device pool it thrashes).

    ``prefill_tokens_per_s`` (optional) turns recomputed tokens into an estimated
    time-to-first-token; ``decode_stride`` is how many output tokens a request decodes per
    step (the cache only sees decoded tokens at finish, so this sets how long a request
    holds its pages, not what is cached).
    """

    max_running: int = 16
    step_tokens: int = 16384
    chunk_tokens: int = 4096
    decode_stride: int = 64
    prefill_tokens_per_s: float | None = None
    verify: bool = True
    admission: str = "reserve"

    def __post_init__(self) -> None:
        for name in ("max_running", "step_tokens", "chunk_tokens", "decode_stride"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise ConfigError(name, v, "must be an integer >= 1")
        if self.admission not in ADMISSION_POLICIES:
            raise ConfigError("admission", self.admission, f"must be one of {list(ADMISSION_POLICIES)}")
        if self.prefill_tokens_per_s is not None and self.prefill_tokens_per_s <= 0:
            raise ConfigError("prefill_tokens_per_s", self.prefill_tokens_per_s, "must be > 0")


@dataclass
class RequestRecord:
    """What happened to one request (one line of ``--requests-out``)."""

    request_id: int
    conversation_id: str
    turn: int
    prompt_tokens: int
    hit_tokens: int = 0
    device_hit_tokens: int = 0
    host_hit_tokens: int = 0
    l3_hit_tokens: int = 0
    recomputed_tokens: int = 0
    preemptions: int = 0
    readmission_recomputed_tokens: int = 0  # prompt tokens recomputed after a preemption
    verified_pages: int = 0
    mismatched_pages: int = 0
    finish_step: int = 0
    rejected: bool = False   # needs more device pages than the device has: never run
    finished: bool = False   # ran to its last output token


@dataclass
class _Running:
    req: object
    record: RequestRecord
    lease: Lease
    tokens: np.ndarray      # prompt + output
    prompt_len: int
    hashes: list[bytes]
    done: int               # tokens computed
    verified: bool = False


@dataclass
class EngineReport:
    records: list[RequestRecord] = field(default_factory=list)
    steps: int = 0
    preemptions: int = 0
    rejected: int = 0
    verified_pages: int = 0
    mismatched_pages: int = 0
    wall_s: float = 0.0


class ReferenceEngine:
    """Runs requests (objects with ``request_id``, ``conversation_id``, ``turn``,
    ``arrival_s``, ``prompt``, ``output``) through a :class:`HiCache`."""

    def __init__(self, cache: HiCache, cfg: EngineConfig = EngineConfig(),
                 progress: Callable[[int, int], None] | None = None):
        self.cache = cache
        self.cfg = cfg
        self.P = cache.page_tokens
        self.progress = progress
        self.has_state = bool(cache.layout.object_bytes("state"))
        self.report = EngineReport()

    # -- per request --------------------------------------------------------------------
    def _admit(self, req) -> _Running | None:
        prompt = np.asarray(req.prompt, np.int32)
        tokens = np.concatenate([prompt, np.asarray(req.output, np.int32)])
        hashes = self.cache.page_hashes(tokens)
        rec = self._records.get(req.request_id)
        first = rec is None
        if first:
            rec = RequestRecord(req.request_id, str(req.conversation_id), int(req.turn), len(prompt))
            self._records[req.request_id] = rec
        pf = self._prefetching.pop(req.request_id, None)
        if pf is not None:
            self.cache.finish_prefetch(pf)
        lease = self.cache.load(self.cache.match(prompt), start=False)
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
        self._reserved += self._footprint(req)
        return _Running(req, rec, lease, tokens, len(prompt), hashes, done=hit)

    def _footprint(self, req) -> int:
        """Device pages ``req`` holds at its finish (prompt + output)."""
        return -(-(len(req.prompt) + len(req.output)) // self.P)

    def _fits(self, req, deferred: list) -> bool:
        """Admission control: may ``req`` start now without taking others' room?

        ``deferred`` requests (admitted, waiting a step for their prefetch) count as running.
        """
        held = self._reserved + sum(self._footprint(r) for r in deferred)
        if self.cfg.admission == "greedy" or held == 0:
            return True
        return held + self._footprint(req) <= self._device_pages

    def _start_prefetch(self, req) -> bool:
        """Start an L3 prefetch for ``req`` if the host misses part of its prompt.

        Returns True when the request should wait a step for it (``best_effort``: the
        lookup runs while this step computes); other policies block in finish_prefetch.
        """
        m = self.cache.match(np.asarray(req.prompt, np.int32))
        pf = self.cache.prefetch(m)
        if pf is None:
            return False
        self._prefetching[req.request_id] = pf
        return self.cache.config.storage.prefetch_policy == "best_effort"

    def _verify(self, run: _Running) -> None:
        if self.cfg.verify:
            good, bad, sgood, sbad = contents.verify_prefix(self.cache, run.lease, run.hashes)
            run.record.verified_pages += good + sgood
            run.record.mismatched_pages += bad + sbad
        run.verified = True

    def _compute(self, run: _Running, upto: int) -> bool:
        if not contents.compute(self.cache, run.lease, run.hashes, run.done, upto):
            return False
        run.done = upto
        return True

    def _publish(self, run: _Running, why: Boundary) -> bool:
        if run.done // self.P <= run.lease.published_pages and why is Boundary.PREFILL:
            return True
        contents.publish(self.cache, run.lease, run.tokens, run.done, run.hashes, why)
        return True

    def _release(self, run: _Running) -> None:
        self.cache.release(run.lease)
        self._reserved -= self._footprint(run.req)

    def _preempt(self, run: _Running, running: list, retry: list) -> None:
        self._release(run)
        running.remove(run)
        run.record.preemptions += 1
        self.report.preemptions += 1
        retry.insert(0, run.req)

    def _make_room(self, run: _Running, target: int, running: list, retry: list) -> bool:
        """Compute up to ``target``; on no room, let in-flight copies finish (they pin
        pages), then preempt the youngest other requests -- never the oldest, so some
        request always makes progress (no livelock of mutual preemption)."""
        if self._compute(run, target):
            return True
        self.cache.drain()
        if self._compute(run, target):
            return True
        for other in sorted((r for r in running if r is not run), key=lambda r: -r.req.request_id):
            if other.req.request_id < run.req.request_id:
                break  # older requests keep their pages
            self._preempt(other, running, retry)
            if self._compute(run, target):
                return True
        return False

    # -- the loop -----------------------------------------------------------------------
    def run(self, requests: Sequence) -> EngineReport:
        t0 = time.perf_counter()
        self._records: dict[int, RequestRecord] = {}
        self._prefetching: dict[int, object] = {}
        self._device_pages = self.cache.pools.device.capacity("page")
        self._reserved = 0  # footprints of running requests
        deferred: list = []   # admitted, waiting one step for their L3 prefetch
        waiting = sorted(requests, key=lambda r: (r.arrival_s, r.request_id))
        waiting.reverse()  # pop() from the end = earliest arrival
        running: list[_Running] = []
        retry: list = []
        now, finished, total = 0.0, 0, len(waiting)
        # A conversation's turn k+1 starts only after turn k finished (its prompt holds
        # turn k's output); arrival times alone cannot know how long turn k took.
        busy: set[str] = set()
        held: dict[str, list] = {}

        def next_turn(conv: str) -> None:
            """A conversation's turn ended: its next held turn may start."""
            busy.discard(conv)
            if held.get(conv):
                retry.append(held[conv].pop(0))
                busy.add(conv)
                if not held[conv]:
                    del held[conv]
        while waiting or running or retry or held or deferred:
            for req in deferred:
                running.append(self._admit(req))
            deferred = []
            while len(running) + len(deferred) < self.cfg.max_running and (retry or waiting):
                from_retry = bool(retry)
                if from_retry:
                    req = retry[0]
                elif waiting[-1].arrival_s <= now or not running:
                    req = waiting[-1]
                    conv = str(req.conversation_id)
                    if conv in busy:  # its previous turn is still running: hold it
                        waiting.pop()
                        now = max(now, req.arrival_s)
                        held.setdefault(conv, []).append(req)
                        continue
                else:
                    break
                too_big = self._footprint(req) > self._device_pages
                if not too_big and not self._fits(req, deferred):
                    break  # first come, first served: wait until running requests finish
                if from_retry:
                    retry.pop(0)
                else:
                    waiting.pop()
                    now = max(now, req.arrival_s)
                    busy.add(str(req.conversation_id))
                if too_big:
                    rec = RequestRecord(req.request_id, str(req.conversation_id), int(req.turn), len(req.prompt),
                                        recomputed_tokens=len(req.prompt), rejected=True)
                    self._records[req.request_id] = rec
                    self.report.rejected += 1
                    next_turn(str(req.conversation_id))
                    continue
                # A request waits one step for its L3 prefetch on first admission only: a
                # retried one (preempted, or a failed load) runs with what has landed, so
                # no request is deferred forever.
                if self._start_prefetch(req) and not from_retry:
                    deferred.append(req)
                else:
                    running.append(self._admit(req))
            assert running or retry or waiting or deferred or not held, "held turns with nothing running"
            self.cache.step()  # every load of this step as one batched copy
            budget = self.cfg.step_tokens
            for run in list(running):
                if budget <= 0:
                    break
                if run not in running:  # preempted by an older request this step
                    continue
                if not run.verified:
                    if not run.lease.wait():  # a failed load: recompute from scratch
                        self._release(run)
                        running.remove(run)
                        retry.append(run.req)
                        continue
                    self._verify(run)
                before = run.done
                if run.done < run.prompt_len:
                    step = max(min(self.cfg.chunk_tokens, budget) // self.P * self.P, self.P)
                    target = min(run.done - run.done % self.P + step, run.prompt_len)
                    why = Boundary.PROMPT_END if target == run.prompt_len else Boundary.PREFILL
                    ok = self._make_room(run, target, running, retry) and self._publish(run, why)
                else:
                    target = min(run.done + self.cfg.decode_stride, len(run.tokens))
                    ok = self._make_room(run, target, running, retry)
                    if ok and target == len(run.tokens):
                        self._publish(run, Boundary.FINISH)
                        self._release(run)
                        running.remove(run)
                        run.record.finish_step = self.report.steps
                        run.record.finished = True
                        finished += 1
                        next_turn(str(run.req.conversation_id))
                        budget -= target - before
                        if self.progress is not None:
                            self.progress(finished, total)
                        continue
                budget -= run.done - before
                if not ok:  # no device room even after preempting others: wait for a retry
                    self._preempt(run, running, retry)
            self.cache.poll()
            self.report.steps += 1
            now += self._step_seconds()
        self.cache.drain()
        self.report.records = [self._records[k] for k in sorted(self._records)]
        self.report.verified_pages = sum(r.verified_pages for r in self.report.records)
        self.report.mismatched_pages = sum(r.mismatched_pages for r in self.report.records)
        self.report.wall_s = time.perf_counter() - t0
        return self.report

    def _step_seconds(self) -> float:
        rate = self.cfg.prefill_tokens_per_s or 20_000.0
        return self.cfg.step_tokens / rate
