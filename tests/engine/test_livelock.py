"""Greedy admission with best_effort prefetch must make progress (issue 11, item 2).

On main at 2a780e8 this configuration finished 1 of 86 requests in a minute: an open
prefetch device-locked its prefix while its request waited a step, every preempted request
was deferred again on retry, and running requests preempted each other without end.
"""

from __future__ import annotations

import json

from hicache.cli.main import main
from hicache.engine import scheduler

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
