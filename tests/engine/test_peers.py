"""A queued request waits for a running request computing its prefix (``peer_hold``), and
resumes from what that request publishes: exact hits with and without state, and the
fork the shared prefix's end becomes on a hybrid layout."""

from __future__ import annotations

import numpy as np
import pytest

from hicache.engine import scheduler
from hicache.engine.loop import EngineConfig, ReferenceEngine
from hicache.engine.peers import common_pages
from hicache.engine.records import NullExecutor
from hicache.engine.workloads.request import Request
from tests.cache.conftest import P, make_cache, mha_layout


def test_common_pages_counts_equal_whole_pages_up_to_the_limit():
    a = np.arange(1, 21, dtype=np.int32)
    b = a.copy()
    b[9] = -1                                  # token 9 is in page 2
    assert common_pages(a, b, 4, 10) == 2
    assert common_pages(a, a, 4, 10) == 5
    assert common_pages(a, a, 4, 3) == 3       # the limit
    assert common_pages(a, a[:7], 4, 10) == 1  # a partial page does not count
    c = a.copy()
    c[0] = 0
    assert common_pages(a, c, 4, 10) == 0


def _pair(shared_pages: int, a_tail: list[int], b_tail: list[int]) -> list[Request]:
    """Two requests arriving together, sharing ``shared_pages`` pages nobody has computed."""
    shared = np.arange(1, shared_pages * P + 1, dtype=np.int32)
    out = np.arange(500, 506, dtype=np.int32)
    return [Request(0, "a", 0, 0.0, np.concatenate([shared, np.asarray(a_tail, np.int32)]), out),
            Request(1, "b", 0, 0.0, np.concatenate([shared, np.asarray(b_tail, np.int32)]), out)]


def _run(layout, reqs, hold: bool):
    cache = make_cache(layout, device_pages=40, host_pages=40, device_snaps=8, host_snaps=8)
    try:
        rep = ReferenceEngine(cache, EngineConfig(max_running=4, chunk_tokens=64, step_tokens=256,
                                                  peer_hold=hold)).run(reqs)
        cache.check_integrity()
    finally:
        cache.close()
    assert rep.mismatched_pages == 0
    return rep


@pytest.mark.parametrize("hybrid", [False, True], ids=["mha", "hybrid"])
def test_a_request_waits_for_the_peer_computing_its_prefix_and_resumes_there(hybrid):
    # b extends a's whole prompt: a's prompt end (6 pages + 2 tokens) is its deepest page
    # boundary, where a publishes with a snapshot on either layout
    reqs = _pair(6, [900, 901], [900, 901, 77, 78, 79, 80, 81])
    layout = None if hybrid else mha_layout()
    rep = _run(layout, reqs, hold=True)
    assert [r.hit_tokens for r in rep.records] == [0, 6 * P]
    assert rep.peer_holds == 1 and rep.records[1].queue_s > 0
    off = _run(layout, reqs, hold=False)
    assert [r.hit_tokens for r in off.records] == [0, 0] and off.peer_holds == 0


@pytest.mark.parametrize("hybrid", [False, True], ids=["mha", "hybrid"])
def test_the_shared_prefix_end_becomes_the_peers_fork(hybrid):
    # the prompts part inside a's prompt, at page 6: with state, a's chunk ends there and
    # leaves a snapshot (Boundary.BRANCH) that b resumes from; without, any page boundary does
    reqs = _pair(6, list(range(900, 913)), list(range(700, 713)))
    rep = _run(None if hybrid else mha_layout(), reqs, hold=True)
    assert [r.hit_tokens for r in rep.records] == [0, 6 * P]
    assert rep.peer_holds == 1


def test_no_wait_once_the_peer_has_published_the_shared_pages():
    # b arrives after a's prompt is computed: it resumes at once, no wait
    a, b = _pair(6, [900, 901], [900, 901, 77])
    b = Request(1, "b", 0, 0.5, b.prompt, b.output)
    rep = _run(mha_layout(), [a, b], hold=True)
    assert [r.hit_tokens for r in rep.records] == [0, 6 * P] and rep.peer_holds == 0


def test_nothing_waits_without_a_cache():
    # the baseline run (no cache: nothing to resume from) admits as before
    reqs = _pair(6, [900, 901], [900, 901, 77])
    sched = scheduler.Scheduler(NullExecutor(P, 64), EngineConfig(max_running=4))
    rep = sched.run(reqs)
    assert sched.peers is None and rep.peer_holds == 0
    assert all(r.queue_s == 0 for r in rep.records)
