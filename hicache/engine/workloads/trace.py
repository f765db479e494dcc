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
partial block is the first tokens of its id's full block. Outputs are synthesised per
request: a trace records only prompt blocks, so later prompts do not contain them.
"""

from __future__ import annotations

import gzip
import hashlib
import io
import json
import math
import os
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


def _int_field(record: dict, name: str, where: str, *, minimum: int, default: int | None = None) -> int:
    value = record.get(name, default)
    if value is None:
        raise ConfigError(f"{where}.{name}", None, "is required")
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise ConfigError(f"{where}.{name}", value, f"must be an integer >= {minimum}")
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


def load_trace(path: str | os.PathLike, *, block_size: int | None = None,
               vocab_size: int = DEFAULT_VOCAB) -> list[Request]:
    """Requests from a kvcache-simulator JSONL trace, one per line, in file order.

    ``block_size`` is the fallback for lines without one (as the simulator's
    ``--block-size``). Any malformed line raises ConfigError naming the line, so replaying
    a trace never silently differs from what the simulator counted.
    """
    p = Path(path)
    if not p.is_file():
        raise ConfigError("trace", str(path), "no such file")
    if block_size is not None:
        _check_block_size(block_size, "block_size")
    blocks: dict[str, np.ndarray] = {}
    requests: list[Request] = []
    trace_bs: int | None = None
    first_ts: float | None = None
    last_ts = -math.inf
    with _open(p, "r") as fh:
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
            keys = [_block_key(v, f"{where}.hash_ids") for v in hash_ids]
            input_length = _int_field(record, "input_length", where, minimum=1)
            bs = _int_field(record, "block_size", where, minimum=1, default=block_size)
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
            first_ts = ts if first_ts is None else first_ts
            output_length = _int_field(record, "output_length", where, minimum=0, default=0)
            conv = record.get("conversation_id", f"trace-{len(requests)}")
            turn = _int_field(record, "turn", where, minimum=0, default=0)
            parts = []
            for key, n in zip(keys, lengths):
                full = blocks.get(key)
                if full is None:
                    full = counter_tokens(stable_u64("trace-block", key), bs, low=FIRST_TEXT_ID,
                                          high=vocab_size)
                    full.flags.writeable = False
                    blocks[key] = full
                parts.append(full[:n])
            prompt = np.concatenate(parts)
            output = counter_tokens(stable_u64("trace-output", len(requests)), output_length,
                                    low=FIRST_TEXT_ID, high=vocab_size)
            prompt.flags.writeable = False
            output.flags.writeable = False
            requests.append(Request(len(requests), str(conv), turn, (ts - first_ts) / 1000.0, prompt, output))
    if not requests:
        raise ConfigError("trace", str(path), "has no records")
    return requests
