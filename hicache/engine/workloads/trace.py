"""Block-hash traces in the JSONL format of the ``kvcache-simulator`` package (and Mooncake).

One request per line (``.jsonl`` or ``.jsonl.gz``)::

    {"timestamp": 1250, "input_length": 700, "output_length": 96, "block_size": 256,
     "hash_ids": [0, 1, 7], "conversation_id": "syn-3", "turn": 1, "request_id": 4}

What kvcache-simulator (0.1.3, ``kvcache_sim/trace.py``) reads: ``hash_ids`` (a non-empty
list of integers or strings; ``5`` and ``"5"`` are the same block), ``input_length``
(positive), ``block_size`` (positive, the same on every line) and optionally ``block_tokens``
(tokens per block). Block i holds ``block_size`` tokens except the last, which holds
``input_length - (n-1) * block_size``. Its prefix trie keys a block by its whole path, so
only the leading blocks two requests have in common are shared. It ignores every other
field; ``timestamp`` (milliseconds, as in Mooncake traces), ``output_length``,
``conversation_id``, ``turn`` and ``request_id`` are ours to replay the requests.

Writing (:func:`write_trace`): block i's hash chains the previous block's hash with block
i's tokens (BLAKE2b), so equal ids mean equal prefixes; the chained hashes are numbered in
order of first appearance, giving small integer ids. The partial last block of a prompt is
a block of its own, as in the simulator's accounting.

Reading (:func:`load_trace`): tokens are synthesised per block id (counter-mode hashing of
the id), so equal ids give equal token blocks, different ids different tokens, and a
partial block is the first tokens of its id's full block. A trace records only prompt
blocks, so outputs are synthesised per request, except along a conversation whose lines
name ``conversation_id`` and ``turn`` (ours): there turn k's output is read from turn k+1's
prompt and turn k's partial last block is made the start of turn k+1's block, so the
loaded requests keep "turn k+1 starts with turn k's prompt + output"::

    turn k     |  b0  |  b1  |x..|               x: partial last block of turn k
    turn k+1   |  b0  |  b1  |  y   |  b3  |..   x's tokens := y's first tokens
                             |<-output k->|      output k := the tokens after prompt k
"""

from __future__ import annotations

import gzip
import hashlib
import io
import json
import math
import os
import zlib
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Sequence

import numpy as np

from hicache.engine.workloads._random import counter_tokens, stable_u64
from hicache.engine.workloads.request import Request
from hicache.engine.workloads.tokenizer import DEFAULT_VOCAB, FIRST_TEXT_ID
from hicache.errors import ConfigError


@dataclass(frozen=True)
class TraceWritten:
    """What :func:`write_trace` wrote."""

    path: str
    records: int
    block_size: int
    unique_blocks: int
    total_blocks: int


# Prompt or output tokens of one request: 16x the longest context served today, and a bound
# that keeps a typo (input_length 10**12) an error instead of a terabyte allocation.
MAX_REQUEST_TOKENS = 1 << 24


def _open(path: Path, mode: str) -> IO[str]:
    if path.suffix == ".gz":
        return io.TextIOWrapper(gzip.open(path, mode + "b"), encoding="utf-8")
    return path.open(mode, encoding="utf-8")


def _check_block_size(block_size: object, field: str = "block_size") -> int:
    if isinstance(block_size, bool) or not isinstance(block_size, int) or block_size < 1:
        raise ConfigError(field, block_size, "must be a positive integer")
    return block_size


def write_trace(requests: Sequence[Request], path: str | os.PathLike, block_size: int = 256) -> TraceWritten:
    """Write ``requests`` (in request-id order) as a kvcache-simulator JSONL trace."""
    _check_block_size(block_size)
    ids: dict[bytes, int] = {}
    total = 0
    p = Path(path)
    with _open(p, "w") as out:
        for r in sorted(requests, key=lambda r: r.request_id):
            data = np.ascontiguousarray(r.prompt, dtype=np.int32).view(np.uint8)
            step = block_size * 4
            prev, hash_ids = b"", []
            for start in range(0, len(data), step):
                prev = hashlib.blake2b(prev + data[start:start + step].tobytes(), digest_size=16).digest()
                hash_ids.append(ids.setdefault(prev, len(ids)))
            total += len(hash_ids)
            record = {"timestamp": int(round(r.arrival_s * 1000)), "request_id": r.request_id,
                      "conversation_id": r.conversation_id, "turn": r.turn,
                      "input_length": r.prompt_len, "output_length": r.output_len,
                      "block_size": block_size, "hash_ids": hash_ids}
            out.write(json.dumps(record, separators=(",", ":")) + "\n")
    return TraceWritten(str(p), len(requests), block_size, len(ids), total)


def _block_key(value: object, where: str) -> str:
    # The simulator interns str(value): 5 and "5" are one block; booleans are refused.
    if isinstance(value, bool) or not isinstance(value, (int, str)):
        raise ConfigError(where, value, "hash ids must be integers or strings")
    return str(value)


def _int_field(record: dict, name: str, where: str, *, minimum: int, default: int | None = None,
               maximum: int | None = None) -> int:
    value = record.get(name, default)
    if value is None:
        raise ConfigError(f"{where}.{name}", None, "is required")
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise ConfigError(f"{where}.{name}", value, f"must be an integer >= {minimum}")
    if maximum is not None and value > maximum:
        raise ConfigError(f"{where}.{name}", value, f"must be <= {maximum:,} tokens (one request's tokens are "
                                                    "materialized in memory)")
    return value


def _block_lengths(record: dict, n: int, input_length: int, block_size: int, where: str) -> list[int]:
    explicit = record.get("block_tokens")
    if explicit is not None:
        if not isinstance(explicit, list) or len(explicit) != n:
            raise ConfigError(f"{where}.block_tokens", explicit, f"must list one count per hash id ({n})")
        for v in explicit:
            if isinstance(v, bool) or not isinstance(v, int) or not 1 <= v <= block_size:
                raise ConfigError(f"{where}.block_tokens", explicit, f"counts must be in 1..{block_size}")
        if sum(explicit) != input_length:
            raise ConfigError(f"{where}.block_tokens", explicit,
                              f"add up to {sum(explicit)}, not input_length={input_length}")
        return explicit
    if not (n - 1) * block_size < input_length <= n * block_size:
        raise ConfigError(f"{where}.input_length", input_length,
                          f"does not fit {n} hash ids of {block_size} tokens "
                          f"(needs {(n - 1) * block_size + 1}..{n * block_size})")
    return [block_size] * (n - 1) + [input_length - (n - 1) * block_size]


@dataclass(frozen=True)
class _Record:
    keys: tuple[str, ...]
    lengths: tuple[int, ...]
    timestamp: float
    output_length: int
    conversation_id: str
    turn: int
    in_conversation: bool  # the line named its conversation and turn (our traces do)

    @property
    def input_length(self) -> int:
        return sum(self.lengths)


def _parse(p: Path, block_size: int | None) -> tuple[list[_Record], int]:
    records: list[_Record] = []
    try:
        with _open(p, "r") as fh:
            trace_bs = _parse_lines(p, fh, block_size, records)
    except UnicodeDecodeError as exc:
        raise ConfigError("trace", str(p), f"is not UTF-8 text (byte 0x{exc.object[exc.start]:02x} "
                                           f"near offset {exc.start})") from None
    except (OSError, EOFError, zlib.error) as exc:  # a truncated or damaged .gz
        raise ConfigError("trace", str(p), f"cannot be read: {getattr(exc, 'strerror', None) or exc}") from None
    if trace_bs is None:
        raise ConfigError("trace", str(p), "has no records")
    return records, trace_bs


def _parse_lines(p: Path, fh: IO[str], block_size: int | None, records: list[_Record]) -> int | None:
    """Append one record per line to ``records``; returns the trace's block size (None: empty)."""
    trace_bs: int | None = None
    last_ts = -math.inf
    for lineno, line in enumerate(fh, 1):
        if not line.strip():
            continue
        where = f"{p.name}:{lineno}"
        try:
            record = json.loads(line)
        except json.JSONDecodeError as exc:
            raise ConfigError(where, line.strip()[:60], f"is not valid JSON ({exc.msg})") from None
        if not isinstance(record, dict):
            raise ConfigError(where, record, "must be a JSON object")
        hash_ids = record.get("hash_ids")
        if not isinstance(hash_ids, list) or not hash_ids:
            raise ConfigError(f"{where}.hash_ids", hash_ids, "must be a non-empty list")
        keys = tuple(_block_key(v, f"{where}.hash_ids") for v in hash_ids)
        input_length = _int_field(record, "input_length", where, minimum=1, maximum=MAX_REQUEST_TOKENS)
        bs = _int_field(record, "block_size", where, minimum=1, default=block_size, maximum=MAX_REQUEST_TOKENS)
        if trace_bs is None:
            trace_bs = bs
        elif bs != trace_bs:
            raise ConfigError(f"{where}.block_size", bs, f"differs from the trace's {trace_bs}")
        lengths = _block_lengths(record, len(keys), input_length, bs, where)
        ts = record.get("timestamp", last_ts if last_ts > -math.inf else 0)
        if isinstance(ts, bool) or not isinstance(ts, (int, float)) or not math.isfinite(ts):
            raise ConfigError(f"{where}.timestamp", ts, "must be a number of milliseconds")
        if ts < last_ts:
            raise ConfigError(f"{where}.timestamp", ts, f"is earlier than the previous line's {last_ts}")
        last_ts = ts
        in_conv = "conversation_id" in record and "turn" in record
        records.append(_Record(
            keys, tuple(lengths), float(ts),
            _int_field(record, "output_length", where, minimum=0, default=0, maximum=MAX_REQUEST_TOKENS),
            str(record.get("conversation_id", f"trace-{len(records)}")),
            _int_field(record, "turn", where, minimum=0, default=0), in_conv))
    return trace_bs


def _link_turns(records: list[_Record], bs: int) -> tuple[dict[str, str], dict[int, int]]:
    """Where turn k+1 of a conversation continues turn k, tie their tokens together.

    Returns ``alias`` (partial last block of turn k -> the block of turn k+1 at the same
    position, whose first tokens it then shares) and ``output_from`` (request of turn k ->
    request of turn k+1, whose prompt holds turn k's output right after turn k's prompt).
    Applied only when turn k+1's blocks start with turn k's full blocks and its prompt is
    long enough to hold turn k's prompt and output.
    """
    alias: dict[str, str] = {}
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
        partial = r.lengths[-1] < bs
        full = len(r.keys) - partial
        if nxt.keys[:full] != r.keys[:full] or nxt.input_length < r.input_length + r.output_length:
            continue
        if partial:
            x, y = r.keys[-1], nxt.keys[full]
            if alias.get(x, y) != y or nxt.lengths[full] < r.lengths[-1] or _reaches(alias, y, x):
                continue
            alias[x] = y
        output_from[i] = j
    return alias, output_from


def _reaches(alias: dict[str, str], start: str, target: str) -> bool:
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


def load_trace(path: str | os.PathLike, *, block_size: int | None = None,
               vocab_size: int = DEFAULT_VOCAB, continuation: bool = True) -> list[Request]:
    """Requests from a kvcache-simulator JSONL trace, one per line, in file order.

    ``block_size`` is the fallback for lines without one (as the simulator's
    ``--block-size``). Any malformed line raises ConfigError naming the line, so replaying
    a trace never silently differs from what the simulator counted.

    ``continuation`` (lines that name ``conversation_id`` and ``turn``, as
    :func:`write_trace` writes them): turn k's output is taken from turn k+1's prompt, and
    turn k's partial last block is the start of turn k+1's block at that position, so turn
    k+1's prompt starts with turn k's prompt + output, as in the workload that was written.
    The hash ids, and so what kvcache-simulator sees, are unchanged. With
    ``continuation=False`` every block's tokens come from its id alone and every output is
    synthetic.
    """
    p = Path(path)
    if not p.is_file():
        raise ConfigError("trace", str(path), "no such file")
    if block_size is not None:
        _check_block_size(block_size, "block_size")
    records, bs = _parse(p, block_size)
    alias, output_from = _link_turns(records, bs) if continuation else ({}, {})
    blocks: dict[str, np.ndarray] = {}

    def block(key: str) -> np.ndarray:
        # An aliased partial block shares its successor's tokens; aliases point to later
        # turns only, so the chain ends.
        if key not in blocks:
            if key in alias:
                blocks[key] = block(alias[key])
            else:
                full = counter_tokens(stable_u64("trace-block", key), bs, low=FIRST_TEXT_ID, high=vocab_size)
                full.flags.writeable = False
                blocks[key] = full
        return blocks[key]

    prompts = []
    for r in records:
        prompt = np.concatenate([block(k)[:n] for k, n in zip(r.keys, r.lengths)])
        prompt.flags.writeable = False
        prompts.append(prompt)
    first_ts = records[0].timestamp
    requests = []
    for i, r in enumerate(records):
        j = output_from.get(i)
        if j is not None:
            output = prompts[j][r.input_length:r.input_length + r.output_length]
        else:
            output = counter_tokens(stable_u64("trace-output", i), r.output_length,
                                    low=FIRST_TEXT_ID, high=vocab_size)
            output.flags.writeable = False
        requests.append(Request(i, r.conversation_id, r.turn, (r.timestamp - first_ts) / 1000.0,
                                prompts[i], output))
    return requests
