"""A small serving loop in which the tiny model computes through ``HiCache``'s device pools.

Each step admits arrived requests (up to ``max_running``), then moves every running
request one unit forward and publishes what it computed::

    admit     match -> L3 prefetch (finish_prefetch) -> match -> load -> lease.wait()
              -> PagedSequenceCache on cache.pools.device with the lease's page table,
                 state restored from lease.snapshot_id (resume_sequence)
              -> bit-compare the borrowed pages + snapshot with a dense run
    prefill   one chunk of whole pages ending on a page boundary:
              alloc_pages -> model.forward -> alloc_snapshot + save_snapshot
              -> publish(why=PREFILL, or PROMPT_END at the deepest prompt boundary)
    decode    the prompt's tail, then the output one token a step (teacher forcing:
              the workload's output tokens, so turn k+1's prompt extends turn k's);
              at the deepest boundary of prompt + output the state is saved, and at
              the end published with why=FINISH; release
    end       poll (and with sync_copies, drain: every copy done before the next step)

Every chunk's logits are compared with a no-cache recompute of the whole request
(:mod:`hicache.engine.tiny_serving.reference`). Admission reserves device pages for the
whole request (prompt and output, as engines reserve max_new_tokens); a request that does
not fit waits, with everything behind it, until running requests finish. So nothing is
ever preempted, and a device pool that cannot hold one request alone is a ConfigError.

Why chunks end on page boundaries: a snapshot can only be taken where the request stands
(the working state keeps the live tail, not the past), and the tree only knows whole
pages. Publishing after each chunk is what lets a concurrent sibling reuse a prefix while
its first request is still in prefill (seed 003).
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Callable, Sequence

import numpy as np
import torch

from hicache.cache import Boundary, HiCache, Lease, chunk_end
from hicache.engine import EngineRequest
from hicache.engine.tiny_model import PagedSequenceCache, TinyV4Model, layout_for
from hicache.engine.tiny_serving.records import TinyRecord, TinyReport
from hicache.engine.tiny_serving.reference import Reference
from hicache.errors import ConfigError, MisuseError
from hicache.units import check_int, check_number


@dataclass(frozen=True)
class TinyEngineConfig:
    """Scheduling knobs of the tiny loop.

    ``chunk_pages``: pages per prefill chunk (a snapshot is offered after each);
    ``decode_tokens``: output tokens per decode step (1 = real decode; the model is
    batch-invariant, so this changes speed, not logits); ``step_s``: simulated seconds
    per step, against the workload's arrival times; ``prefetch``: ask L3 for what the
    host misses before loading; ``sync_copies``: drain every copy at the end of each step,
    which makes tier hit counts reproducible run to run (the CPU copy workers and L3 puts
    are otherwise asynchronous; exactness does not depend on it).
    """

    max_running: int = 4
    chunk_pages: int = 2
    decode_tokens: int = 1
    step_s: float = 1.0
    prefetch: bool = True
    sync_copies: bool = True

    def __post_init__(self) -> None:
        for name in ("max_running", "chunk_pages", "decode_tokens"):
            check_int(name, getattr(self, name), minimum=1)
        check_number("step_s", self.step_s)


@dataclass
class _Running:
    req: EngineRequest
    record: TinyRecord
    lease: Lease
    seq: PagedSequenceCache
    ref: Reference
    tokens: torch.Tensor        # prompt + output (int64)
    tokens_np: np.ndarray       # the same, int32, for the cache
    prompt_len: int
    done: int                   # tokens computed (seq.length)
    final_snapshot: int | None = None
    branch: int = 0             # a prefill chunk ends here, with a snapshot (MatchResult.branch_tokens)


class TinyEngine:
    """Serves requests (``request_id``, ``conversation_id``, ``turn``, ``arrival_s``,
    ``prompt``, ``output``) with ``model`` through ``cache``, checking every logit.

    The cache's layout must be ``layout_for(model.cfg)``: the model reads and writes the
    device pools directly. :meth:`resume_sequence` is the seam negative-control tests
    override (corrupt the snapshot, shift the sliding base) to show the check can fail.
    """

    def __init__(self, cache: HiCache, model: TinyV4Model, cfg: TinyEngineConfig = TinyEngineConfig(),
                 progress: Callable[[int, int], None] | None = None):
        if cache.layout.fingerprint != layout_for(model.cfg).fingerprint:
            raise MisuseError("the cache's layout is not the tiny model's (build it with layout_for(cfg))")
        self.cache = cache
        self.model = model
        self.cfg = cfg
        self.P = cache.page_tokens
        self.progress = progress
        self.report = TinyReport()
        self._capacity = cache.pools.device.capacity("page")
        self._records: dict[int, TinyRecord] = {}

    # -- admission ------------------------------------------------------------------------
    def resume_sequence(self, lease: Lease) -> PagedSequenceCache:
        """The request's view of the device pools: the borrowed prefix pages of the lease
        and, at a hit, the working state restored from ``lease.snapshot_id``."""
        pools = self.cache.pools.device
        if lease.resume_tokens == 0:
            return PagedSequenceCache(self.model.cfg, pools)
        assert lease.snapshot_id is not None, f"a hit at {lease.resume_tokens} without a snapshot"
        return PagedSequenceCache.resume(self.model.cfg, pools, lease.page_table[: lease.resume_pages],
                                         lease.snapshot_id, lease.resume_tokens)

    def _load(self, prompt: np.ndarray) -> tuple[Lease, int]:
        """The request's lease, and the fork its first chunks should stop at (0: none)."""
        cache = self.cache
        m = cache.match(prompt)
        if self.cfg.prefetch:
            pf = cache.prefetch(m)
            if pf is not None and cache.finish_prefetch(pf):
                m = cache.match(prompt)
        lease = cache.load(m)
        if not lease.wait():  # a failed host->device load: recompute from scratch
            cache.release(lease)
            cache.poll()  # apply the failure: its destination rows go back to the pool
            self.report.load_failures += 1
            return cache.load(cache.match(prompt[:1])), 0
        return lease, m.branch_tokens

    def _admit(self, req: EngineRequest) -> _Running | None:
        """Load the request's prefix and reserve device pages for all of it (prompt and
        output: the engine knows the output length, as engines know max_new_tokens), so a
        running request never runs out of pages. None (lease released) if they do not fit."""
        prompt = np.asarray(req.prompt, np.int32)
        full = np.concatenate([prompt, np.asarray(req.output, np.int32)])
        if full.size and (int(full.min()) < 0 or int(full.max()) >= self.model.cfg.vocab):
            raise MisuseError(f"request {req.request_id}: token ids must be in [0, {self.model.cfg.vocab}) "
                              "for the tiny model (generate the workload with vocab_size=cfg.vocab)")
        lease, branch = self._load(prompt)
        need = -(-len(full) // self.P) - len(lease.page_table)
        pages = self.cache.alloc_pages(lease, need) if need > 0 else None
        if pages is not None and not pages.ok:
            self.cache.release(lease)
            self.report.admission_waits += 1
            return None
        tokens = torch.from_numpy(full.astype(np.int64))
        rec = self._records[req.request_id] = TinyRecord(
            req.request_id, str(req.conversation_id), int(req.turn), len(prompt), len(full) - len(prompt))
        hit = lease.resume_tokens
        rec.hit_tokens = hit
        rec.l3_hit_tokens = lease.l3_tokens
        rec.host_hit_tokens = lease.loaded_tokens - lease.l3_tokens
        rec.device_hit_tokens = hit - lease.loaded_tokens
        rec.recomputed_tokens = len(prompt) - hit
        rec.admit_step = self.report.steps
        seq = self.resume_sequence(lease)
        if pages is not None:
            seq.extend_pages(pages.ids.tolist())
        ref = Reference(self.model, tokens)
        found = ref.verify_resume(seq, self.cache.pools.device, hit, lease.snapshot_id)
        rec.verified_pages += found.verified
        rec.mismatched_pages += found.mismatched
        return _Running(req, rec, lease, seq, ref, tokens, full, len(prompt), done=hit, branch=branch)

    # -- computing through the cache ---------------------------------------------------------
    def _sync_pages(self, run: _Running) -> None:
        """Follow the lease's page table: publish may repoint duplicate pages to the copy
        the tree already had (bit-identical: pages are a function of the prefix)."""
        run.seq.page_table[:] = run.lease.page_table
        run.seq.num_borrowed = max(run.seq.num_borrowed, run.lease.published_pages)

    def _compute(self, run: _Running, upto: int) -> None:
        assert run.seq.page_table == run.lease.page_table, "the model's page table left the lease's"
        logits = self.model.forward(run.tokens[run.done: upto], run.done, run.seq)
        run.record.add_check(run.ref.check(logits, run.done))
        run.done = upto

    def _save_snapshot(self, run: _Running) -> int | None:
        """A device state row holding the state where the request stands (None: no room)."""
        alloc = self.cache.alloc_snapshot(run.lease)
        if not alloc.ok:
            return None
        sid = int(alloc.ids[0])
        run.seq.save_snapshot(run.done, sid)
        return sid

    def _publish(self, run: _Running, boundary: int, why: Boundary, sid: int | None) -> None:
        self.cache.publish(run.lease, run.tokens_np[:boundary], boundary // self.P, snapshot_id=sid, why=why)
        self._sync_pages(run)

    def _advance(self, run: _Running) -> bool:
        """One unit of work: a prefill chunk or a decode step. True when the request is done."""
        P, done = self.P, run.done
        prompt_boundary = run.prompt_len // P * P
        final_boundary = len(run.tokens) // P * P
        if done < prompt_boundary:
            upto = min(done - done % P + self.cfg.chunk_pages * P, prompt_boundary)
            why = Boundary.PROMPT_END if upto == prompt_boundary else Boundary.PREFILL
            upto, why = chunk_end(done, upto, why, run.branch)
            self._compute(run, upto)
            self._publish(run, upto, why, self._save_snapshot(run))
            return False
        upto = run.prompt_len if done < run.prompt_len else min(done + self.cfg.decode_tokens, len(run.tokens))
        upto = min(upto, (done // P + 1) * P)  # stop on page boundaries: the last one is snapshotted
        self._compute(run, upto)
        if upto == final_boundary and final_boundary > run.lease.published_pages * P:
            run.final_snapshot = self._save_snapshot(run)
        if upto < len(run.tokens):
            return False
        if final_boundary > run.lease.published_pages * P:
            self._publish(run, final_boundary, Boundary.FINISH, run.final_snapshot)
        return True

    # -- the loop --------------------------------------------------------------------------
    def run(self, requests: Sequence) -> TinyReport:
        """Serve ``requests`` to the end; the report's records are in request-id order."""
        t0 = time.perf_counter()
        waiting = sorted(requests, key=lambda r: (r.arrival_s, r.request_id))
        total = len(waiting)
        running: list[_Running] = []
        busy: set[str] = set()   # conversations with a turn running
        now, finished = 0.0, 0
        while waiting or running:
            self._admit_arrived(waiting, running, busy, now)
            if not running:
                assert waiting[0].arrival_s > now, "an arrived request was not admitted"
                now = waiting[0].arrival_s  # idle: jump to the next arrival
                continue
            for run in list(running):
                if not self._advance(run):
                    continue
                self.cache.release(run.lease)
                running.remove(run)
                run.record.finish_step = self.report.steps
                busy.discard(str(run.req.conversation_id))
                finished += 1
                if self.progress is not None:
                    self.progress(finished, total)
            self.cache.poll()
            if self.cfg.sync_copies:
                self.cache.drain()
            self.report.steps += 1
            now += self.cfg.step_s
        self.cache.drain()
        self.report.records = [self._records[k] for k in sorted(self._records)]
        self.report.wall_s = time.perf_counter() - t0
        return self.report

    def _pages(self, req: EngineRequest) -> int:
        return -(-(len(req.prompt) + len(req.output)) // self.P)

    def _held_pages(self, running: list[_Running]) -> int:
        """Device pages the running requests hold (borrowed, published or owned: all
        locked); every other device page can be evicted for a new request."""
        return len({p for run in running for p in run.lease.page_table})

    def _admit_arrived(self, waiting: list, running: list, busy: set, now: float) -> None:
        """Admit arrivals in order while there is room. A turn waits for the previous turn
        of its conversation (its prompt holds that turn's output); a request whose pages do
        not fit waits, and so does everything behind it (first come, first served)."""
        i = 0
        while i < len(waiting) and len(running) < self.cfg.max_running and waiting[i].arrival_s <= now:
            req = waiting[i]
            conv = str(req.conversation_id)
            if conv in busy:
                i += 1
                continue
            if running and self._held_pages(running) + self._pages(req) > self._capacity:
                return  # would not fit next to the running ones: wait (without touching the tree)
            run = self._admit(req)
            if run is None and not running:
                self.cache.drain()  # only in-flight copies could hold pages now
                run = self._admit(req)
                if run is None:
                    raise ConfigError("device_pages", self.cache.pools.device.capacity("page"),
                                      f"cannot hold request {req.request_id} "
                                      f"({self._pages(req)} pages) on its own")
            if run is None:
                return
            busy.add(conv)
            del waiting[i]
            running.append(run)


__all__ = ["TinyEngine", "TinyEngineConfig"]
