"""Redis Cluster: keys spread over every node; MOVED and ASK redirects are followed."""

from __future__ import annotations

import numpy as np
import pytest

# The Redis backends import redis-py (an optional dependency): without it this module skips
# instead of stopping the whole collection (a GPU machine has no redis-py).
pytest.importorskip("redis")

from hicache.storage import L3Store, open_backend
from hicache.storage.cluster import key_slot

from .conftest import page_hashes, rows

pytestmark = pytest.mark.redis
FP = "0123456789abcdef"


def test_slots_match_the_server_and_pages_spread(redis_cluster):
    node = redis_cluster.nodes[0]
    for key in ("foo", "hc1.x.y:p:00ff", "{tag}rest", "a" * 100):
        assert int(node.cli("CLUSTER", "KEYSLOT", key)) == key_slot(key)
    s = L3Store(open_backend(redis_cluster.url), FP, "spread")
    hs, src = page_hashes(30), rows(30, 20_000)
    assert s.put(hs, "page", list(src)) == [True] * 30
    assert all(int(n.cli("DBSIZE")) > 0 for n in redis_cluster.nodes)
    out = np.zeros_like(src)
    assert s.get(hs, "page", list(out)).hits == 30 and np.array_equal(out, src)
    assert s.stats().backend["objects"] == 30 and s.stats().backend["extra"]["nodes"] == 3
    s.delete(hs)
    s.close()


def _move_slot(cluster, slot, src, dst, keys, finish=True):
    """Migrate ``slot`` from node ``src`` to ``dst`` the way redis-cli --cluster reshard does."""
    dst_id, src_id = cluster.node_id(dst), cluster.node_id(src)
    assert dst.cli("CLUSTER", "SETSLOT", str(slot), "IMPORTING", src_id) == "OK"
    assert src.cli("CLUSTER", "SETSLOT", str(slot), "MIGRATING", dst_id) == "OK"
    for k in keys:
        assert src.cli("MIGRATE", "127.0.0.1", str(dst.port), k, "0", "5000") == "OK"
    if finish:
        for n in cluster.nodes:
            n.cli("CLUSTER", "SETSLOT", str(slot), "NODE", dst_id)


def test_moved_and_ask_redirects(redis_cluster):
    s = L3Store(open_backend(redis_cluster.url), FP, "redirects")
    hs, src = page_hashes(2), rows(2, 50_000)
    assert s.put(hs, "page", list(src)) == [True, True]    # the client now has a slot map
    backend = s.backend
    # ASK: the slot of page 0 is mid-migration and its key already moved
    k0 = s.key(hs[0])
    slot0 = key_slot(k0)
    owner = redis_cluster.owner(slot0)
    target = next(n for n in redis_cluster.nodes if n is not owner)
    _move_slot(redis_cluster, slot0, owner, target, [k0], finish=False)
    out = np.zeros_like(src)
    assert s.get(hs, "page", list(out)).hits == 2 and np.array_equal(out, src)
    assert backend.redirects.get("ask") >= 1
    # finish the migration: now the old owner answers MOVED and the client follows it
    for n in redis_cluster.nodes:
        n.cli("CLUSTER", "SETSLOT", str(slot0), "NODE", redis_cluster.node_id(target))
    out[:] = 0
    assert s.get(hs, "page", list(out)).hits == 2 and np.array_equal(out, src)
    assert backend.redirects.get("moved") >= 1
    refreshes = backend.redirects.get("map_refresh")
    assert s.lookup(hs) == 2 and backend.redirects.get("map_refresh") == refreshes + 1
    # puts follow MOVED too: move page 1's slot with its key, then overwrite page 1
    k1 = s.key(hs[1])
    slot1 = key_slot(k1)
    o1 = redis_cluster.owner(slot1)
    t1 = next(n for n in redis_cluster.nodes if n is not o1)
    _move_slot(redis_cluster, slot1, o1, t1, [k1])
    new1 = rows(1, 50_000, seed=99)[0]
    assert s.put(hs[1:], "page", [new1]) == [True]
    assert t1.cli("EXISTS", k1) == "1"
    s.delete(hs)
    s.close()
