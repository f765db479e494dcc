"""What a workload is: a list of :class:`Request`, sorted by arrival.

Every workload builds conversations first (one token buffer per conversation, turns as
offsets into it), then :func:`schedule` gives them arrival times and flattens them into
requests. A turn's prompt and output are read-only *views* of the conversation buffer, so a
1M-token conversation of six turns costs 4 MB, not six copies::

    buffer   |bos sys ... eot|user q1 eot|asst|a1 eot|user q2 eot|asst|a2 eot|
    turn 0   |<------------- prompt ------------>|<output>|
    turn 1   |<------------------------- prompt ------------------------>|<output>|

Arrival model (open loop, per conversation): conversation starts form a Poisson process of
``arrival_rate`` per second (all at t=0 when None); turn k+1 arrives an exponential
``think_time_s`` after turn k; with ``max_active`` a conversation starts only when one of
the earlier ones has closed (one think time after its last turn). An engine that must not
run turn k+1 before turn k finishes orders them by ``(conversation_id, turn)``.
"""

from __future__ import annotations

import hashlib
import heapq
from dataclasses import dataclass
from typing import Sequence

import numpy as np

from hicache.engine.workloads._random import stream
from hicache.units import check_int, check_number


@dataclass(frozen=True, eq=False)
class Request:
    """One turn of one conversation, as the engine receives it.

    ``prompt`` and ``output`` are read-only int32 arrays. For multi-turn workloads built
    here (synthetic, ShareGPT, agentic, RAG follow-ups), turn k+1's prompt starts with turn
    k's ``prompt + output`` exactly; in the reasoning workload it starts with turn k's
    ``prompt`` only (the output opens with thinking that later prompts drop). Requests
    loaded from a trace carry synthetic outputs that later prompts do not contain (a trace
    records only prompt blocks), except along linked turns. ``source_line`` is the trace
    line a request was read from (None for built workloads); ``hashed_tokens`` how many of
    its prompt tokens kvcache-simulator counts (its hashed blocks; None for built
    workloads, whose written traces hash every prompt token).
    """

    request_id: int
    conversation_id: str
    turn: int
    arrival_s: float
    prompt: np.ndarray
    output: np.ndarray
    source_line: int | None = None
    hashed_tokens: int | None = None

    def __post_init__(self) -> None:
        for name in ("prompt", "output"):
            arr = getattr(self, name)
            assert isinstance(arr, np.ndarray) and arr.dtype == np.int32 and arr.ndim == 1, \
                f"Request.{name} must be a 1-D int32 array, got {type(arr).__name__} " \
                f"{getattr(arr, 'dtype', '')}"
        assert len(self.prompt) > 0, f"request {self.request_id} has an empty prompt"

    @property
    def prompt_len(self) -> int:
        return int(len(self.prompt))

    @property
    def output_len(self) -> int:
        return int(len(self.output))

    def __repr__(self) -> str:
        return (f"Request(id={self.request_id}, conv={self.conversation_id!r}, turn={self.turn}, "
                f"t={self.arrival_s:.3f}s, prompt={self.prompt_len}, output={self.output_len})")


@dataclass(frozen=True)
class Conversation:
    """A conversation before scheduling: its token buffer and, per turn, where the prompt
    ends and where the output ends (``prompt = tokens[:p]``, ``output = tokens[p:o]``).

    ``decoded``: per turn, what the engine decodes when it is more than ``tokens[p:o]``: a
    reasoning model's ``<think> ... </think>`` followed by ``tokens[p:o]`` (the answer,
    which is all that later prompts keep). The output is then ``decoded[k]``, and turn k+1
    shares turn k's prompt but not the start of its output.
    """

    conversation_id: str
    tokens: np.ndarray
    turns: tuple[tuple[int, int], ...]
    decoded: tuple[np.ndarray, ...] | None = None

    def __post_init__(self) -> None:
        self.tokens.flags.writeable = False
        prev = 0
        for p, o in self.turns:
            assert 0 < p < o <= len(self.tokens) and p >= prev, \
                f"{self.conversation_id}: turn offsets {self.turns} out of order"
            prev = o
        if self.decoded is not None:
            assert len(self.decoded) == len(self.turns), f"{self.conversation_id}: one decoded output per turn"
            for (p, o), out in zip(self.turns, self.decoded):
                out.flags.writeable = False
                assert len(out) >= o - p and np.array_equal(out[len(out) - (o - p):], self.tokens[p:o]), \
                    f"{self.conversation_id}: a decoded output must end with the kept answer"

    def output(self, k: int) -> np.ndarray:
        """Turn ``k``'s output: what the engine decodes."""
        p, o = self.turns[k]
        return self.tokens[p:o] if self.decoded is None else self.decoded[k]


@dataclass(frozen=True)
class ArrivalSpec:
    """When conversations start and how far apart their turns are (see module doc)."""

    arrival_rate: float | None = 2.0
    think_time_s: float = 5.0
    max_active: int | None = None

    def __post_init__(self) -> None:
        check_number("arrival_rate", self.arrival_rate, optional=True,
                     reason="must be a positive number of conversations per second, or None for all at once")
        check_number("think_time_s", self.think_time_s, positive=False, minimum=0,
                     reason="must be a number of seconds >= 0")
        check_int("max_active", self.max_active, minimum=1, optional=True,
                  reason="must be an integer >= 1, or None for no limit")


def poisson_starts(n: int, rate: float | None, seed: int) -> np.ndarray:
    """``n`` start times of a Poisson process of ``rate`` per second, the first at 0 (all
    at 0 when ``rate`` is None); one stream per seed, whatever is being started."""
    if rate is None:
        return np.zeros(n)
    gaps = stream(seed, "arrivals", "starts").exponential(1.0 / rate, size=n)
    gaps[:1] = 0.0  # the first one opens the run
    return np.cumsum(gaps)


def bursty_starts(n: int, rate: float, on_s: float, off_s: float, seed: int) -> np.ndarray:
    """``n`` start times of an on/off (interrupted Poisson) process whose long-run rate is
    ``rate`` per second, the first at 0.

    The source alternates between ON periods (exponential, mean ``on_s``), in which starts
    come as a Poisson process of ``rate * (on_s + off_s) / on_s``, and silent OFF periods
    (exponential, mean ``off_s``). Over many periods the count matches a Poisson process of
    ``rate``, but it comes in bursts: the gaps' coefficient of variation exceeds 1 (a
    Poisson process has exactly 1), so a burst of new prefixes arrives while the previous
    burst's are still warm, then nothing for a while.
    """
    rng = stream(seed, "arrivals", "bursty")
    on_rate = rate * (on_s + off_s) / on_s
    out = np.empty(n)
    t, i = 0.0, 0
    while i < n:
        end = t + float(rng.exponential(on_s))
        first = i == 0
        while i < n:
            t_next = t if first else t + float(rng.exponential(1.0 / on_rate))
            first = False
            if t_next > end:
                break
            out[i], t, i = t_next, t_next, i + 1
        t = end + float(rng.exponential(off_s))
    return out


def schedule(conversations: Sequence[Conversation], arrivals: ArrivalSpec, seed: int, *,
             starts: Sequence[float] | None = None, think_s: Sequence[float] | None = None) -> list[Request]:
    """Arrival times for every turn, then one request per turn sorted by arrival.

    ``starts``: the conversations' start times, when the caller groups them (the agentic
    workload starts a task's rollouts together); ``arrivals.arrival_rate`` is then unused.
    ``think_s``: per conversation, the mean time between its turns (a blend of workloads
    whose users think at different paces); ``arrivals.think_time_s`` otherwise.
    Ties sort by conversation order then turn, so turn k always precedes turn k+1.
    """
    n = len(conversations)
    if starts is not None:
        assert len(starts) == n, f"{len(starts)} start times for {n} conversations"
        start_s = np.asarray(starts, dtype=np.float64)
    else:
        start_s = poisson_starts(n, arrivals.arrival_rate, seed)
    if think_s is not None:
        assert len(think_s) == n, f"{len(think_s)} think times for {n} conversations"
    closing: list[float] = []  # heap of the times active conversations close
    timed: list[tuple[float, int, int]] = []
    for ci, conv in enumerate(conversations):
        start = float(start_s[ci])
        if arrivals.max_active is not None and len(closing) >= arrivals.max_active:
            start = max(start, heapq.heappop(closing))
        # one stream per conversation: its think times do not depend on the others' turns
        think = np.zeros(len(conv.turns))
        mean_think = arrivals.think_time_s if think_s is None else float(think_s[ci])
        if mean_think > 0:
            think = stream(seed, "arrivals", "think", ci).exponential(mean_think, size=len(think))
        t = start
        for k in range(len(conv.turns)):
            timed.append((t, ci, k))
            t += float(think[k])
        if arrivals.max_active is not None:
            heapq.heappush(closing, t)
    timed.sort()
    out = []
    for rid, (t, ci, k) in enumerate(timed):
        conv = conversations[ci]
        out.append(Request(rid, conv.conversation_id, k, t, conv.tokens[:conv.turns[k][0]], conv.output(k)))
    return out


@dataclass(frozen=True)
class WorkloadStats:
    """What a list of requests looks like, including the best any cache could do.

    ``reusable_tokens``: prompt tokens an unbounded cache could serve, counted in whole
    pages of ``page_tokens`` and capped one token short of each prompt (an engine computes
    at least the last prompt token); a page is reusable when the same chain of pages was in
    an earlier request's prompt + output.
    """

    requests: int
    conversations: int
    max_turns: int
    prompt_tokens: int
    output_tokens: int
    mean_prompt_tokens: float
    max_prompt_tokens: int
    duration_s: float
    page_tokens: int
    reusable_tokens: int

    @property
    def reuse_ratio(self) -> float:
        return self.reusable_tokens / self.prompt_tokens if self.prompt_tokens else 0.0

    def as_dict(self) -> dict:
        d = dict(self.__dict__)
        d["reuse_ratio"] = self.reuse_ratio
        return d


def _page_chain(tokens: np.ndarray, page_tokens: int) -> list[bytes]:
    """Chained digests of the full pages of ``tokens``: digest i covers pages 0..i."""
    out, prev = [], b""
    data = np.ascontiguousarray(tokens).view(np.uint8)
    step = page_tokens * 4
    for i in range(len(tokens) // page_tokens):
        prev = hashlib.blake2b(prev + data[i * step:(i + 1) * step].tobytes(), digest_size=16).digest()
        out.append(prev)
    return out


def reusable_per_request(requests: Sequence[Request], *, page_tokens: int = 256) -> dict[int, int]:
    """Per request id: prompt tokens an unbounded page cache could serve (the ceiling).

    Whole pages of ``page_tokens``, capped one token short of the prompt (an engine
    computes at least the last prompt token); a page is reusable when the same chain of
    pages was in an earlier request's (by request id) prompt + output.
    """
    check_int("page_tokens", page_tokens, minimum=1, reason="must be a positive integer")
    seen: set[bytes] = set()
    out: dict[int, int] = {}
    for r in sorted(requests, key=lambda r: r.request_id):
        usable = (r.prompt_len - 1) // page_tokens
        chain = _page_chain(np.concatenate([r.prompt, r.output]), page_tokens)
        hit = 0
        while hit < usable and chain[hit] in seen:
            hit += 1
        out[r.request_id] = hit * page_tokens
        seen.update(chain)
    return out


def summarize(requests: Sequence[Request], *, page_tokens: int = 256) -> WorkloadStats:
    """Counts and the unbounded-cache reuse ceiling of ``requests`` (in request order)."""
    reusable = sum(reusable_per_request(requests, page_tokens=page_tokens).values())
    turns: dict[str, int] = {}
    for r in requests:
        turns[r.conversation_id] = max(turns.get(r.conversation_id, 0), r.turn + 1)
    n = len(requests)
    prompt_tokens = sum(r.prompt_len for r in requests)
    return WorkloadStats(
        requests=n,
        conversations=len(turns),
        max_turns=max(turns.values(), default=0),
        prompt_tokens=prompt_tokens,
        output_tokens=sum(r.output_len for r in requests),
        mean_prompt_tokens=prompt_tokens / n if n else 0.0,
        max_prompt_tokens=max((r.prompt_len for r in requests), default=0),
        duration_s=max((r.arrival_s for r in requests), default=0.0),
        page_tokens=page_tokens,
        reusable_tokens=reusable,
    )
