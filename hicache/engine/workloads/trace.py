"""Block-hash traces in the JSONL format of the ``kvcache-simulator`` package (and Mooncake).

One request per line (``.jsonl`` or ``.jsonl.gz``)::

    {"timestamp": 1250, "input_length": 700, "output_length": 96, "block_size": 256,
     "hash_ids": [0, 1, 7], "conversation_id": "syn-3", "turn": 1, "request_id": 4}

Which lines are requests, and how many tokens each block counts, is exactly what
kvcache-simulator 0.1.3 reads (:mod:`hicache.engine.workloads.trace_parse` lists the
rules): lines without ``hash_ids`` are skipped and counted, lines that are not JSON are
counted as parse errors, a hash list may cover the partial tail of the prompt or only
its full blocks. Its prefix trie keys a block by its whole path, so only the leading
blocks two requests have in common are shared. ``timestamp`` (milliseconds, as in
Mooncake traces), ``output_length``, ``conversation_id``, ``turn`` and ``request_id`` are
ours to replay the requests; the simulator ignores them. ``conversation_ids=False`` leaves
out ``conversation_id``, ``turn`` and ``request_id``: every line is then an independent
request, as in public production traces (Mooncake's), whatever the workload was.

Writing (:func:`write_trace`): block i's hash chains the previous block's hash with block
i's tokens (BLAKE2b), so equal ids mean equal prefixes; the chained hashes are numbered in
order of first appearance, giving small integer ids. The partial last block of a prompt is
a block of its own, as in the simulator's accounting (``partial_tail=False`` hashes full
blocks only: a prompt shorter than one block then has an empty ``hash_ids``, which the
simulator skips). A line whose next turn continues its prompt but not its output (a
reasoning turn: the next prompt drops the thinking) says ``"output_in_next": false``.

Reading (:func:`read_trace`): tokens are synthesised per block id (counter-mode hashing of
the id), so equal ids give equal token blocks, different ids different tokens, and a
partial block is the first tokens of its id's full block; an unhashed tail is the
request's own. A trace records only prompt blocks, so outputs are synthesised per
request, except along a conversation whose lines name ``conversation_id`` and ``turn``
(ours): there turn k's output is read from turn k+1's prompt and turn k's open end (partial
last block or unhashed tail) is made the start of turn k+1's piece there, so the loaded
requests keep "turn k+1 starts with turn k's prompt + output"::

    turn k     |  b0  |  b1  |x..|               x: partial last block (or tail) of turn k
    turn k+1   |  b0  |  b1  |  y   |  b3  |..   x's tokens := y's first tokens
                             |<-output k->|      output k := the tokens after prompt k

On a line with ``"output_in_next": false`` only the open end is linked; its output stays
synthetic, so turn k+1 again starts with turn k's prompt and not with its output.
"""

from __future__ import annotations

import hashlib
import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

import numpy as np

from hicache.engine.workloads._random import counter_tokens, stable_u64
from hicache.engine.workloads.request import Request
from hicache.engine.workloads.tokenizer import DEFAULT_VOCAB, FIRST_TEXT_ID
from hicache.engine.workloads.trace_parse import TraceLine, open_text, parse_trace
from hicache.units import check_int


@dataclass(frozen=True)
class TraceWritten:
    """What :func:`write_trace` wrote."""

    path: str
    records: int
    block_size: int
    unique_blocks: int
    total_blocks: int


def _output_in_next(requests: Sequence[Request]) -> set[int]:
    """Request ids whose next turn starts with their prompt but not with prompt + output."""
    by_turn = {(r.conversation_id, r.turn): r for r in requests}
    out = set()
    for r in requests:
        nxt = by_turn.get((r.conversation_id, r.turn + 1))
        if nxt is None or nxt.prompt_len <= r.prompt_len or not np.array_equal(nxt.prompt[:r.prompt_len], r.prompt):
            continue
        end = r.prompt_len + r.output_len
        if nxt.prompt_len < end or not np.array_equal(nxt.prompt[r.prompt_len:end], r.output):
            out.add(r.request_id)
    return out


def _check_block_size(block_size: object, field: str = "block_size") -> int:
    return check_int(field, block_size, minimum=1, reason="must be a positive integer")


def write_trace(requests: Sequence[Request], path: str | os.PathLike, block_size: int = 256, *,
                partial_tail: bool = True, conversation_ids: bool = True) -> TraceWritten:
    """Write ``requests`` (in request-id order) as a kvcache-simulator JSONL trace.

    ``partial_tail=False`` hashes only the full blocks of each prompt, as some trace tools
    do: ``input_length`` keeps the whole prompt, and a prompt shorter than one block gets
    an empty ``hash_ids`` (kvcache-simulator, and so :func:`read_trace`, skip that line).
    ``conversation_ids=False`` writes ``timestamp``, ``input_length``, ``output_length``,
    ``block_size`` and ``hash_ids`` only: the replay then sees independent requests.
    """
    _check_block_size(block_size)
    dropped = _output_in_next(requests) if conversation_ids else set()
    ids: dict[bytes, int] = {}
    total = 0
    p = Path(path)
    with open_text(p, "w") as out:
        for r in sorted(requests, key=lambda r: r.request_id):
            data = np.ascontiguousarray(r.prompt, dtype=np.int32).view(np.uint8)
            step = block_size * 4
            prev, hash_ids = b"", []
            end = len(data) if partial_tail else len(data) // step * step
            for start in range(0, end, step):
                prev = hashlib.blake2b(prev + data[start:start + step].tobytes(), digest_size=16).digest()
                hash_ids.append(ids.setdefault(prev, len(ids)))
            total += len(hash_ids)
            record: dict[str, object] = {"timestamp": int(round(r.arrival_s * 1000))}
            if conversation_ids:
                record.update(request_id=r.request_id, conversation_id=r.conversation_id, turn=r.turn)
                if r.request_id in dropped:
                    record["output_in_next"] = False
            record.update(input_length=r.prompt_len, output_length=r.output_len, block_size=block_size,
                          hash_ids=hash_ids)
            out.write(json.dumps(record, separators=(",", ":")) + "\n")
    return TraceWritten(str(p), len(requests), block_size, len(ids), total)


Key = "str | tuple[str, int]"  # a hash id, or ("tail", line) for an unhashed prompt tail


def _elements(r: TraceLine, i: int) -> list[tuple[object, int]]:
    """The prompt of record ``i`` as (key, tokens) pieces: hashed blocks, then the tail."""
    out: list[tuple[object, int]] = list(zip(r.keys, r.lengths))
    if r.tail:
        out.append((("tail", i), r.tail))
    return out


def _link_turns(records: Sequence[TraceLine], bs: int) -> tuple[dict, dict[int, int]]:
    """Where turn k+1 of a conversation continues turn k, tie their tokens together.

    Returns ``alias`` (the open end of turn k -- its partial last block or its unhashed
    tail -- -> the piece of turn k+1 at the same position, whose first tokens it then
    shares) and ``output_from`` (request of turn k -> request of turn k+1, whose prompt
    holds turn k's output right after turn k's prompt). Applied only when turn k+1's
    pieces start with turn k's full blocks, its piece at the open end is at least as long,
    and its prompt is long enough to hold turn k's prompt and output. On a line that says
    ``output_in_next: false`` only the open end is linked (no output from turn k+1).
    """
    alias: dict = {}
    output_from: dict[int, int] = {}
    where: dict[tuple[str, int], int] = {}
    for i, r in enumerate(records):
        if r.in_conversation:
            where.setdefault((r.conversation_id, r.turn), i)
    for i, r in enumerate(records):
        j = where.get((r.conversation_id, r.turn + 1)) if r.in_conversation else None
        if j is None or j <= i:
            continue
        nxt = records[j]
        mine, theirs = _elements(r, i), _elements(nxt, j)
        full = 0
        while full < len(mine) and mine[full][1] == bs:
            full += 1
        if full < len(mine) - 1:
            continue  # a short piece in the middle (explicit block_tokens): no clean end
        needed = r.prompt_len + (r.output_length if r.output_in_next else 1)
        if nxt.keys[:full] != r.keys[:full] or len(theirs) < full or nxt.prompt_len < needed:
            continue
        if full < len(mine):
            (x, n), (y, m) = mine[full], (theirs[full] if full < len(theirs) else (None, 0))
            if y is None or m < n or alias.get(x, y) != y or _reaches(alias, y, x):
                continue
            alias[x] = y
        if r.output_in_next:
            output_from[i] = j
    return alias, output_from


def _reaches(alias: dict, start: object, target: object) -> bool:
    """True when following aliases from ``start`` arrives at ``target`` (a cycle to refuse)."""
    seen = set()
    while start not in seen:
        if start == target:
            return True
        seen.add(start)
        if start not in alias:
            return False
        start = alias[start]
    return False


@dataclass(frozen=True)
class LoadedTrace:
    """:func:`read_trace`'s result: the requests and what the reader passed over.

    ``skipped_records`` and ``parse_errors`` are exactly kvcache-simulator's counts on the
    same file; ``requests[i].source_line`` is the file line of request ``i``.
    """

    requests: list[Request]
    block_size: int
    skipped_records: int
    parse_errors: int
    first_parse_error: str | None
    clamped_timestamps: int
    hashed_tokens: int  # prompt tokens the simulator counts (unhashed tails excluded)

    def info(self) -> dict:
        return {"skipped_records": self.skipped_records, "parse_errors": self.parse_errors,
                "first_parse_error": self.first_parse_error, "clamped_timestamps": self.clamped_timestamps,
                "trace_block_size": self.block_size, "trace_hashed_tokens": self.hashed_tokens}


def read_trace(path: str | os.PathLike, *, block_size: int | None = None,
               vocab_size: int = DEFAULT_VOCAB, continuation: bool = True) -> LoadedTrace:
    """Requests from a kvcache-simulator JSONL trace, one per record the simulator counts.

    Lines are read exactly as kvcache-simulator 0.1.3 reads them
    (:mod:`hicache.engine.workloads.trace_parse`): what it skips (no ``hash_ids``, not an
    object) and what is not JSON are counted, not replayed; what it refuses raises
    ConfigError naming the line. ``block_size`` is the fallback for lines without one.

    ``continuation`` (lines that name ``conversation_id`` and ``turn``, as
    :func:`write_trace` writes them): turn k's output is taken from turn k+1's prompt, and
    turn k's open end (partial last block, or unhashed tail) is the start of turn k+1's
    piece at that position, so turn k+1's prompt starts with turn k's prompt + output, as
    in the workload that was written. The hash ids, and so what kvcache-simulator sees,
    are unchanged. With ``continuation=False`` every block's tokens come from its id alone,
    every tail is the request's own and every output is synthetic.
    """
    if block_size is not None:
        _check_block_size(block_size, "block_size")
    parsed = parse_trace(path, block_size=block_size)
    requests = requests_from_lines(parsed.lines, parsed.block_size, vocab_size=vocab_size, continuation=continuation)
    return LoadedTrace(requests, parsed.block_size, parsed.skipped_records, parsed.parse_errors,
                       parsed.first_parse_error, parsed.clamped_timestamps,
                       sum(r.hashed_tokens for r in parsed.lines))


def requests_from_lines(records: Sequence[TraceLine], bs: int, *, vocab_size: int = DEFAULT_VOCAB,
                        continuation: bool = True) -> list[Request]:
    """Requests with tokens synthesised from the records' hash ids, as :func:`read_trace`
    makes them (also the ``production`` workload's, whose records need not be a file)."""
    alias, output_from = _link_turns(records, bs) if continuation else ({}, {})
    streams: dict = {}

    def tokens(key, n: int) -> np.ndarray:
        # An aliased piece shares its successor's tokens; aliases point to later turns
        # only, so the chain ends. Token i depends on (root key, i) alone, so any length
        # of one key's stream starts with its shorter lengths.
        while key in alias:
            key = alias[key]
        have = streams.get(key)
        if have is None or len(have) < n:
            seed = stable_u64("trace-block", key) if isinstance(key, str) else stable_u64("trace-tail", key[1])
            have = counter_tokens(seed, max(n, bs), low=FIRST_TEXT_ID, high=vocab_size)
            streams[key] = have
        return have[:n]

    prompts = []
    for i, r in enumerate(records):
        prompt = np.concatenate([tokens(k, n) for k, n in _elements(r, i)])
        prompt.flags.writeable = False
        prompts.append(prompt)
    first_ts = records[0].timestamp_ms if records else 0.0
    requests = []
    for i, r in enumerate(records):
        j = output_from.get(i)
        if j is not None:
            output = prompts[j][r.prompt_len:r.prompt_len + r.output_length]
        else:
            output = counter_tokens(stable_u64("trace-output", i), r.output_length,
                                    low=FIRST_TEXT_ID, high=vocab_size)
            output.flags.writeable = False
        requests.append(Request(i, r.conversation_id, r.turn, (r.timestamp_ms - first_ts) / 1000.0,
                                prompts[i], output, source_line=r.line, hashed_tokens=r.hashed_tokens))
    return requests


def load_trace(path: str | os.PathLike, *, block_size: int | None = None,
               vocab_size: int = DEFAULT_VOCAB, continuation: bool = True) -> list[Request]:
    """:func:`read_trace`'s requests (same arguments)."""
    return read_trace(path, block_size=block_size, vocab_size=vocab_size, continuation=continuation).requests
