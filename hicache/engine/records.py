"""What the reference engine is configured with, what it records per request, and the
interface between its scheduler and a cache (:class:`Executor`)."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Literal, Protocol, Sequence

import numpy as np

from hicache.cache import Boundary
from hicache.engine.clock import ClockConfig
from hicache.engine.contents import VERIFY_MODES, VerifyMode
from hicache.errors import ConfigError
from hicache.units import check_int

ADMISSION_POLICIES = ("reserve", "greedy")
CopyLanding = Literal["step", "wallclock"]
COPY_LANDINGS = ("step", "wallclock")
INF = math.inf


@dataclass(frozen=True)
class EngineConfig:
    """Scheduling knobs of the reference engine.

    ``admission``: ``reserve`` (default) admits a request only while the device pages that
    running requests will hold at their finish (prompt + output each, counted whole) plus
    its own fit the device pool, and (split device pools) while a state row is left for
    it (:func:`hicache.engine.loop.request_slots`), first come first served; cached
    prefixes fill the rest and are evicted as requests grow, so no request is preempted
    for room and none finds its resume snapshot unloadable. ``greedy`` admits up
    to ``max_running`` and preempts the youngest requests when pages run out (what an
    engine without a memory-aware scheduler does; on a small device pool it thrashes).

    ``decode_stride``: at most this many output tokens per request per step (the clock
    charges one ``decode_step_s`` per token; strides are cut at events, see the module
    doc). ``verify``: how much of each page is written and checked
    (:data:`hicache.engine.contents.VerifyMode`). ``prefetch_ahead``: queued requests
    that get an L3 prefetch before admission (default ``max_running``); with
    ``expect_queued`` (default) the same head of the queue has its cached prefix kept warm
    at every step (:meth:`HiCache.expect`), so what waits is not evicted before it is
    admitted; every ``warm_queue_every`` steps (0: never) the rest of the queue is kept
    warm too, front first, as far as the prompts of the requests up to it add up to no
    more pages than the cache holds (device and host, ``Executor.cache_pages``): a request
    further back waits behind more than the cache can hold, so its chain is evicted by the
    queue ahead of it whatever is touched, and touching it would only push out the chains
    that come back sooner; a round that would walk more than ``WARM_WORK`` times the
    tokens the engine can compute between rounds spaces the next out by the ratio (a bounded
    cost; docs/policy.md, "The waiting queue's head kept warm").
    ``prompt_grain`` (tokens; 0: a page): the grain on which prompts share prefixes; when
    it is coarser than a page, a prompt's last chunk first ends at its last boundary on
    that grain, so a snapshot sits where a later prompt can share up to
    (:func:`hicache.tree.retention.grain_end`); the CLI sets it to a block-hash trace's
    ``block_size`` for layouts with state.
    ``peer_hold`` (default): a queued request whose prefix a running request is still
    computing waits for that request's chunk instead of computing the pages a second time
    (:mod:`hicache.engine.peers`). ``clock``: the cost model of the virtual clock.

    ``copy_landing``: when the device <-> host copies a step launched are applied to the
    cache. ``step`` (default): every one lands by the end of its step (the engine waits
    for the copy threads before polling), so which backups have landed when the next step
    evicts does not depend on thread timing and a replay is reproducible run to run; their
    time is the clock's either way. ``wallclock``: a copy is applied at the first poll after
    its worker thread finished it, as a live engine sees it (results then vary slightly from
    run to run). Queued L3 puts also land by a step's end under ``step``; L3 fetches are not
    affected (their landing is on the clock).
    """

    max_running: int = 16
    step_tokens: int = 16384
    chunk_tokens: int = 4096
    decode_stride: int = 64
    verify: VerifyMode = "sample"
    admission: str = "reserve"
    prefetch_ahead: int | None = None
    expect_queued: bool = True
    warm_queue_every: int = 8
    peer_hold: bool = True
    prompt_grain: int = 0
    copy_landing: CopyLanding = "step"
    clock: ClockConfig = field(default_factory=ClockConfig)

    def __post_init__(self) -> None:
        for name in ("max_running", "step_tokens", "chunk_tokens", "decode_stride"):
            check_int(name, getattr(self, name), minimum=1)
        if self.admission not in ADMISSION_POLICIES:
            raise ConfigError("admission", self.admission, f"must be one of {list(ADMISSION_POLICIES)}")
        if self.verify not in VERIFY_MODES:
            raise ConfigError("verify", self.verify, f"must be one of {list(VERIFY_MODES)}")
        check_int("prefetch_ahead", self.prefetch_ahead, minimum=0, optional=True)
        check_int("warm_queue_every", self.warm_queue_every, minimum=0)
        check_int("prompt_grain", self.prompt_grain, minimum=0)
        if self.copy_landing not in COPY_LANDINGS:
            raise ConfigError("copy_landing", self.copy_landing, f"must be one of {list(COPY_LANDINGS)}")

    @property
    def lookahead(self) -> int:
        return self.max_running if self.prefetch_ahead is None else self.prefetch_ahead


class EngineRequest(Protocol):
    """What the engines read of a request: :class:`hicache.engine.workloads.Request` is
    one, and so is any object with these attributes (tests build their own)."""

    @property
    def request_id(self) -> int: ...
    @property
    def conversation_id(self) -> object: ...   # its str() names the conversation
    @property
    def turn(self) -> int: ...
    @property
    def arrival_s(self) -> float: ...
    @property
    def prompt(self) -> np.ndarray | Sequence[int]: ...
    @property
    def output(self) -> np.ndarray | Sequence[int]: ...


@dataclass
class RequestRecord:
    """What happened to one request (one line of ``--requests-out``). Times are virtual
    seconds; ``ready_s`` is the arrival, or the previous turn's finish when that was later."""

    request_id: int
    conversation_id: str
    turn: int
    prompt_tokens: int
    trace_line: int | None = None
    hit_tokens: int = 0
    device_hit_tokens: int = 0
    host_hit_tokens: int = 0
    l3_hit_tokens: int = 0
    recomputed_tokens: int = 0
    preemptions: int = 0
    readmission_recomputed_tokens: int = 0  # prompt tokens recomputed after a preemption
    verified_pages: int = 0
    mismatched_pages: int = 0
    l3_planned_pages: int = 0   # pages the L3 prefetch planned to fetch
    l3_landed_pages: int = 0    # of those, landed by admission on the virtual clock
    finish_step: int = 0
    ready_s: float = 0.0
    queue_s: float | None = None       # ready -> first admission
    ttft_s: float | None = None        # ready -> end of the step that finished the prompt
    ttft_uncached_s: float | None = None  # the same without any cache
    finish_s: float | None = None
    rejected: bool = False   # needs more device pages than the device has: never run
    finished: bool = False   # ran to its last output token


@dataclass
class EngineReport:
    records: list[RequestRecord] = field(default_factory=list)
    steps: int = 0
    preemptions: int = 0
    rejected: int = 0
    peer_holds: int = 0     # (request, step) pairs a queued request waited for a running peer
    verified_pages: int = 0
    mismatched_pages: int = 0
    virtual_s: float = 0.0
    wall_s: float = 0.0


@dataclass(eq=False)
class Job:
    """A running request: the scheduler's view, plus the executor's ``handle`` (whatever
    the executor keeps per running request; each executor checks it gets its own kind)."""

    req: EngineRequest
    record: RequestRecord
    prompt_len: int
    total_len: int          # prompt + output
    done: int = 0           # tokens computed (or resumed)
    branch: int = 0         # a prefill chunk ends here, with a snapshot (MatchResult.branch_tokens)
    verified: bool = False
    handle: object = None


class Executor(Protocol):
    """What the scheduler asks of a cache (see CacheExecutor and NullExecutor)."""

    page_tokens: int
    device_pages: int
    request_overhead_pages: int   # device pages' worth of other bytes a running request pins
    request_slots: int | None     # running requests the device's state rows serve (None: no limit)
    cache_pages: int              # pages the cache holds, device and host (0: no cache)
    blocking_d2h: bool
    resume_points: str | None     # "pages" (no state), "snapshots" (hybrid), None: no cache to resume from

    def prefetch(self, req: EngineRequest, start_s: float) -> float: ...
    def forget(self, req: EngineRequest) -> None: ...
    def expect(self, req: EngineRequest) -> None: ...
    def drop_prefetches(self) -> list[int]: ...
    def admit(self, job: Job, now: float, first: bool) -> int: ...
    def verify(self, job: Job) -> bool: ...
    def compute(self, job: Job, upto: int) -> bool: ...
    def publish(self, job: Job, why: Boundary) -> None: ...
    def release(self, job: Job) -> None: ...
    def step(self) -> None: ...
    def poll(self, now: float) -> None: ...
    def drain(self) -> None: ...
    def moved(self) -> tuple[int, int]: ...
    def close(self) -> None: ...


class NullExecutor:
    """No cache at all: every prompt token is computed, device pages hold only running
    requests. Its run on the same requests is the 'without the cache' baseline."""

    blocking_d2h = False
    resume_points: str | None = None
    cache_pages = 0

    def __init__(self, page_tokens: int, device_pages: int, request_overhead_pages: int = 0,
                 request_slots: int | None = None):
        self.page_tokens = page_tokens
        self.device_pages = device_pages
        self.request_overhead_pages = request_overhead_pages
        self.request_slots = request_slots
        self.used = 0

    def prefetch(self, req: EngineRequest, start_s: float) -> float:
        return -INF

    def forget(self, req: EngineRequest) -> None:
        pass

    def expect(self, req: EngineRequest) -> None:
        pass

    def drop_prefetches(self) -> list[int]:
        return []

    def admit(self, job: Job, now: float, first: bool) -> int:
        job.handle = self.request_overhead_pages  # pages held (its snapshots' share first)
        self.used += job.handle
        if first:
            job.record.recomputed_tokens = job.prompt_len
        else:
            job.record.readmission_recomputed_tokens += job.prompt_len
        return 0

    def verify(self, job: Job) -> bool:
        return True

    def compute(self, job: Job, upto: int) -> bool:
        held = job.handle  # pages held, set by admit
        assert isinstance(held, int)
        need = -(-upto // self.page_tokens) + self.request_overhead_pages - held
        if need > 0 and self.used + need > self.device_pages:
            return False
        if need > 0:
            self.used += need
            job.handle = held + need
        return True

    def publish(self, job: Job, why: Boundary) -> None:
        pass

    def release(self, job: Job) -> None:
        held = job.handle
        assert isinstance(held, int)
        self.used -= held
        job.handle = 0

    def step(self) -> None:
        pass

    def poll(self, now: float) -> None:
        pass

    def drain(self) -> None:
        pass

    def moved(self) -> tuple[int, int]:
        return 0, 0

    def close(self) -> None:
        pass
