"""A production-size block-hash trace, generated as hash ids without materialising tokens.

Public production traces (Mooncake's, the Azure and Bailian traces) are streams of
independent-looking requests: most prompt blocks occur once, a few shared system prompts
(API templates) recur, and some requests continue an earlier one (a chat session) without
saying so -- there are no conversation ids, only equal leading hash ids. Their lengths are
heavy-tailed. This module writes such a trace directly in kvcache-simulator's JSONL,
10,000+ requests and 100M+ prompt tokens in seconds and in memory bounded by the live
sessions, because it never makes a token: it numbers blocks.

The prefix structure is real, not sampled: block ids are numbered in order of first
appearance and equal leading ids mean equal prefixes, as :func:`~.trace.write_trace`
numbers chained hashes. A request's prompt is::

    [system prompt s]? context                          (a session's first request)
    previous prompt + previous output + user message    (the next request of a session)

- a full block inside system prompt ``s`` has the same id in every request that uses ``s``
  (``system_prompts`` of them, Zipf popularity ``system_popularity``, used by
  ``system_share`` of the sessions);
- the next request of a session repeats the ids of the previous prompt's *full* blocks;
  everything after them -- the previous prompt's partial block, the output, the new
  message -- is new blocks (the trace is prompt-only, as the simulator sees it; an engine
  that caches decoded pages would also reuse the output, which no prompt-only trace
  expresses);
- every other block (contexts, messages, partial tails) is a fresh id, used once.

Sessions start as a Poisson process (``arrival_rate`` per second); ``multi_turn_share`` of
them are chats of ``turns`` requests an exponential ``think_time_s`` apart, the others a
single API request. The file is the first ``requests`` requests in time order (sessions
still open at the end are cut, as a time window of a real trace cuts them). Lengths
(:class:`~._checks.LogNormal`): ``context_len`` median 3,500, sigma 1.3 (p99 ~ 72K),
clipped at 120,000; prompts never exceed ``max_prompt_tokens`` (a session ends instead).

Why the shape matters: the reuse ceiling is low (~25-30% at the defaults) and comes from
two sources that want different treatment -- a few hot system prompts, and session
prefixes that are hit once, one think time later, then never again -- while most bytes
written to the cache are never read back. A policy that admits everything and evicts by
recency spends its budget on those.
"""

from __future__ import annotations

import heapq
import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterator

import numpy as np

from hicache.engine.workloads._checks import (LogNormal, Range, check_int, check_length, check_range, check_share,
                                              draw, draw_many, high)
from hicache.engine.workloads._random import stream
from hicache.engine.workloads.request import ArrivalSpec, Request, WorkloadStats
from hicache.engine.workloads.trace import requests_from_lines
from hicache.engine.workloads.trace_parse import TraceLine, open_text, sim_block_tokens
from hicache.errors import ConfigError
from hicache.units import check_number


@dataclass(frozen=True)
class ProductionSpec:
    """Shape of the production trace (see the module doc). Lengths are token counts."""

    system_prompts: int = 64
    system_len: Range | LogNormal = field(default_factory=lambda: LogNormal(1500, 0.8, 64, 16_384))
    system_popularity: float = 1.2
    system_share: float = 0.5
    context_len: Range | LogNormal = field(default_factory=lambda: LogNormal(3500, 1.3, 16, 120_000))
    multi_turn_share: float = 0.05
    turns: Range = (2, 8)
    user_len: Range | LogNormal = field(default_factory=lambda: LogNormal(150, 1.0, 4, 8192))
    output_len: Range | LogNormal = field(default_factory=lambda: LogNormal(250, 0.9, 1, 8192))
    max_prompt_tokens: int = 131_072
    arrival_rate: float = 3.0
    think_time_s: float = 60.0

    def __post_init__(self) -> None:
        object.__setattr__(self, "turns", check_range("turns", self.turns, 1))
        for name, minimum in (("system_len", 1), ("context_len", 1), ("user_len", 1), ("output_len", 0)):
            object.__setattr__(self, name, check_length(name, getattr(self, name), minimum))
        check_int("system_prompts", self.system_prompts, 1)
        check_int("max_prompt_tokens", self.max_prompt_tokens, 2)
        check_number("system_popularity", self.system_popularity, positive=False, minimum=0,
                     reason="must be a number >= 0")
        check_share("system_share", self.system_share)
        check_share("multi_turn_share", self.multi_turn_share)
        ArrivalSpec(self.arrival_rate, self.think_time_s, None)  # validates them
        if self.arrival_rate is None:
            raise ConfigError("arrival_rate", None, "must be a positive number of sessions per second")
        longest = high(self.system_len) + 1
        if longest >= self.max_prompt_tokens:
            raise ConfigError("max_prompt_tokens", self.max_prompt_tokens,
                              f"must exceed the longest system prompt + 1 token ({longest})")


@dataclass
class _Session:
    ids: list[int]          # the previous prompt's full-block ids
    length: int             # the previous prompt's tokens
    output: int             # the previous output's tokens
    turns_left: int
    turn: int
    rng: np.random.Generator


@dataclass(frozen=True)
class ProductionRecord:
    """One request of the trace: what a line holds (``session`` and ``turn`` are not written)."""

    timestamp_ms: int
    input_length: int
    output_length: int
    hash_ids: tuple[int, ...]
    reusable_tokens: int    # whole blocks of ids seen in an earlier prompt, one token short of the prompt
    session: int
    turn: int


class _Generator:
    def __init__(self, spec: ProductionSpec, seed: int, block_size: int, partial_tail: bool):
        self.spec, self.seed, self.bs, self.partial_tail = spec, seed, block_size, partial_tail
        rng = stream(seed, "production", "systems")
        self.system_lens = draw_many(rng, spec.system_len, spec.system_prompts)
        rank = rng.permutation(spec.system_prompts)
        w = 1.0 / (rank + 1.0) ** spec.system_popularity
        self.system_p = np.cumsum(w / w.sum())
        self.system_ids: dict[int, list[int]] = {}
        self.next_id = 0

    def fresh(self, n: int) -> list[int]:
        out = list(range(self.next_id, self.next_id + n))
        self.next_id += n
        return out

    def record(self, t: float, sid: int, session: _Session | None, new_tokens: int, system: int | None,
               output: int) -> tuple[ProductionRecord, list[int]]:
        """The request (``new_tokens`` after the system prompt or the previous output), and
        its full-block ids."""
        first_new = self.next_id
        if session is None:
            shared: list[int] = []
            length = new_tokens
            if system is not None:
                n_full = int(self.system_lens[system]) // self.bs
                if system not in self.system_ids:
                    self.system_ids[system] = self.fresh(n_full)
                shared = self.system_ids[system]
                length += int(self.system_lens[system])
            turn = 0
        else:
            shared, turn = session.ids, session.turn
            length = session.length + session.output + new_tokens
        n_full = length // self.bs
        full_ids = shared[:n_full] + self.fresh(n_full - min(n_full, len(shared)))
        tail = self.fresh(1) if self.partial_tail and length % self.bs else []
        seen = 0
        while seen < len(full_ids) and full_ids[seen] < first_new:
            seen += 1
        reusable = min(seen, (length - 1) // self.bs) * self.bs
        rec = ProductionRecord(int(round(t * 1000)), length, output, tuple(full_ids + tail), reusable, sid, turn)
        return rec, full_ids

    def run(self, requests: int) -> Iterator[ProductionRecord]:
        spec = self.spec
        starts = stream(self.seed, "production", "starts")
        next_start, sid = 0.0, 0
        live: list[tuple[float, int]] = []   # (arrival of the next request, session id)
        sessions: dict[int, _Session | None] = {}
        emitted = 0
        while emitted < requests:
            if not live or next_start <= live[0][0]:
                heapq.heappush(live, (next_start, sid))
                sessions[sid] = None
                sid += 1
                next_start += float(starts.exponential(1.0 / spec.arrival_rate))
                continue
            t, s = heapq.heappop(live)
            state = sessions.pop(s)
            if state is None:
                rng = stream(self.seed, "production", "session", s)
                system = None
                if rng.random() < spec.system_share:
                    system = min(int(np.searchsorted(self.system_p, rng.random(), side="right")),
                                 spec.system_prompts - 1)
                turns = draw(rng, spec.turns) if rng.random() < spec.multi_turn_share else 1
                room = spec.max_prompt_tokens - (int(self.system_lens[system]) if system is not None else 0)
                context = min(draw(rng, spec.context_len), room)
                rec, ids = self.record(t, s, None, context, system, draw(rng, spec.output_len))
            else:
                rng, turns = state.rng, state.turns_left
                user = draw(rng, spec.user_len)
                if state.length + state.output + user > spec.max_prompt_tokens:
                    continue  # the session would outgrow the context: it ends
                rec, ids = self.record(t, s, state, user, None, draw(rng, spec.output_len))
            emitted += 1
            yield rec
            if turns > 1:
                sessions[s] = _Session(ids, rec.input_length, rec.output_length, turns - 1, rec.turn + 1, rng)
                heapq.heappush(live, (t + float(rng.exponential(spec.think_time_s)), s))


def production_records(requests: int = 12_000, seed: int = 0, *, spec: ProductionSpec | None = None,
                       block_size: int = 256, partial_tail: bool = True) -> Iterator[ProductionRecord]:
    """The trace's records in time order, generated lazily (memory: the live sessions)."""
    spec = ProductionSpec() if spec is None else spec
    check_int("requests", requests, 1)
    check_int("seed", seed, 0)
    check_int("block_size", block_size, 1)
    return _Generator(spec, seed, block_size, partial_tail).run(requests)


@dataclass(frozen=True)
class ProductionWritten:
    """What :func:`write_production_trace` wrote, and the trace's statistics."""

    path: str | None
    records: int
    block_size: int
    unique_blocks: int
    total_blocks: int
    reused_blocks: int       # ids that occur in more than one request
    stats: WorkloadStats


def write_production_trace(path: str | os.PathLike | None, requests: int = 12_000, seed: int = 0, *,
                           spec: ProductionSpec | None = None, block_size: int = 256,
                           partial_tail: bool = True) -> ProductionWritten:
    """Write the trace (``path`` None: only count it). Lines hold ``timestamp``,
    ``input_length``, ``output_length``, ``block_size`` and ``hash_ids``, no conversation ids.

    ``stats.reusable_tokens`` is the prompt-only ceiling in whole blocks of ``block_size``
    (what :func:`~.request.summarize` of the read-back trace counts at that page size).
    """
    records = production_records(requests, seed, spec=spec, block_size=block_size, partial_tail=partial_tail)
    counts = bytearray()
    n = prompt = output = reusable = longest = total = 0
    last_ts = sessions = max_turns = 0
    out = open_text(Path(path), "w") if path is not None else None
    try:
        for rec in records:
            n += 1
            prompt += rec.input_length
            output += rec.output_length
            reusable += rec.reusable_tokens
            longest = max(longest, rec.input_length)
            total += len(rec.hash_ids)
            last_ts = rec.timestamp_ms
            max_turns = max(max_turns, rec.turn + 1)
            sessions += rec.turn == 0
            if rec.hash_ids and rec.hash_ids[-1] >= len(counts):
                counts.extend(bytes(rec.hash_ids[-1] + 1 - len(counts)))
            for i in rec.hash_ids:
                if counts[i] < 2:
                    counts[i] += 1
            if out is not None:
                out.write(json.dumps({"timestamp": rec.timestamp_ms, "input_length": rec.input_length,
                                      "output_length": rec.output_length, "block_size": block_size,
                                      "hash_ids": list(rec.hash_ids)}, separators=(",", ":")) + "\n")
    finally:
        if out is not None:
            out.close()
    arr = np.frombuffer(bytes(counts), dtype=np.uint8)
    stats = WorkloadStats(requests=n, conversations=sessions, max_turns=max_turns, prompt_tokens=prompt,
                          output_tokens=output, mean_prompt_tokens=prompt / n if n else 0.0,
                          max_prompt_tokens=longest, duration_s=last_ts / 1000.0, page_tokens=block_size,
                          reusable_tokens=reusable)
    return ProductionWritten(None if path is None else str(path), n, block_size, int((arr > 0).sum()), total,
                             int((arr > 1).sum()), stats)


def production(requests: int = 12_000, seed: int = 0, *, spec: ProductionSpec | None = None,
               block_size: int = 256) -> list[Request]:
    """The trace as replayable requests (tokens synthesised from the block ids, as
    :func:`~.trace.read_trace` would read the written file; every request independent)."""
    lines = []
    for i, rec in enumerate(production_records(requests, seed, spec=spec, block_size=block_size)):
        keys = tuple(str(x) for x in rec.hash_ids)
        lengths = tuple(sim_block_tokens(rec.input_length, block_size, j) for j in range(len(keys)))
        lines.append(TraceLine(i + 1, keys, lengths, rec.input_length - sum(lengths), float(rec.timestamp_ms),
                               rec.output_length, f"trace-{i}", 0, False))
    return requests_from_lines(lines, block_size, continuation=False)
