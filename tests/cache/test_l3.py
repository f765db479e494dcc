"""The L3 tier through the facade: prefetch after host eviction, reuse across processes,
a dead server, and the state-or-nothing rule."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path


from tests.cache.conftest import Engine, make_cache, mha_layout, toks

ROOT = Path(__file__).resolve().parents[2]


def evict_everything(eng, start=50, n=12):
    """Push earlier requests out of the device and host tiers with fresh traffic."""
    for v in range(start, start + n):
        eng.run(toks(v, v + 100, extra=1))
    eng.cache.drain()


def test_prefetch_after_host_eviction_brings_pages_and_snapshot_back():
    eng = Engine(make_cache(device_pages=4, host_pages=10, device_snaps=2, host_snaps=4))
    a = toks(1, 2, 3, extra=1)
    eng.run(a)
    eng.cache.drain()
    assert eng.cache.counters.l3_put_objects >= 3 + 1          # 3 pages + the snapshot
    evict_everything(eng)
    m = eng.cache.match(a)
    assert m.resume_tokens == 0 and len(m.l3_hashes) == 3
    pf = eng.cache.prefetch(m)
    assert eng.cache.finish_prefetch(pf) == 12
    m = eng.cache.match(a)
    assert (m.resume_tokens, m.device_tokens, m.host_tokens, m.snapshot_tier) == (12, 0, 12, "host")
    _, lease = eng.start(a)                                      # loads and verifies bytes
    assert lease.resume_tokens == 12 and lease.l3_tokens == 12
    eng.cache.release(lease)
    eng.cache.drain()
    assert eng.cache.counters.l3_hit_tokens == 12
    eng.cache.check_integrity()
    eng.cache.close()


def test_prefetch_of_a_partial_chain_for_stateless_layouts():
    eng = Engine(make_cache(mha_layout(), device_pages=4, host_pages=10))
    a = toks(1, 2, 3, extra=1)
    eng.run(a)
    eng.cache.drain()
    evict_everything(eng)
    m = eng.cache.match(toks(1, 2, 9, extra=1))                  # shares 2 pages with a
    assert eng.cache.finish_prefetch(eng.cache.prefetch(m)) == 8
    assert eng.cache.match(toks(1, 2, 9, extra=1)).resume_tokens == 8
    eng.cache.check_integrity()
    eng.cache.close()


def test_pages_without_their_snapshot_are_not_used():
    eng = Engine(make_cache(device_pages=4, host_pages=10, device_snaps=2, host_snaps=4))
    a = toks(1, 2, 3, extra=1)
    eng.run(a, chunk_pages=3)
    eng.cache.drain()
    # Remove the snapshot object from L3: the pages alone cannot resume a hybrid model.
    node = eng.cache._tree.walk(a, 3).segments[-1][0]
    assert eng.cache._l3.store.delete([node.hashes[-1]], "state") == 1
    evict_everything(eng)
    m = eng.cache.match(a)
    assert eng.cache.finish_prefetch(eng.cache.prefetch(m)) == 0
    assert eng.cache.match(a).resume_tokens == 0
    eng.cache.check_integrity()
    eng.cache.close()


def test_landed_pages_inserts_only_what_a_callers_clock_says_arrived():
    # stateless: a leading run of the fetched pages is usable
    eng = Engine(make_cache(mha_layout(), device_pages=4, host_pages=10, prefetch_policy="best_effort"))
    a = toks(1, 2, 3, extra=1)
    eng.run(a)
    eng.cache.drain()
    evict_everything(eng)
    assert eng.cache.finish_prefetch(eng.cache.prefetch(eng.cache.match(a)), landed_pages=2) == 8
    assert eng.cache.match(a).resume_tokens == 8
    _, lease = eng.start(a)                                      # loads and verifies bytes
    assert lease.l3_tokens == 8
    eng.cache.release(lease)
    eng.cache.drain()
    eng.cache.check_integrity()
    eng.cache.close()
    # with state: the snapshot closes the plan, so anything short of it is nothing
    for landed, expect in ((2, 0), (0, 0), (3, 12)):
        eng = Engine(make_cache(device_pages=4, host_pages=10, device_snaps=2, host_snaps=4,
                                prefetch_policy="best_effort"))
        eng.run(a)
        eng.cache.drain()
        evict_everything(eng)
        assert eng.cache.finish_prefetch(eng.cache.prefetch(eng.cache.match(a)), landed_pages=landed) == expect
        assert eng.cache.match(a).resume_tokens == expect
        eng.cache.drain()
        eng.cache.check_integrity()
        eng.cache.close()


def test_two_processes_share_pages_through_l3(tmp_path):
    url = f"file://{tmp_path}/l3"
    writer = textwrap.dedent(f"""
        from tests.cache.conftest import Engine, make_cache, toks
        eng = Engine(make_cache(storage={url!r}))
        eng.run(toks(1, 2, 3, extra=1))
        eng.cache.drain()
        eng.cache.close()
    """)
    subprocess.run([sys.executable, "-c", writer], cwd=ROOT, check=True, env={"PYTHONHASHSEED": "11", "PATH": ""})
    eng = Engine(make_cache(storage=url))
    a = toks(1, 2, 3, extra=1)
    m = eng.cache.match(a)
    assert m.resume_tokens == 0
    assert eng.cache.finish_prefetch(eng.cache.prefetch(m)) == 12
    _, lease = eng.start(a)                                      # verifies the other process's bytes
    assert lease.resume_tokens == 12 and lease.l3_tokens == 12
    eng.cache.release(lease)
    eng.cache.check_integrity()
    eng.cache.close()


def test_a_dead_l3_server_costs_misses_not_errors():
    # Port 1 on loopback refuses connections at once.
    eng = Engine(make_cache(device_pages=4, host_pages=6, storage="redis://127.0.0.1:1/0"))
    for v in (1, 2, 3, 1, 2):
        m = eng.cache.match(toks(v, v, extra=1))
        eng.cache.finish_prefetch(eng.cache.prefetch(m))
        eng.run(toks(v, v, extra=1))
    eng.cache.drain()
    s = eng.cache.stats()
    assert s["l3_errors"] > 0 and s["l3_hit_tokens"] == 0
    assert eng.cache.match(toks(2, 2, extra=1)).resume_tokens == 8   # L1/L2 still serve
    eng.cache.check_integrity()
    eng.cache.close()


def test_no_l3_tier():
    eng = Engine(make_cache(storage="none://"))
    eng.run(toks(1, extra=1))
    assert eng.cache.prefetch(eng.cache.match(toks(5, 5))) is None
    assert eng.cache.stats()["l3_errors"] == 0
    eng.cache.close()
