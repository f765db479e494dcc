"""The scheduler ends a prefill chunk at the fork the cache names (``Job.branch``) and
publishes there with ``Boundary.BRANCH``; the next chunk goes on from the fork."""

from __future__ import annotations

import numpy as np

from hicache.engine import EngineConfig, scheduler
from hicache.engine.records import NullExecutor
from hicache.engine.workloads.request import Request
from hicache.tree import Boundary


class _Forking(NullExecutor):
    """Names a fork at token 48 for every request; records each publish."""

    def __init__(self, *a):
        super().__init__(*a)
        self.published: list[tuple[int, int, Boundary]] = []

    def admit(self, job, now, first):
        hit = super().admit(job, now, first)
        job.branch = 48
        return hit

    def publish(self, job, why):
        self.published.append((job.req.request_id, job.done, why))


def test_a_prefill_chunk_ends_at_the_fork_with_a_branch_boundary():
    req = Request(0, "c0", 0, 0.0, np.arange(200, dtype=np.int32), np.arange(8, dtype=np.int32))
    ex = _Forking(16, 64)
    scheduler.Scheduler(ex, EngineConfig(chunk_tokens=128)).run([req])
    assert ex.published == [(0, 48, Boundary.BRANCH), (0, 176, Boundary.PREFILL),
                            (0, 200, Boundary.PROMPT_END), (0, 208, Boundary.FINISH)]


def test_with_a_prompt_grain_the_last_chunk_ends_first_on_the_grain():
    # prompt 200 tokens, pages of 16: its last page boundary is 192; on a grain of 128 the
    # last chunk (one chunk of 256 holds it all) ends at 128 first, with a GRAIN snapshot
    req = Request(0, "c0", 0, 0.0, np.arange(200, dtype=np.int32), np.arange(8, dtype=np.int32))
    ex = _Forking(16, 64)
    scheduler.Scheduler(ex, EngineConfig(chunk_tokens=256, prompt_grain=128)).run([req])
    assert ex.published == [(0, 48, Boundary.BRANCH), (0, 128, Boundary.GRAIN),
                            (0, 200, Boundary.PROMPT_END), (0, 208, Boundary.FINISH)]
    # no grain (0, the default): the fork, then the prompt's end
    ex = _Forking(16, 64)
    scheduler.Scheduler(ex, EngineConfig(chunk_tokens=256)).run([req])
    assert ex.published == [(0, 48, Boundary.BRANCH), (0, 200, Boundary.PROMPT_END), (0, 208, Boundary.FINISH)]
