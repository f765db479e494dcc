"""Two processes sharing one Redis reuse each other's pages: keys and headers depend only on
the layout, the salt and the page hashes, never on ``hash()`` (PYTHONHASHSEED differs)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from hicache.layout import CacheLayout
from hicache.storage import L3Store, open_backend

from .conftest import page_hashes, rows

pytestmark = pytest.mark.redis
ROOT = Path(__file__).resolve().parents[2]

CHILD = r"""
import sys, hashlib, numpy as np
from hicache.layout import CacheLayout
from hicache.storage import L3Store, open_backend
url, config, mode = sys.argv[1:4]
layout = CacheLayout.from_yaml(config)
store = L3Store(open_backend(url), layout.fingerprint, "shared-salt")
def chain(n, seed):
    out, prev = [], b""
    for i in range(n):
        prev = hashlib.sha256(prev + f"{seed}:{i}".encode()).digest()
        out.append(prev)
    return out
size = layout.object_bytes("page")
if mode == "write":
    data = np.random.default_rng(11).integers(0, 256, size=(5, size), dtype=np.uint8)
    print(sum(store.put(chain(5, "child"), "page", list(data))))
else:
    hs = chain(4, "parent")
    n = store.lookup(hs)
    dst = np.zeros((n, size), dtype=np.uint8)
    r = store.get(hs[:n], "page", list(dst))
    print(n, r.hits, hashlib.sha256(dst.tobytes()).hexdigest())
"""


def run_child(url, config, mode, seed):
    env = dict(os.environ, PYTHONHASHSEED=str(seed), PYTHONPATH=str(ROOT))
    out = subprocess.run([sys.executable, "-c", CHILD, url, str(config), mode], capture_output=True,
                         text=True, env=env, timeout=120, cwd=ROOT)
    assert out.returncode == 0, out.stderr
    return out.stdout.split()


def test_two_processes_share_pages(redis_server, configs_dir):
    import hashlib

    config = configs_dir / "tiny-hybrid.yaml"
    layout = CacheLayout.from_yaml(config)
    size = layout.object_bytes("page")
    store = L3Store(open_backend(redis_server.url), layout.fingerprint, "shared-salt")
    # the other process writes; we read its pages
    assert run_child(redis_server.url, config, "write", seed=1) == ["5"]
    hs = page_hashes(5, "child")
    assert store.lookup(hs) == 5
    dst = np.zeros((5, size), dtype=np.uint8)
    assert store.get(hs, "page", list(dst)).hits == 5
    expect = np.random.default_rng(11).integers(0, 256, size=(5, size), dtype=np.uint8)
    assert np.array_equal(dst, expect)
    # we write; another process (another hash seed) reads ours
    mine = rows(3, size, seed=12)
    assert store.put(page_hashes(3, "parent"), "page", list(mine)) == [True] * 3
    n, hits, digest = run_child(redis_server.url, config, "read", seed=2)
    assert (n, hits, digest) == ("3", "3", hashlib.sha256(mine.tobytes()).hexdigest())
    # a process with another salt sees nothing
    other = L3Store(open_backend(redis_server.url), layout.fingerprint, "other-salt")
    assert other.lookup(hs) == 0
    store.close()
    other.close()
