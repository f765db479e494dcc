"""The queue kept warm (EngineConfig.warm_queue_every): every few steps the queued requests
past the head have their cached prefixes touched too, front first, as far as their prompts
fit in the cache; the head alone at the other steps."""

import numpy as np
import pytest

from hicache.engine.records import EngineConfig, NullExecutor
from hicache.engine.scheduler import WARM_WORK, Scheduler
from hicache.engine.workloads.request import Request
from hicache.errors import ConfigError

P = 4   # tokens per page


class Recording(NullExecutor):
    """No cache; records (step, request id) of every expect and what was admitted."""

    def __init__(self, cache_pages: int):
        super().__init__(P, 1000, 0)
        self.cache_pages = cache_pages
        self.sched: Scheduler | None = None
        self.calls: list[tuple[int, int]] = []
        self.admitted: list[int] = []

    def expect(self, req):
        assert req.request_id not in self.admitted, "a running request was expected"
        assert self.sched is not None
        self.calls.append((self.sched.report.steps, req.request_id))

    def admit(self, job, now, first):
        self.admitted.append(job.req.request_id)
        return super().admit(job, now, first)


def run(cache_pages: int, every: int, prompt_pages=(2, 2, 2, 2, 2),
        step_tokens: int = 16384) -> dict[int, list[int]]:
    """Per step, the ids expected at its start, in call order."""
    out = np.arange(3, dtype=np.int32) + 900
    reqs = [Request(i, f"c{i}", 0, 0.0, np.arange(n * P, dtype=np.int32) + 100 * i, out)
            for i, n in enumerate(prompt_pages)]
    ex = Recording(cache_pages)
    sched = Scheduler(ex, EngineConfig(max_running=1, prefetch_ahead=1, warm_queue_every=every,
                                                step_tokens=step_tokens))
    ex.sched = sched
    sched.run(reqs)
    assert ex.admitted == list(range(len(reqs)))
    steps: dict[int, list[int]] = {}
    for step, rid in ex.calls:
        steps.setdefault(step, []).append(rid)
    return steps


def test_every_few_steps_the_queue_is_warm_as_far_as_its_prompts_fit_in_the_cache():
    # 5 pages of cache, 2-page prompts: the first two queued requests fit, the third does not
    steps = run(cache_pages=5, every=2)
    assert steps[0] == [1, 0]        # step 0: [0, 1, ...] queued, the two that fit, back to front
    for step, ids in steps.items():
        if step % 2:
            assert len(ids) == 1     # the head alone (prefetch_ahead=1)
        else:
            assert len(ids) == 2 or ids == [4]   # two while two wait, then the last alone
            assert ids == sorted(ids, reverse=True)   # the next to be admitted touched last
    assert any(len(ids) == 2 for s, ids in steps.items() if s > 0)


def test_without_the_period_or_the_room_only_the_head_is_warm():
    for steps in (run(cache_pages=5, every=0), run(cache_pages=0, every=2),
                  run(cache_pages=5, every=2, prompt_pages=(8, 8, 8, 8, 8))):
        assert steps and all(len(ids) == 1 for ids in steps.values())


def test_a_larger_cache_warms_further_back():
    assert run(cache_pages=9, every=2)[0] == [3, 2, 1, 0]   # 8 pages of prompts fit in 9
    assert run(cache_pages=100, every=2)[0] == [4, 3, 2, 1, 0]


def test_a_round_longer_than_the_engine_computes_between_rounds_spaces_the_rounds_out():
    # one page a step, a round every 2 steps: a round may walk WARM_WORK * 2 steps * 4 tokens
    # = 32 tokens (8 pages); five 4-page prompts (80 tokens) fill three rounds' worth
    assert WARM_WORK == 4
    steps = run(cache_pages=100, every=2, prompt_pages=(4, 4, 4, 4, 4), step_tokens=P)
    full = {s: ids for s, ids in steps.items() if len(ids) > 1}
    assert full == {0: [4, 3, 2, 1, 0],   # 80 tokens: 3 rounds' worth, the next at step 0 + 2 * 2
                    4: [4, 3, 2, 1],      # 64: 2 rounds' worth, the next at 6
                    6: [4, 3, 2], 8: [4, 3, 2], 10: [4, 3, 2],   # 48: 2 each
                    12: [4, 3], 14: [4, 3]}   # 32 tokens: one round's worth, every 2 steps again
    # with room for the whole queue in one round, every 2 steps as before
    assert [s for s, ids in run(100, 2, (4, 4, 4, 4, 4), step_tokens=64).items() if len(ids) > 1] == [0, 2, 4, 6]


def test_a_negative_period_is_refused_naming_the_field():
    with pytest.raises(ConfigError, match="warm_queue_every"):
        EngineConfig(warm_queue_every=-1)
