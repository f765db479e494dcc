"""Reading kvcache-simulator / Mooncake JSONL exactly as kvcache-simulator 0.1.3 does.

A replay must see the same requests the simulator counts, or the two hit rates compare
different traffic. ``kvcache_sim/trace.py`` (0.1.3) reads each stripped, non-empty line:

==========================================  ==========================================
line                                        kvcache-simulator, and so :func:`parse_trace`
==========================================  ==========================================
not JSON                                    ``parse_errors`` += 1, line ignored
JSON but not an object                      ``skipped_records`` += 1
``hash_ids`` missing, not a list, or empty  ``skipped_records`` += 1 (a prompt shorter
                                            than one block, when only full blocks are
                                            hashed)
``input_length`` missing or ``int()`` <= 0  the whole trace is refused
``block_size`` present but ``int()`` <= 0,  the whole trace is refused
or not the first record's value
a hash id that is a bool, float, list ...   the whole trace is refused
``block_tokens`` present, not a list of     the whole trace is refused
positive ints, one per hash id
no ``block_size`` on any line and no        the whole trace is refused
fallback
no usable record                            the whole trace is refused
anything else (unknown fields too)          a request
==========================================  ==========================================

``int()`` is Python's: ``480.9`` reads 480, ``"480"`` reads 480, ``"4.5"`` and ``null`` read
0. Hash ids are interned by ``str(value)``, so ``5`` and ``"5"`` are one block. Block i
counts ``block_tokens[i]`` tokens when given, else ``max(1, min(block_size, input_length -
i * block_size))``: a list covering only the full blocks of a prompt counts those blocks
(the partial tail is simply not hashed), one covering the tail too counts it as a block of
``input_length - (n-1) * block_size`` tokens, and ids past the prompt count 1 token each.

What we add for the replay (the simulator ignores these fields): ``timestamp``
(milliseconds; missing or not a number: the previous line's; earlier than the previous
line: raised to it, so file order is arrival order), ``output_length`` (non-negative
``int()``, else 0), ``conversation_id`` and ``turn`` (a non-negative ``int()``; lines naming
both are linked into conversations by :mod:`hicache.engine.workloads.trace`), and
``output_in_next`` (only a JSON ``false`` counts: the next turn continues this prompt but
not this output, as a reasoning model's next turn drops the thinking). A prompt is
``max(input_length, sum of block tokens)`` tokens: the hashed blocks, then an unhashed tail
of ``input_length - sum`` tokens when the ids stop short of ``input_length``.

Where we refuse what the simulator reads: a request of more than :data:`MAX_REQUEST_TOKENS`
prompt or output tokens (we materialise its tokens; it only counts them), and a file that
cannot be read (a damaged ``.gz``).
"""

from __future__ import annotations

import gzip
import io
import json
import math
import os
import zlib
from dataclasses import dataclass
from pathlib import Path
from typing import IO, SupportsIndex, SupportsInt, TypedDict

from hicache.errors import ConfigError
from hicache.inputs import MAX_LINE_BYTES, json_line
from hicache.units import check_int

REFUSED = "kvcache-simulator refuses such a trace too"
# Prompt or output tokens of one request: 16x the longest context served today, and a bound
# that keeps a typo (input_length 10**12) an error instead of a terabyte allocation. The
# simulator, which only counts tokens, would read such a line; we cannot replay it.
MAX_REQUEST_TOKENS = 1 << 24


@dataclass(frozen=True)
class TraceLine:
    """One record the simulator counts as a request, in file order."""

    line: int                     # 1-based line number in the file
    keys: tuple[str, ...]         # interned hash ids (str(value))
    lengths: tuple[int, ...]      # tokens per hashed block, as the simulator counts them
    tail: int                     # prompt tokens past the hashed blocks (unhashed)
    timestamp_ms: float
    output_length: int
    conversation_id: str
    turn: int
    in_conversation: bool         # the line named conversation_id and a valid turn
    output_in_next: bool = True   # false: the next turn keeps this prompt but not this output

    @property
    def hashed_tokens(self) -> int:
        return sum(self.lengths)

    @property
    def prompt_len(self) -> int:
        return self.hashed_tokens + self.tail


@dataclass(frozen=True)
class ParsedTrace:
    """What :func:`parse_trace` read: the usable records and what it passed over."""

    lines: tuple[TraceLine, ...]
    block_size: int
    skipped_records: int          # as the simulator's ``skipped_records``
    parse_errors: int             # as the simulator's ``parse_errors``
    first_parse_error: str | None  # "FILE:LINE: message" of the first one
    clamped_timestamps: int       # timestamps raised to the previous line's


def open_text(path: Path, mode: str = "r") -> IO[str]:
    """A text handle; ``.gz`` is gzip. Reading replaces bad UTF-8, as the simulator does."""
    errors = "replace" if mode == "r" else "strict"
    if path.suffix == ".gz":
        return io.TextIOWrapper(gzip.GzipFile(path, mode + "b"), encoding="utf-8", errors=errors)
    return path.open(mode, encoding="utf-8", errors=errors)


def sim_int(value: object, where: str) -> int:
    """Python's ``int(value)``, 0 when it raises TypeError or ValueError (the simulator's rule)."""
    if not isinstance(value, (int, float, str, bytes, bytearray, SupportsInt, SupportsIndex)):
        return 0  # what int() raises TypeError for: None, lists, objects
    try:
        return int(value)
    except (TypeError, ValueError):
        return 0
    except OverflowError:  # int(float("inf")): the simulator crashes on it
        raise ConfigError(where, value, f"is not a finite number; {REFUSED}") from None


def _hash_key(value: object, where: str) -> str:
    if isinstance(value, bool) or not isinstance(value, (int, str)):
        raise ConfigError(where, value, f"hash ids must be integers or strings; {REFUSED}")
    return str(value)


def sim_block_tokens(input_length: int, block_size: int, index: int) -> int:
    """Tokens the simulator counts for hash id ``index`` (``kvcache_sim.trace.block_tokens``)."""
    remaining = input_length - index * block_size
    return 1 if remaining <= 0 else max(1, min(block_size, remaining))


class _TraceState(TypedDict):
    """What :func:`_read_record` learns across lines."""

    block_size: int | None           # the first record's block size
    without_block_size: str | None   # "FILE:LINE" of the first record without one


@dataclass
class _Raw:
    line: int
    record: dict
    keys: tuple[str, ...]
    input_length: int
    explicit: tuple[int, ...] | None


def _read_record(record: dict, where: str, state: _TraceState) -> _Raw | None:
    """Check one JSON object as the simulator does; None when it skips it."""
    hash_ids = record.get("hash_ids")
    if not isinstance(hash_ids, list) or not hash_ids:
        return None
    input_length = sim_int(record.get("input_length", 0), f"{where}.input_length")
    if input_length <= 0:
        raise ConfigError(f"{where}.input_length", record.get("input_length"),
                          f"must be a positive integer; {REFUSED}")
    if record.get("block_size") is not None:
        bs = sim_int(record["block_size"], f"{where}.block_size")
        if bs <= 0:
            raise ConfigError(f"{where}.block_size", record["block_size"], f"must be a positive integer; {REFUSED}")
        if state["block_size"] is None:
            state["block_size"] = bs
        elif bs != state["block_size"]:
            raise ConfigError(f"{where}.block_size", bs, f"differs from the trace's {state['block_size']}; {REFUSED}")
    else:
        state["without_block_size"] = state["without_block_size"] or where
    keys = tuple(_hash_key(v, f"{where}.hash_ids") for v in hash_ids)
    explicit = None
    if record.get("block_tokens") is not None:
        values = record["block_tokens"]
        if not isinstance(values, list) or len(values) != len(keys):
            raise ConfigError(f"{where}.block_tokens", values,
                              f"must list one token count per hash id ({len(keys)}); {REFUSED}")
        explicit = tuple(sim_int(v, f"{where}.block_tokens") for v in values)
        if min(explicit) <= 0:
            raise ConfigError(f"{where}.block_tokens", values, f"counts must be positive integers; {REFUSED}")
    return _Raw(0, record, keys, input_length, explicit)


def _extras(record: dict, where: str, last_ts: float) -> tuple[float, int, str | None, int, bool, bool]:
    """The fields the simulator ignores: timestamp, output_length, conversation_id, turn."""
    ts = record.get("timestamp")
    if isinstance(ts, bool) or not isinstance(ts, (int, float)) or not math.isfinite(ts):
        ts = last_ts
    output = record.get("output_length")
    output = max(0, sim_int(output, f"{where}.output_length")) if output is not None else 0
    turn_value = record.get("turn")
    turn = sim_int(turn_value, f"{where}.turn") if turn_value is not None else -1
    conv = record.get("conversation_id")
    conv = None if conv is None or isinstance(conv, (dict, list)) else str(conv)
    in_conv = conv is not None and turn_value is not None and turn >= 0
    return float(ts), output, conv, max(turn, 0), in_conv, record.get("output_in_next") is not False


def parse_trace(path: str | os.PathLike[str], *, block_size: int | None = None) -> ParsedTrace:
    """The records kvcache-simulator 0.1.3 counts as requests, in file order (see module doc).

    ``block_size`` is the fallback for lines without one (the simulator's ``--block-size``).
    Raises ConfigError, naming the first offending line, where the simulator refuses the
    whole trace.
    """
    if block_size is not None:
        check_int("block_size", block_size, minimum=1, reason="must be a positive integer (tokens per hash id)")
    p = Path(path)
    if not p.is_file():
        raise ConfigError("trace", str(path), "no such file")
    state: _TraceState = {"block_size": None, "without_block_size": None}
    raws: list[_Raw] = []
    skipped = parse_errors = 0
    first_error: str | None = None
    try:
        with open_text(p) as fh:
            # a line is read at most MAX_LINE_BYTES (+1) at a time: one with no end is refused,
            # not read whole into memory
            for lineno, text in enumerate(iter(lambda: fh.readline(MAX_LINE_BYTES + 1), ""), 1):
                where = f"{p.name}:{lineno}"
                if len(text) > MAX_LINE_BYTES:
                    raise ConfigError(where, "...", f"is longer than {MAX_LINE_BYTES:,} characters")
                line = text.strip()
                if not line:
                    continue
                try:   # deep nesting and over-long integers: one line naming the field (hicache.inputs)
                    record = json_line(line, where)
                except json.JSONDecodeError as exc:
                    parse_errors += 1
                    first_error = first_error or f"{where}: not valid JSON ({exc.msg}): {line[:60]}"
                    continue
                raw = _read_record(record, where, state) if isinstance(record, dict) else None
                if raw is None:
                    skipped += 1
                    continue
                raw.line = lineno
                raws.append(raw)
    except (OSError, EOFError, zlib.error) as exc:  # a truncated or damaged .gz
        raise ConfigError("trace", str(p), f"cannot be read: {getattr(exc, 'strerror', None) or exc}") from None
    bs = state["block_size"] or block_size
    if state["without_block_size"] and not bs:
        raise ConfigError(f"{state['without_block_size']}.block_size", None,
                          f"is missing on every line and no fallback block size was given (--block-size, as "
                          f"kvcache-simulator's); {REFUSED}")
    if not raws:
        raise ConfigError("trace", str(p), f"has no usable records ({skipped} skipped, {parse_errors} "
                                           f"not JSON); {REFUSED}")
    # every usable record set the trace's block size, or named itself without one (checked above)
    assert bs is not None
    lines: list[TraceLine] = []
    clamped, last_ts = 0, -math.inf
    for raw in raws:
        where = f"{p.name}:{raw.line}"
        ts, output, conv, turn, in_conv, output_in_next = _extras(raw.record, where,
                                                                  last_ts if last_ts > -math.inf else 0.0)
        if ts < last_ts:
            ts, clamped = last_ts, clamped + 1
        last_ts = ts
        if raw.explicit is not None:
            lengths = raw.explicit
        else:
            lengths = tuple(sim_block_tokens(raw.input_length, bs, i) for i in range(len(raw.keys)))
        tail = max(0, raw.input_length - sum(lengths))
        for name, n in (("input_length", raw.input_length), ("block_tokens", sum(lengths)), ("output_length", output)):
            if n > MAX_REQUEST_TOKENS:
                raise ConfigError(f"{where}.{name}", n, f"must be <= {MAX_REQUEST_TOKENS:,} tokens (one request's "
                                                        "tokens are materialized in memory)")
        lines.append(TraceLine(raw.line, raw.keys, lengths, tail, ts, output,
                               conv if conv is not None else f"trace-{len(lines)}", turn, in_conv,
                               output_in_next))
    return ParsedTrace(tuple(lines), int(bs), skipped, parse_errors, first_error, clamped)
