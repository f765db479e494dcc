"""The reference engine's scheduler: continuous batching on a virtual clock.

Each step admits queued requests, gives every running request a page-aligned prefill
chunk or a decode stride within a token budget, and advances the clock by what the step
would cost on the modelled server (:mod:`hicache.engine.clock`)::

    arrive:  requests whose arrival time has come join the queue (a conversation's next
             turn waits for the previous turn's finish); prefetches start for the first
             ``prefetch_ahead`` queued requests, whose cached prefixes count as used
             (``expect_queued``: each step, so they are not evicted while they wait;
             every ``warm_queue_every`` steps the queue up to the cache's size in prompt
             pages too, spaced further when that is more than ``WARM_WORK`` times the
             tokens the engine can compute between rounds)
    admit:   first come, first served while the device can hold what is running, pages
             and one state row each (``reserve``), or up to ``max_running`` (``greedy``);
             a request whose prefetch policy makes it wait is passed over until its fetch
             has landed, and one whose prefix a running request is still computing until
             that request's chunk is published (``peer_hold``, :mod:`hicache.engine.peers`)
    step:    verify borrowed pages, prefill chunks / decode strides, publish, finish
    clock:   now += prefill + decode iterations + blocking copies of the step

A step's prefill chunks run in its first forward pass together with one decode iteration
of the decoding requests (a chunked-prefill batch), so a prompt's first token comes at
``prefill + copies + one decode iteration`` into the step. A step's decode stride is cut
short at the next event that could change the batch -- an arrival (when a slot is free), a
queued request's prefetch landing, or the first running request to finish (when someone
is waiting) -- so admission happens when it would in a server, not at the end of a long
stride.

Everything the cache does goes through an executor (:class:`Executor`): the cached one
(:class:`hicache.engine.loop.CacheExecutor`) and one without any cache
(:class:`NullExecutor`), whose run on the same requests gives the time to first token
without the cache.
"""

from __future__ import annotations

import bisect
import math
import time
from dataclasses import dataclass, field
from typing import Callable, Sequence

from hicache.cache import Boundary, chunk_end, grain_end
from hicache.engine.peers import PeerHold
from hicache.engine.records import (ADMISSION_POLICIES, INF, EngineConfig, EngineReport, Executor, Job,
                                    NullExecutor, RequestRecord)

__all__ = ["ADMISSION_POLICIES", "EngineConfig", "EngineReport", "Executor", "Job", "NullExecutor",
           "RequestRecord", "Scheduler"]


@dataclass
class _StepWork:
    prefill_tokens: int = 0
    decode_iterations: int = 0
    first_tokens: list = field(default_factory=list)
    finished: list = field(default_factory=list)
    released: list = field(default_factory=list)


# A warm round of the queue walks at most this many times the tokens the engine can compute
# between two rounds; a longer horizon (a large cache behind a long queue) spaces the rounds
# out by the ratio instead, so keeping the queue warm costs a bounded share of the replay.
WARM_WORK = 4


def _arrival_order(req) -> tuple:
    return (req.arrival_s, req.request_id)


class Scheduler:
    """Runs requests (objects with ``request_id``, ``conversation_id``, ``turn``,
    ``arrival_s``, ``prompt``, ``output``) through an executor on the virtual clock."""

    def __init__(self, executor: Executor, cfg: EngineConfig = EngineConfig(),
                 progress: Callable[[int, int], None] | None = None):
        self.ex = executor
        self.cfg = cfg
        self.clock = cfg.clock
        self.P = executor.page_tokens
        points = executor.resume_points
        self.peers = PeerHold(self.P, points == "snapshots") if cfg.peer_hold and points is not None else None
        self.progress = progress
        # called as a turn ends (finished or rejected), with the request and the clock: a
        # fleet driver routes the conversation's next turn then
        self.on_turn_end: Callable[[object, float], None] | None = None
        self._ended: list[object] = []

    # -- the loop -----------------------------------------------------------------------
    def run(self, requests: Sequence) -> EngineReport:
        self.begin(requests)
        try:
            while self.busy_now():
                self.advance()
        finally:
            self.end()
        return self.report

    # -- the loop in pieces, for a driver that interleaves engines (hicache.engine.fleet) --
    def begin(self, requests: Sequence) -> None:
        """Start a run of ``requests``; more may be added with :meth:`add` as it goes."""
        self._t0 = time.perf_counter()
        self._reset(requests)

    def busy_now(self) -> bool:
        """Work is left: requests waiting, queued, held or running."""
        return bool(self.waiting or self.queue or self.retry or self.running or self.held)

    def advance(self) -> None:
        """One iteration: arrivals, admission, then a step (or a jump to the next event)."""
        self._arrive()
        self._admit()
        if self.running:
            self._step()
        else:
            self._idle()
        ended, self._ended = self._ended, []
        for req in ended:
            assert self.on_turn_end is not None
            self.on_turn_end(req, self.now)

    def add(self, req) -> None:
        """A request routed here while the run goes on (a conversation's next turn, sent
        once its previous turn ended on another engine)."""
        bisect.insort(self.waiting, req, key=lambda r: tuple(-x for x in _arrival_order(r)))
        self.total += 1

    def end(self) -> None:
        """Drain the cache and fill in the report."""
        try:
            self.ex.drain()
        finally:
            self.ex.close()
        rep = self.report
        rep.records = [self.records[k] for k in sorted(self.records)]
        rep.verified_pages = sum(r.verified_pages for r in rep.records)
        rep.mismatched_pages = sum(r.mismatched_pages for r in rep.records)
        rep.virtual_s = self.now
        rep.wall_s = time.perf_counter() - self._t0

    def _reset(self, requests: Sequence) -> None:
        self.report = EngineReport()
        self._warm_at = 0          # the first step a warm round of the queue may run again
        self.records: dict[int, RequestRecord] = {}
        self.now = self.prev_now = 0.0
        self.charged = self.ex.moved()   # copy bytes already charged to the clock (h2d, d2h)
        self.waiting = sorted(requests, key=lambda r: (r.arrival_s, r.request_id), reverse=True)
        self.queue: list = []      # ready, not admitted, in arrival order (first come first served)
        self.retry: list = []      # preempted or failed loads: before the queue
        self.running: list[Job] = []
        self.held: dict[str, list] = {}   # turns whose previous turn still runs
        self.busy: set[str] = set()
        self.ready_s: dict[int, float] = {}
        self.admissible_s: dict[int, float] = {}
        self.reserved = 0          # footprints of running requests
        self.finished, self.total = 0, len(requests)
        self._ended = []           # turns ended in this iteration, for on_turn_end

    def _arrive(self) -> None:
        """Arrived requests join the queue (or wait for their conversation's previous
        turn); the first ``lookahead`` queued requests get their prefetch started."""
        while self.waiting and self.waiting[-1].arrival_s <= self.now:
            req = self.waiting.pop()
            conv = str(req.conversation_id)
            if conv in self.busy:
                self.held.setdefault(conv, []).append(req)
                continue
            self.busy.add(conv)
            self.ready_s[req.request_id] = req.arrival_s
            self.queue.append(req)
        waiting = self.retry + self.queue
        head = waiting[:self.cfg.lookahead]
        for req in head:
            self._prefetch(req)
        if self.cfg.expect_queued:
            every = self.cfg.warm_queue_every
            steps = self.report.steps
            if every and steps % every == 0 and steps >= self._warm_at:
                n, tokens = self._warm_horizon(waiting)
                head = waiting[:max(len(head), n)]
                rounds = -(-tokens // (WARM_WORK * every * self.cfg.step_tokens))
                self._warm_at = steps + every * (rounds - 1)
            for req in reversed(head):   # the next to be admitted is the most recent
                self.ex.expect(req)
        self.prev_now = self.now

    def _warm_horizon(self, waiting: list) -> tuple[int, int]:
        """How many queued requests, front first, have prompts that add up to no more pages
        than the cache holds (``EngineConfig.warm_queue_every``), and their prompt tokens."""
        budget = self.ex.cache_pages * self.P
        n = tokens = 0
        for req in waiting:
            if tokens + len(req.prompt) > budget:
                break
            tokens += len(req.prompt)
            n += 1
        return n, tokens

    def _prefetch(self, req) -> float:
        """When ``req`` may be admitted, per its prefetch (started here if not yet)."""
        rid = req.request_id
        if rid not in self.admissible_s:
            start = max(self.ready_s.get(rid, self.now), self.prev_now)
            self.admissible_s[rid] = self.ex.prefetch(req, start)
        return self.admissible_s[rid]

    def _admit(self) -> None:
        for source in (self.retry, self.queue):
            for req in list(source):
                if len(self.running) >= self.cfg.max_running:
                    return
                too_big = self._footprint(req) > self.ex.device_pages
                if not too_big and not self._fits(req):
                    return  # first come, first served: wait until running requests finish
                if too_big:
                    source.remove(req)
                    self._reject(req)
                    continue
                if self._prefetch(req) > self.now:
                    continue  # its prefetch policy waits for the fetch: others go first
                if self.peers is not None and self.peers.blocker(req, self.running) is not None:
                    self.report.peer_holds += 1
                    continue  # a running request computes its prefix: it resumes there later
                source.remove(req)
                self._start(req)

    def _start(self, req) -> None:
        rid = req.request_id
        self.admissible_s.pop(rid, None)
        prompt_len, total = len(req.prompt), len(req.prompt) + len(req.output)
        rec = self.records.get(rid)
        first = rec is None
        if rec is None:
            rec = RequestRecord(rid, str(req.conversation_id), int(req.turn), prompt_len,
                                trace_line=getattr(req, "source_line", None),
                                ready_s=self.ready_s.get(rid, req.arrival_s))
            rec.queue_s = self.now - rec.ready_s
            self.records[rid] = rec
        job = Job(req, rec, prompt_len, total)
        job.done = self.ex.admit(job, self.now, first)
        self.reserved += self._footprint(req)
        self.running.append(job)

    def _reject(self, req) -> None:
        rec = RequestRecord(req.request_id, str(req.conversation_id), int(req.turn), len(req.prompt),
                            trace_line=getattr(req, "source_line", None),
                            recomputed_tokens=len(req.prompt), rejected=True,
                            ready_s=self.ready_s.get(req.request_id, req.arrival_s))
        self.records[req.request_id] = rec
        self.report.rejected += 1
        self.admissible_s.pop(req.request_id, None)
        self.ex.forget(req)
        self._next_turn(str(req.conversation_id), [], req)

    def _idle(self) -> None:
        """Nothing runs: jump to the next arrival or prefetch landing."""
        waits = [self.admissible_s.get(r.request_id, self.now) for r in self.retry + self.queue]
        if any(w <= self.now for w in waits) or not (waits or self.waiting or self.held):
            return  # a rejection released a turn after its queue was passed, or all is done
        nxt = min([w for w in waits if w > self.now] + ([self.waiting[-1].arrival_s] if self.waiting else []),
                  default=INF)
        assert nxt < INF, "the scheduler can make no progress"
        self.now = max(self.now, nxt)

    def _step(self) -> None:
        # Copies are charged to the step that follows their launch: those launched between
        # steps (a load queued at admission that an eviction's backup launched early) too.
        h2d0, d2h0 = self.charged
        self.ex.step()  # every load of this step as one batched copy
        work = self._batch()
        self.ex.poll(self.now)
        h2d1, d2h1 = self.charged = self.ex.moved()
        blocking = d2h1 - d2h0 if self.ex.blocking_d2h else 0
        start = self.now
        self.now += self.clock.step_s(work.prefill_tokens, work.decode_iterations, h2d1 - h2d0, blocking)
        # A prompt's last chunk runs in the step's first forward pass (chunked prefill: the
        # chunks plus one decode iteration of the decoding requests): its first token.
        first = start + self.clock.step_s(work.prefill_tokens, min(work.decode_iterations, 1), h2d1 - h2d0, blocking)
        for job in work.first_tokens:
            if job.record.ttft_s is None:
                job.record.ttft_s = first - job.record.ready_s
        for job in work.finished:
            job.record.finish_s = self.now
        for req in work.released:
            self.ready_s[req.request_id] = max(req.arrival_s, self.now)
        self.report.steps += 1

    # -- one step's batch ---------------------------------------------------------------
    def _batch(self) -> _StepWork:
        work = _StepWork()
        budget = self.cfg.step_tokens
        stride = self._decode_iterations()
        for job in list(self.running):
            if budget <= 0:
                break
            if job not in self.running:  # preempted by an older request this step
                continue
            if not job.verified:
                if not self.ex.verify(job):  # a failed load: recompute from scratch
                    self._release(job)
                    self.retry.append(job.req)
                    continue
                job.verified = True
            before = job.done
            if job.done < job.prompt_len:
                chunk = max(min(self.cfg.chunk_tokens, budget) // self.P * self.P, self.P)
                target = min(job.done - job.done % self.P + chunk, job.prompt_len)
                why = Boundary.PROMPT_END if target == job.prompt_len else Boundary.PREFILL
                target, why = chunk_end(job.done, target, why, job.branch)
                target, why = grain_end(job.done, target, why, job.prompt_len, self.cfg.prompt_grain, self.P)
                ok = self._make_room(job, target)
                if ok:
                    self.ex.publish(job, why)
                    work.prefill_tokens += job.done - before
                    if target == job.prompt_len:
                        work.first_tokens.append(job)
            else:
                target = min(job.done + stride, job.total_len)
                ok = self._make_room(job, target)
                if ok:
                    work.decode_iterations = max(work.decode_iterations, target - before)
                    if target == job.total_len:
                        self._finish(job, work)
                        budget -= target - before
                        continue
            budget -= job.done - before
            if not ok:  # no device room even after preempting others: wait for a retry
                self._preempt(job)
        return work

    def _decode_iterations(self) -> int:
        """This step's decode stride, cut at the next event that could change the batch."""
        n = self.cfg.decode_stride
        decoding = [j.total_len - j.done for j in self.running if j.done >= j.prompt_len]
        if not decoding:
            return n
        if self.queue or self.retry or self.held:  # someone waits for a finish
            n = min(n, min(decoding))
        if len(self.running) < self.cfg.max_running:
            waits = [w for w in self.admissible_s.values() if w > self.now]
            nxt = min(waits + ([self.waiting[-1].arrival_s] if self.waiting else []), default=INF)
            if nxt < INF:
                n = min(n, math.ceil((nxt - self.now) / self.clock.decode_step_s))
        return max(1, n)

    def _finish(self, job: Job, work: _StepWork) -> None:
        self.ex.publish(job, Boundary.FINISH)
        self._release(job)
        job.record.finish_step = self.report.steps
        job.record.finished = True
        work.finished.append(job)
        self.finished += 1
        self._next_turn(str(job.req.conversation_id), work.released, job.req)
        if self.progress is not None:
            self.progress(self.finished, self.total)

    def _next_turn(self, conv: str, released: list, req=None) -> None:
        """A conversation's turn ended: its next held turn may start."""
        if self.on_turn_end is not None and req is not None:
            self._ended.append(req)   # reported once the step's clock has advanced
        self.busy.discard(conv)
        if self.held.get(conv):
            req = self.held[conv].pop(0)
            # The queue is in arrival order: the turn takes its place by its arrival time
            # (it was held only for its dependency), ahead of what arrived after it.
            bisect.insort(self.queue, req, key=_arrival_order)
            released.append(req)
            self.ready_s[req.request_id] = max(req.arrival_s, self.now)
            self.busy.add(conv)
            if not self.held[conv]:
                del self.held[conv]

    # -- room ---------------------------------------------------------------------------
    def _footprint(self, req) -> int:
        """Device pages ``req`` holds at its finish (prompt + output), plus the pages' worth
        of snapshot bytes it pins when snapshots share the page budget."""
        return -(-(len(req.prompt) + len(req.output)) // self.P) + self.ex.request_overhead_pages

    def _fits(self, req) -> bool:
        """Admission control: may ``req`` start now without taking others' room?"""
        if self.cfg.admission == "greedy" or self.reserved == 0:
            return True
        slots = self.ex.request_slots
        if slots is not None and len(self.running) >= slots:
            return False
        return self.reserved + self._footprint(req) <= self.ex.device_pages

    def _release(self, job: Job) -> None:
        self.ex.release(job)
        self.reserved -= self._footprint(job.req)
        self.running.remove(job)

    def _preempt(self, job: Job) -> None:
        self._release(job)
        job.record.preemptions += 1
        self.report.preemptions += 1
        self.retry.insert(0, job.req)

    def _make_room(self, job: Job, target: int) -> bool:
        """Compute up to ``target``; on no room, let in-flight copies finish (they pin
        pages), then preempt the youngest other requests -- never the oldest, so some
        request always makes progress (no livelock of mutual preemption)."""
        if self._compute(job, target):
            return True
        self.ex.drain()
        if self._compute(job, target):
            return True
        # Queued requests' prefetches pin the prefixes they extend; running requests come
        # first (their prefetches start again from scratch when they are next in line).
        dropped = self.ex.drop_prefetches()
        for rid in dropped:
            self.admissible_s.pop(rid, None)
        if dropped and self._compute(job, target):
            return True
        preempted = False
        for other in sorted((j for j in self.running if j is not job), key=lambda j: -j.req.request_id):
            if other.req.request_id < job.req.request_id:
                break  # older requests keep their pages
            self._preempt(other)
            preempted = True
            if self._compute(job, target):
                return True
        # The evictions those tries made start copies of their own (a victim's host copy is
        # put to L3 at once), and a copy in flight pins its node: what the preemptions freed
        # may be reachable only once they land. Without this, the request gave up, was
        # preempted, and the same requests cycled (issue 14's livelock).
        if preempted:
            self.ex.drain()
            return self._compute(job, target)
        return False

    def _compute(self, job: Job, target: int) -> bool:
        if not self.ex.compute(job, target):
            return False
        job.done = target
        return True
