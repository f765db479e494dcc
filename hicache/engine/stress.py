"""An offload stress test: random request traffic against a ``HiCache``, checking every byte.

Requests share prefixes (a few "system prompts", and follow-up turns that extend an earlier
request's full sequence). Each request, like an engine would:

    match -> load -> wait -> verify every borrowed page and the resume snapshot
    -> prefill in page-aligned chunks, publishing mid-flight with a snapshot
    -> decode -> publish at finish with a snapshot -> release

Operations interleave at random across up to ``max_running`` requests, with polls, aborts
and expects (a queued follow-up keeping its prefix warm: ``HiCache.expect``, drawn from a
stream of its own), so device and host pressure, shadow hits, loads, dedup and retention
all happen.
``check_integrity()`` runs after every operation.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Callable

import numpy as np

from hicache.cache import Boundary, HiCache, Lease, chunk_end
from hicache.engine import contents
from hicache.errors import TransferError


@dataclass(frozen=True)
class StressConfig:
    ops: int = 1000
    seed: int = 0
    max_running: int = 4
    prefixes: int = 3
    prefix_pages: tuple[int, int] = (1, 6)
    suffix_pages: tuple[int, int] = (0, 4)
    output_tokens: tuple[int, int] = (1, 40)
    chunk_pages: tuple[int, int] = (1, 3)
    follow_up: float = 0.4
    vocab: int = 50_000
    prefetch: float = 0.5      # chance a new request first prefetches from L3
    async_fetch: float = 0.3   # of those, the chance it starts the fetch without waiting
                               # (HiCache.start_fetch, as a scheduler that never blocks) ...
    abort_fetch: float = 0.25  # ... and then aborts it mid-flight (cancel_prefetch)
    fault_rate: float = 0.0    # chance each copied layer fails (injected TransferError)
    expect: float = 0.2        # chance per op that a finished sequence is expected (queued)


@dataclass
class StressReport:
    ops: int = 0
    requests: int = 0
    integrity_errors: int = 0
    mismatched_pages: int = 0
    verified_pages: int = 0
    verified_snapshots: int = 0
    mismatched_snapshots: int = 0
    failed_loads: int = 0
    injected_faults: int = 0   # copies failed on purpose (StressConfig.fault_rate)
    l3_tokens: int = 0
    seconds: float = 0.0
    first_error: str | None = None
    stats: dict = field(default_factory=dict)

    @property
    def ops_per_s(self) -> float:
        return self.ops / self.seconds if self.seconds else 0.0


@dataclass
class _Req:
    lease: Lease
    tokens: np.ndarray         # prompt + output (the whole sequence this request computes)
    prompt_len: int
    done_tokens: int           # tokens computed so far (a multiple of P until the end)
    hashes: list[bytes]
    branch: int = 0            # a chunk ends here with a snapshot (MatchResult.branch_tokens)


class StressRunner:
    """Drives random traffic; see the module docstring."""

    def __init__(self, cache: HiCache, cfg: StressConfig,
                 progress: Callable[[int, int], None] | None = None):
        self.cache = cache
        self.cfg = cfg
        self.rng = np.random.default_rng(cfg.seed)
        self.P = cache.page_tokens
        self.report = StressReport()
        self.running: list[_Req] = []
        self.finished: list[np.ndarray] = []
        self.progress = progress
        self.prefixes = [self._random_tokens(self.P * int(self.rng.integers(*cfg.prefix_pages, endpoint=True)))
                         for _ in range(cfg.prefixes)]
        self.has_snap = bool(cache.layout.object_bytes("state"))
        self.erng = np.random.default_rng(cfg.seed + 2)   # its own stream: the ops' draws stay
        if cfg.fault_rate > 0:
            frng = np.random.default_rng(cfg.seed + 1)

            def inject(_point) -> None:
                if frng.random() < cfg.fault_rate:
                    self.report.injected_faults += 1
                    raise TransferError("injected by hicache stress")

            cache.set_fault_injector(inject)

    def _random_tokens(self, n: int) -> np.ndarray:
        return self.rng.integers(0, self.cfg.vocab, size=n, dtype=np.int32)

    def _hashes(self, tokens: np.ndarray) -> list[bytes]:
        return self.cache.page_hashes(tokens)

    # -- one request's steps ------------------------------------------------------------
    def _start(self) -> None:
        c = self.cfg
        if self.finished and self.rng.random() < c.follow_up:
            base = self.finished[int(self.rng.integers(len(self.finished)))]
        else:
            base = self.prefixes[int(self.rng.integers(len(self.prefixes)))]
        extra = self.P * int(self.rng.integers(*c.suffix_pages, endpoint=True)) + int(self.rng.integers(1, self.P + 1))
        prompt = np.concatenate([base, self._random_tokens(extra)])
        output = self._random_tokens(int(self.rng.integers(*c.output_tokens, endpoint=True)))
        tokens = np.concatenate([prompt, output])
        m = self.cache.match(prompt)
        if m.l3_hashes and self.rng.random() < self.cfg.prefetch:
            pf = self.cache.prefetch(m)
            if pf is not None and self.rng.random() < self.cfg.async_fetch:
                while not self.cache.start_fetch(pf):
                    pf.op.wait_planned(0.01)
                if self.rng.random() < self.cfg.abort_fetch:
                    self.cache.cancel_prefetch(pf)      # its rows go back once the fetch settles:
                    pf.op.wait_settled(30)              # here, so a seed replays the same run
                    pf = None
            self.report.l3_tokens += self.cache.finish_prefetch(pf)
            m = self.cache.match(prompt)
        lease = self.cache.load(m)
        req = _Req(lease, tokens, len(prompt), lease.resume_tokens, self._hashes(tokens), m.branch_tokens)
        self.report.requests += 1
        if not lease.wait():
            self.report.failed_loads += 1
            self.cache.release(lease)
            return
        self._verify_prefix(req)
        self.running.append(req)

    def _verify_prefix(self, req: _Req) -> None:
        good, bad, sgood, sbad = contents.verify_prefix(self.cache, req.lease, req.hashes)
        self.report.verified_pages += good
        self.report.mismatched_pages += bad
        self.report.verified_snapshots += sgood
        self.report.mismatched_snapshots += sbad

    def _compute(self, req: _Req, upto_tokens: int) -> bool:
        if not contents.compute(self.cache, req.lease, req.hashes, req.done_tokens, upto_tokens):
            return False
        req.done_tokens = upto_tokens
        return True

    def _publish(self, req: _Req, why: Boundary) -> None:
        contents.publish(self.cache, req.lease, req.tokens, req.done_tokens, req.hashes, why)

    def _advance(self, req: _Req) -> None:
        """One prefill chunk (page-aligned, published mid-flight), or decode + finish."""
        if req.done_tokens < req.prompt_len:
            step = self.P * int(self.rng.integers(*self.cfg.chunk_pages, endpoint=True))
            target = min(req.done_tokens - req.done_tokens % self.P + step, req.prompt_len)
            why = Boundary.PROMPT_END if target == req.prompt_len else Boundary.PREFILL
            target, why = chunk_end(req.done_tokens, target, why, req.branch)
            if not self._compute(req, target):
                return self._abort(req)
            self._publish(req, why)
            return
        if not self._compute(req, len(req.tokens)):
            return self._abort(req)
        self._publish(req, Boundary.FINISH)
        self.cache.release(req.lease)
        self.running.remove(req)
        self.finished.append(req.tokens)
        if len(self.finished) > 32:
            self.finished.pop(0)

    def _abort(self, req: _Req) -> None:
        self.cache.release(req.lease)
        self.running.remove(req)

    # -- the loop -----------------------------------------------------------------------
    def step(self) -> None:
        if self.finished and self.erng.random() < self.cfg.expect:
            # a queued follow-up keeps its prefix warm (HiCache.expect), as an engine does
            seq = self.finished[int(self.erng.integers(len(self.finished)))]
            self.cache.expect(seq[:len(seq) - int(self.erng.integers(len(seq)))])
        r = self.rng.random()
        if not self.running or (len(self.running) < self.cfg.max_running and r < 0.3):
            self._start()
        elif r < 0.9:
            self._advance(self.running[int(self.rng.integers(len(self.running)))])
        elif r < 0.97:
            self.cache.poll()
        else:
            self._abort(self.running[int(self.rng.integers(len(self.running)))])

    def run(self) -> StressReport:
        t0 = time.perf_counter()
        for i in range(self.cfg.ops):
            self.step()
            self.report.ops += 1
            try:
                self.cache.check_integrity()
            except AssertionError as exc:
                self.report.integrity_errors += 1
                if self.report.first_error is None:
                    self.report.first_error = f"op {i}: {exc}"
            if self.progress is not None:
                self.progress(i + 1, self.cfg.ops)
        for req in list(self.running):
            self._abort(req)
        self.cache.set_fault_injector(None)
        self.cache.drain()
        try:
            self.cache.check_integrity()
        except AssertionError as exc:
            self.report.integrity_errors += 1
            self.report.first_error = self.report.first_error or f"final: {exc}"
        self.report.seconds = time.perf_counter() - t0
        self.report.stats = self.cache.stats()
        return self.report
