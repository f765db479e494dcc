"""The vLLM tier's transfer machinery, which needs no vLLM: jobs on worker threads between
a primary-tier view and per-group L3 stores (runs in the main test environment)."""

from __future__ import annotations

import hashlib
import subprocess
import sys
import threading

import numpy as np
import pytest

from hicache.integrations.vllm.transfers import GroupStores, TransferJob, TransferRunner
from hicache.storage import open_backend

ROW = 512


def _blocks(n: int, group: int = 0) -> list[tuple[bytes, int]]:
    return [(hashlib.sha256(f"b{i}".encode()).digest(), group) for i in range(n)]


def _setup(url: str = "memory://", rows: int = 8, threads: int = 2):
    primary = np.zeros((rows, ROW), np.int8)   # the shape and format vLLM's primary view has
    stores = GroupStores(open_backend(url), lambda g: f"fp{g}", "salt")
    runner = TransferRunner(stores, memoryview(primary), threads=threads)
    return primary, stores, runner


def _job(job_id, kind, blocks, slots) -> TransferJob:
    return TransferJob(job_id, kind, tuple(h + g.to_bytes(4, "big") for h, g in blocks), tuple(blocks),
                       tuple(slots))


def test_store_then_load_moves_rows_byte_for_byte_per_group():
    primary, stores, runner = _setup()
    blocks = _blocks(3, 0) + _blocks(2, 1)       # two groups share block hashes
    rng = np.random.default_rng(0)
    primary[:5] = rng.integers(-128, 128, (5, ROW), dtype=np.int8)
    want = primary[:5].copy()
    runner.submit(_job(1, "store", blocks, range(5)))
    assert runner.drain(10)
    (done,) = runner.poll()
    assert (done.job_id, done.kind, done.ok, done.nbytes, done.skipped) == (1, "store", True, 5 * ROW, 0)
    assert stores(0).namespace != stores(1).namespace and stores(0).breaker is stores(1).breaker
    primary[:] = 0
    runner.submit(_job(2, "load", blocks[::-1], [7, 6, 5, 4, 3]))
    assert runner.drain(10)
    (done,) = runner.poll()
    assert done.ok and done.loaded is None and done.nbytes == 5 * ROW
    assert np.array_equal(primary[[7, 6, 5, 4, 3]], want[::-1])
    runner.submit(_job(3, "store", blocks[:2], [3, 4]))   # already there: skipped, still ok
    runner.drain(10)
    assert [(d.ok, d.skipped, d.nbytes) for d in runner.poll()] == [(True, 2, 0)]
    runner.close()
    stores.close()


def test_a_load_that_fails_part_way_reports_the_keys_that_loaded():
    primary, stores, runner = _setup()
    blocks = _blocks(4)
    primary[:4] = 1
    runner.submit(_job(1, "store", blocks, range(4)))
    runner.drain(10)
    stores(0).delete([blocks[2][0]])           # evicted from L3 between lookup and load
    runner.poll()
    runner.submit(_job(2, "load", blocks, [4, 5, 6, 7]))
    runner.drain(10)
    (done,) = runner.poll()
    keys = _job(0, "load", blocks, range(4)).keys
    assert not done.ok and done.loaded == keys[:2] and done.nbytes == 2 * ROW
    runner.submit(_job(3, "load", _blocks(1, group=5), [0]))   # nothing there at all
    runner.drain(10)
    assert [(d.ok, d.loaded) for d in runner.poll()] == [(False, None)]
    runner.close()
    stores.close()


def test_jobs_never_block_the_caller_and_drain_waits_for_them():
    primary, stores, runner = _setup(threads=1)
    gate = threading.Event()
    real_put = stores.backend.put
    stores.backend.put = lambda k, v: (gate.wait(10), real_put(k, v))[1]
    runner.submit(_job(1, "store", _blocks(2), [0, 1]))      # returns at once
    assert runner.in_flight == 1 and runner.poll() == []
    assert not runner.drain(0.05)
    gate.set()
    assert runner.drain(10) and runner.in_flight == 0
    assert [d.ok for d in runner.poll()] == [True]
    runner.close()
    stores.close()


@pytest.mark.redis
def test_a_dead_store_is_a_failed_job_not_an_exception():
    from tests.redis_server import free_port

    primary, stores, runner = _setup(f"redis://127.0.0.1:{free_port()}/0?connect_timeout=0.2&timeout=0.2")
    runner.submit(_job(1, "store", _blocks(2), [0, 1]))
    runner.submit(_job(2, "load", _blocks(2), [2, 3]))
    runner.drain(20)
    assert sorted((d.job_id, d.ok) for d in runner.poll()) == [(1, False), (2, False)]
    assert stores(0).stats(backend=False).faults.get("connection", 0) >= 1
    runner.close()
    stores.close()


def test_hicache_imports_without_vllm():
    """``import hicache.integrations.vllm`` (and the transfers) must not need vLLM; only the
    tier module itself does, and says so."""
    code = ("import sys, importlib.abc\n"
            "class NoVllm(importlib.abc.MetaPathFinder):\n"
            "    def find_spec(self, name, path, target=None):\n"
            "        if name.split('.')[0] == 'vllm': raise ImportError('no vllm here')\n"
            "sys.meta_path.insert(0, NoVllm())\n"
            "import hicache, hicache.integrations.vllm as v, hicache.integrations.vllm.transfers\n"
            "print(v.tier_config('memory://')['module_path'])\n"
            "try:\n    import hicache.integrations.vllm.tier\nexcept ImportError as e:\n    print('tier:', e)\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    assert lines[0] == "hicache.integrations.vllm.tier"
    assert lines[1].startswith("tier: hicache.integrations.vllm.tier needs vLLM") and "no vllm here" in lines[1]
