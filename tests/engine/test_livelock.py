"""Greedy admission with best_effort prefetch must make progress (issue 11, item 2).

On main at 2a780e8 this configuration finished 1 of 86 requests in a minute: an open
prefetch device-locked its prefix while its request waited a step, every preempted request
was deferred again on retry, and running requests preempted each other without end.
"""

from __future__ import annotations

import json

import numpy as np

from hicache.cli.main import main
from hicache.engine import EngineConfig, scheduler
from hicache.engine import records as scheduler_records
from hicache.engine.workloads.request import Request

STEP_LIMIT = 5000  # ~580 steps (the no-cache baseline pass and the cached one); a livelock spins forever


def test_greedy_admission_with_best_effort_prefetch_serves_every_request(monkeypatch, capsys):
    steps = {"n": 0}
    real = scheduler.Scheduler._step

    def counted(self):
        steps["n"] += 1
        assert steps["n"] < STEP_LIMIT, f"no end after {STEP_LIMIT} steps: livelock"
        return real(self)

    monkeypatch.setattr(scheduler.Scheduler, "_step", counted)
    rc = main(["replay", "--config", "tiny-hybrid", "--workload", "synthetic", "--conversations", "20", "--device-pages", "200",
               "--host-pages", "300", "--prefetch-policy", "best_effort", "--admission", "greedy",
               "--max-running", "16", "--json", "--quiet"])
    out = json.loads(capsys.readouterr().out)
    assert rc == 0 and out["mismatched_pages"] == 0
    assert out["requests"] == 86
    # every request ran to its finish, except those larger than the whole device (rejected,
    # as with reserve admission: 200 pages of 16 tokens)
    assert out["finished_requests"] + out["rejected_requests"] == 86


class _RoomAfterDrain(scheduler_records.NullExecutor):
    """Pages a release frees can be reused only after the next drain (a copy in flight
    pins them, as an L3 put of a freshly demoted node does)."""

    def __init__(self, *a):
        super().__init__(*a)
        self.pinned = 0

    def release(self, job):
        held = job.handle
        super().release(job)
        self.pinned += held

    def drain(self):
        self.pinned = 0

    def compute(self, job, upto):
        self.used += self.pinned
        try:
            return super().compute(job, upto)
        finally:
            self.used -= self.pinned


def test_a_request_that_preempted_others_waits_for_the_copies_its_evictions_started(monkeypatch):
    # Two requests of 6 pages on an 8-page device, greedy admission: the older one runs
    # out, preempts the younger, and the room only comes free once copies land. It must
    # drain and go on; giving up there preempted it too and the pair cycled.
    ex = _RoomAfterDrain(16, 8)
    reqs = [Request(i, f"c{i}", 0, 0.0, np.arange(80, dtype=np.int32) + 100 * i, np.arange(16, dtype=np.int32))
            for i in range(2)]
    steps = {"n": 0}
    real = scheduler.Scheduler._step

    def counted(self):
        steps["n"] += 1
        assert steps["n"] < 100, "no end after 100 steps: livelock"
        return real(self)

    monkeypatch.setattr(scheduler.Scheduler, "_step", counted)
    rep = scheduler.Scheduler(ex, EngineConfig(admission="greedy", max_running=2, chunk_tokens=32)).run(reqs)
    assert [r.finished for r in rep.records] == [True, True]
    assert [r.preemptions for r in rep.records] == [0, 1]
