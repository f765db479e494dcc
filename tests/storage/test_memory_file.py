"""The embedded backends' budgets: LRU eviction, refusals, atomic files, restart scans."""

from __future__ import annotations

import os

import numpy as np

from hicache.storage import open_backend
from hicache.storage.file import FileBackend


def test_memory_lru_budget_exact():
    m = open_backend("memory://?capacity=1000")
    assert m.put(["a", "b", "c"], [bytes(300)] * 3) == [True] * 3
    assert m.get_into(["a"], [bytearray(300)]) == [300]        # a is now the most recent
    assert m.put(["d"], [bytes(300)]) == [True]                 # evicts b (least recent)
    assert m.exists(["a", "b", "c", "d"]) == [True, False, True, True]
    assert m.put(["big"], [bytes(1001)]) == [False]             # larger than the budget
    st = m.stats()
    assert (st.objects, st.used_bytes, st.evictions, st.errors) == (3, 900, 1, {"too_large": 1})
    assert m.put(["a"], [bytes(100)]) == [True]                 # replacing frees the old size
    assert m.stats().used_bytes == 700


def test_named_memory_stores_are_shared_in_process():
    a = open_backend("memory://shared-test?capacity=1MiB")
    b = open_backend("memory://shared-test?capacity=1MiB")
    a.put(["k"], [b"v"])
    assert b.exists(["k"]) == [True]
    a.close()
    assert b.exists(["k"]) == [True]                            # still open through b
    b.close()
    c = open_backend("memory://shared-test?capacity=1MiB")
    assert c.exists(["k"]) == [False]                           # last close dropped it
    c.close()


def test_file_lru_budget_and_restart_scan(tmp_path):
    root = tmp_path / "l3"
    f = open_backend(f"file://{root}?capacity=1000")
    assert f.put(["a", "b", "c"], [bytes([1]) * 300, bytes([2]) * 300, bytes([3]) * 300]) == [True] * 3
    buf = bytearray(300)
    assert f.get_into(["a"], [buf]) == [300] and buf == bytes([1]) * 300
    assert f.put(["d"], [bytes(300)]) == [True]
    assert f.exists(["a", "b", "c", "d"]) == [True, False, True, True]
    assert f.put(["huge"], [bytes(2000)]) == [False]
    assert (f.stats().objects, f.stats().used_bytes, f.stats().evictions) == (3, 900, 1)
    files = sorted(p.name for p in root.rglob("*") if p.is_file())
    assert files == ["a", "c", "d"]                             # no temp files left behind
    # a stale temp file from a crashed writer is removed at the next open; files are indexed
    shard = next(p for p in root.iterdir() if p.is_dir())
    stale = shard / ".tmp.x.1.0"
    stale.write_bytes(b"partial")
    os.utime(stale, (1, 1))
    g = FileBackend(root, capacity_bytes=1000)
    assert not stale.exists()
    assert (g.stats().objects, g.stats().used_bytes) == (3, 900)
    assert g.put(["e"], [bytes(300)]) == [True]                 # evicts the least recent file
    assert sum(g.exists(["a", "c", "d", "e"])) == 3


def test_file_values_are_replaced_atomically(tmp_path):
    f = open_backend(f"file://{tmp_path}")
    f.put(["k"], [[b"HEAD", np.arange(1000, dtype=np.uint8)]])
    f.put(["k"], [b"second"])
    buf = bytearray(10)
    assert f.get_into(["k"], [buf]) == [6] and buf[:6] == b"second"
    assert f.delete(["k", "k"]) == 1 and f.exists(["k"]) == [False]
