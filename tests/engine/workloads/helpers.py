"""Shared checks and file builders for the workload tests."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Sequence

import numpy as np

from hicache.engine.workloads import Request


def check_workload(requests: Sequence[Request], *, prefix_chain: bool = True) -> None:
    """The invariants every workload keeps: ids in arrival order, read-only int32 arrays,
    turns in order, and (built workloads) turn k+1's prompt = turn k's prompt + output + ..."""
    assert [r.request_id for r in requests] == list(range(len(requests)))
    times = [r.arrival_s for r in requests]
    assert times == sorted(times) and times[0] >= 0
    last: dict[str, Request] = {}
    for r in requests:
        for arr in (r.prompt, r.output):
            assert arr.dtype == np.int32 and arr.ndim == 1 and not arr.flags.writeable
        prev = last.get(r.conversation_id)
        assert r.turn == (0 if prev is None else prev.turn + 1), (r, prev)
        if prev is not None and prefix_chain:
            head = np.concatenate([prev.prompt, prev.output])
            assert r.prompt_len > len(head)
            assert np.array_equal(r.prompt[:len(head)], head), (r, prev)
        last[r.conversation_id] = r


def msg(role: str, text: str) -> dict:
    return {"from": role, "value": text}


def conv_messages(cid: str, n_pairs: int) -> list[dict]:
    """A conversation of n_pairs human/gpt pairs with distinct texts."""
    out = []
    for k in range(n_pairs):
        out.append(msg("human", f"{cid} question {k}: how does part {k} work?"))
        out.append(msg("gpt", f"{cid} answer {k}. Part {k} works like this, in detail."))
    return out


def sharegpt_bytes(items: list[dict]) -> bytes:
    """Items laid out as the packaged file is (a JSON array, indent 2)."""
    return json.dumps(items, indent=2, ensure_ascii=False).encode("utf-8")


def write_sharegpt(path: Path, items: list[dict], *, cut_bytes: int = 0) -> Path:
    data = sharegpt_bytes(items)
    path.write_bytes(data[:len(data) - cut_bytes] if cut_bytes else data)
    return path


def small_sharegpt_items() -> list[dict]:
    """Eight conversations; 'long' is split into three chunks (overlap, then adjacent)."""
    long_msgs = conv_messages("long", 5)  # 10 messages
    items = [
        {"id": "long_0", "conversations": long_msgs[0:4]},
        {"id": "long_3", "conversations": long_msgs[3:7]},   # repeats message 3
        {"id": "long_7", "conversations": long_msgs[7:10]},  # follows on
    ]
    for i in range(7):
        items.append({"id": f"c{i}_0", "conversations": conv_messages(f"c{i}", 1 + i % 3)})
    return items


def common_prefix(a: np.ndarray, b: np.ndarray) -> int:
    """How many leading tokens ``a`` and ``b`` have in common."""
    n = min(len(a), len(b))
    diff = np.flatnonzero(np.asarray(a[:n]) != np.asarray(b[:n]))
    return int(diff[0]) if len(diff) else n


def by_conversation(requests: Sequence[Request]) -> dict[str, list[Request]]:
    """{conversation id: its requests by turn}."""
    out: dict[str, list[Request]] = {}
    for r in sorted(requests, key=lambda r: (r.conversation_id, r.turn)):
        out.setdefault(r.conversation_id, []).append(r)
    return out
