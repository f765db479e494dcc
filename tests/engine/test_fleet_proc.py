"""Fleet engines as OS processes (``hicache fleet --processes``): the same decisions as the
in-process fleet, a store that cannot be shared refused, a dead engine named."""

from __future__ import annotations

import dataclasses
import os
import subprocess
import sys

import pytest

from hicache.engine import run_fleet
from hicache.engine.fleet_proc import ProcessEngine, run_fleet_processes
from hicache.errors import ConfigError, HiCacheError
from tests.cache.conftest import make_cache
from tests.engine.test_fleet import ADMIT, CFG
from tests.engine.test_loop import small_chat

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _cache(url):
    return make_cache(device_pages=60, host_pages=60, device_snaps=8, host_snaps=8, write_policy="write_back",
                      storage=url, admit=ADMIT, prefetch_policy="timeout")


def _per_request(run):
    return [[(r.request_id, r.device_hit_tokens, r.host_hit_tokens, r.l3_hit_tokens, r.recomputed_tokens)
             for r in rep.records] for rep in run.reports]


@pytest.mark.parametrize("routing", ["round-robin", "conversation"])
def test_engine_processes_decide_exactly_as_the_in_process_fleet(tmp_path, routing):
    reqs = small_chat(n=8)
    caches = [_cache(f"file://{tmp_path / 'local'}") for _ in range(2)]
    try:
        local = run_fleet(caches, CFG, reqs, routing)
        layout, cfg = caches[0].layout, caches[0].config
    finally:
        for c in caches:
            c.close()
    cfg = dataclasses.replace(cfg, storage=dataclasses.replace(cfg.storage, url=f"file://{tmp_path / 'procs'}"))
    seen = []
    procs = run_fleet_processes(layout, cfg, 2, CFG, reqs, routing, lambda done, total: seen.append(done))
    assert _per_request(procs) == _per_request(local)
    assert seen == list(range(1, len(reqs) + 1))
    if routing == "round-robin":   # a conversation's next turn on the other engine: found in the store
        assert sum(r.l3_hit_tokens for rep in procs.reports for r in rep.records) > 0
    assert all(rep.mismatched_pages == 0 and rep.verified_pages > 0 for rep in procs.reports)
    assert [st["l3_admit_chains"] for st in procs.stats] == [st["l3_admit_chains"] for st in local.stats]


def test_a_store_inside_one_process_is_refused():
    cache = _cache("memory://")
    layout, cfg = cache.layout, cache.config
    cache.close()
    with pytest.raises(ConfigError, match="memory://"):
        run_fleet_processes(layout, cfg, 2, CFG, small_chat(n=2), "round-robin")


def test_a_dead_engine_process_is_named(tmp_path):
    cache = _cache(f"file://{tmp_path}")
    layout, cfg = cache.layout, cache.config
    cache.close()
    eng = ProcessEngine(3, layout, cfg, CFG)
    try:
        eng.begin(small_chat(n=2))
        eng.proc.kill()
        eng.proc.join(10)
        with pytest.raises(HiCacheError, match=r"fleet engine #3 \(pid \d+\) exited"):
            eng.advance()
    finally:
        eng.stop()


def test_cli_processes_with_a_memory_store_is_one_line():
    r = subprocess.run([sys.executable, "-m", "hicache.cli.main", "fleet", "--engines", "2", "--processes",
                        "--conversations", "2", "--storage", "memory://", "--quiet"],
                       capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert r.returncode == 2 and r.stdout == ""
    assert len(r.stderr.strip().splitlines()) == 1 and "--storage" in r.stderr and "memory://" in r.stderr


def test_a_hung_engine_is_waited_for_once_and_not_asked_again(tmp_path, monkeypatch):
    # An engine that stops answering (SIGSTOP stands in for a hang) fails the run after one
    # reply timeout; the error path does not wait on it a second time to drain it.
    import signal
    import time

    from hicache.engine import fleet_proc
    from hicache.engine.fleet import drive

    cache = _cache(f"file://{tmp_path}")
    layout, cfg = cache.layout, cache.config
    cache.close()
    engines = [ProcessEngine(i, layout, cfg, CFG) for i in range(2)]
    monkeypatch.setattr(fleet_proc, "REPLY_TIMEOUT_S", 3.0)
    os.kill(engines[1].proc.pid, signal.SIGSTOP)
    try:
        t0 = time.monotonic()
        with pytest.raises(HiCacheError, match=r"fleet engine #1 .* did not answer in 3 s"):
            drive(engines, small_chat(n=4), "round-robin")
        assert time.monotonic() - t0 < 2 * 3.0       # one timeout, not a second one in the drain
        assert engines[1].broken and not engines[0].broken
        with pytest.raises(HiCacheError, match="not asked again"):
            engines[1].advance()
    finally:
        os.kill(engines[1].proc.pid, signal.SIGCONT)
        for e in engines:
            e.stop()
