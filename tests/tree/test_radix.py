"""RadixTree bookkeeping: walk, insert with dedup, split, shadows, eviction order, hashes."""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest

from hicache.tree import (LFU, LRU, RadixTree, Snapshot, chain_hashes, device_victims, get_strategy,
                          host_victims, page_hash, snapshot_victims)
from hicache.errors import ConfigError

P = 4


def toks(*pages: int) -> np.ndarray:
    """Tokens of whole pages; page value v -> [v, v, v, v] (distinct pages, easy to read)."""
    return np.repeat(np.asarray(pages, np.int32), P)


def ids(*v: int) -> np.ndarray:
    return np.asarray(v, np.int64)


def test_insert_then_walk_full_and_partial():
    t = RadixTree(P)
    r = t.insert(toks(1, 2, 3), ids(10, 11, 12))
    assert r.page_ids.tolist() == [10, 11, 12] and r.duplicates.size == 0
    assert len(r.new_nodes) == 1 and r.last.num_pages == 3
    m = t.walk(toks(1, 2, 9), max_pages=3)
    assert m.num_pages == 2 and m.segments[0][1] == 2
    assert t.walk(toks(1, 2, 3, 4), max_pages=2).num_pages == 2   # capped
    assert t.walk(toks(5), max_pages=1).num_pages == 0
    t.check_integrity()


def test_split_keeps_snapshot_on_lower_node_and_ids_aligned():
    t = RadixTree(P)
    r = t.insert(toks(1, 2, 3), ids(10, 11, 12))
    node = r.last
    node.snapshot = Snapshot(device_id=7)
    upper = t.split(node, 1)
    assert upper.device_ids.tolist() == [10] and node.device_ids.tolist() == [11, 12]
    assert upper.snapshot is None and node.snapshot.device_id == 7
    assert node.parent is upper and upper.parent is t.root
    assert upper.hashes + node.hashes == chain_hashes(t.hash_seed, b"\0" * 32, toks(1, 2, 3), P)
    t.check_integrity()


def test_a_node_where_requests_diverged_stays_forked():
    t = RadixTree(P)
    a = t.insert(toks(1, 2, 3), ids(10, 11, 12)).last
    assert not a.forked
    y = t.insert(toks(1, 2, 7), ids(20, 21, 22)).last      # diverges after page 2: a is split
    upper = a.parent
    assert upper.depth == 2 and len(upper.children) == 2
    assert upper.forked and not a.forked and not y.forked   # the fork is the upper part's end
    t.insert(toks(1, 2, 3, 4), ids(10, 11, 12, 23))
    assert len(a.children) == 1 and not a.forked            # extended, not diverged
    t.insert(toks(1, 2, 3, 5), ids(10, 11, 12, 24))
    assert a.forked
    for child in list(a.children.values()) + [y]:
        child.device_ids = None
        t.remove_subtree(child)
    assert not a.children and len(upper.children) == 1
    assert a.forked and upper.forked                        # for good: where requests left the path
    top = t.split(upper, 1)
    assert upper.forked and not top.forked                  # the flag stays with the node's end
    t.check_integrity()


def test_sibling_publish_dedups_to_existing_pages():
    t = RadixTree(P)
    t.insert(toks(1, 2, 3), ids(10, 11, 12))
    # A concurrent sibling computed the same first two pages itself, then diverged.
    r = t.insert(toks(1, 2, 7), ids(20, 21, 22))
    assert r.page_ids.tolist() == [10, 11, 22]
    assert r.duplicates.tolist() == [20, 21]
    assert [n.num_pages for n in r.new_nodes] == [1]
    # The original node was split at the divergence: [1,2] -> {[3], [7]}
    top = t.root.children[toks(1)[:P].tobytes()]
    assert top.num_pages == 2 and len(top.children) == 2
    t.check_integrity()


def test_borrowed_pages_are_not_duplicates():
    t = RadixTree(P)
    t.insert(toks(1, 2), ids(10, 11))
    r = t.insert(toks(1, 2, 3), ids(10, 11, 30))
    assert r.duplicates.size == 0 and r.page_ids.tolist() == [10, 11, 30]


def test_shadow_node_gets_device_pages_back_on_publish():
    t = RadixTree(P)
    r = t.insert(toks(1, 2), ids(10, 11))
    node = r.last
    node.host_ids = ids(5, 6)
    node.device_ids = None  # demoted: a shadow
    assert node.is_shadow
    assert t.walk(toks(1, 2), 2).num_pages == 2  # shadows still match
    r2 = t.insert(toks(1, 2), ids(40, 41))
    assert r2.duplicates.size == 0 and node.device_ids.tolist() == [40, 41]
    assert r2.new_nodes == [node]
    t.check_integrity()


def test_loading_nodes_are_not_adopted():
    t = RadixTree(P)
    node = t.insert(toks(1), ids(10)).last
    node.load_ticket = object()
    r = t.insert(toks(1, 2), ids(50, 51))
    assert r.private.tolist() == [0, 1] and r.page_ids.tolist() == [50, 51] and r.duplicates.size == 0
    assert r.last is t.root and not node.children           # nothing hangs below it
    r = t.insert(toks(1, 2), ids(10, 51))   # borrowed: fine
    assert r.private.size == 0 and r.last.parent is node


def test_insert_host_only_pages_and_backfill():
    t = RadixTree(P)
    t.insert(toks(1), ids(10))
    unused, last, added = t.insert_host(toks(1, 2, 3), ids(100, 101, 102))
    # page 1 is on the device without a host copy: the fetched copy becomes its backup
    assert unused.size == 0 and len(added) == 2
    assert t.root.children[toks(1)[:P].tobytes()].host_ids.tolist() == [100]
    assert last.is_shadow and last.host_ids.tolist() == [101, 102]
    unused, _, added = t.insert_host(toks(1, 2), ids(200, 201))
    assert unused.tolist() == [200, 201] and added == []
    # after a host hit of 1 page, an L3 fetch of the next two pages hangs below it
    unused, last, added = t.insert_host(toks(1, 2, 3, 4), ids(300), start_page=3)
    assert unused.size == 0 and last.host_ids.tolist() == [300] and last.parent.host_ids.tolist() == [102]
    # the prefix before start_page is gone: nothing is placed
    unused, last, _ = t.insert_host(toks(7, 8), ids(400), start_page=1)
    assert unused.tolist() == [400] and last is None
    t.check_integrity()


def test_locks_cover_ancestors():
    t = RadixTree(P)
    a = t.insert(toks(1), ids(1)).last
    b = t.insert(toks(1, 2), ids(1, 2)).last
    t.lock(b)
    assert (a.lock_device, b.lock_device) == (1, 1)
    t.lock(b, -1)
    assert (a.lock_device, b.lock_device) == (0, 0)
    with pytest.raises(AssertionError, match="below zero"):
        t.lock(b, -1)


def test_device_eviction_order_lru_leaf_first():
    t = RadixTree(P)
    a = t.insert(toks(1), ids(1)).last          # access 1
    b = t.insert(toks(1, 2), ids(1, 2)).last    # access 2 (a untouched: it's the parent)
    c = t.insert(toks(3), ids(3)).last          # access 3
    t.touch(t.walk(toks(1), 1))                 # a is now the most recent
    order = []
    for node in device_victims(t, LRU()):
        order.append(node.node_id)
        node.device_ids = None
        node.host_ids = ids(0) if node.num_pages == 1 else ids(0)
    # b (oldest leaf) first; then c; a only after its child b left the device.
    assert order == [b.node_id, c.node_id, a.node_id]


def test_device_eviction_skips_locked_and_pending():
    t = RadixTree(P)
    a = t.insert(toks(1), ids(1)).last
    b = t.insert(toks(2), ids(2)).last
    t.lock(a)
    b.backup_pending = 1
    assert list(device_victims(t, LRU())) == []
    b.backup_pending = 0
    assert list(device_victims(t, LRU(), busy=lambda n: n is b)) == []
    assert [n.node_id for n in device_victims(t, LRU())] == [b.node_id]


def test_lfu_prefers_rarely_hit():
    t = RadixTree(P)
    a = t.insert(toks(1), ids(1)).last
    b = t.insert(toks(2), ids(2)).last
    for _ in range(3):
        t.touch(t.walk(toks(1), 1))
    t.touch(t.walk(toks(2), 1))   # b most recent but hit once
    first = next(iter(device_victims(t, LFU())))
    assert first is b
    assert next(iter(device_victims(t, LRU()))) is a
    with pytest.raises(ConfigError):
        get_strategy("mru")


def test_host_victims_only_host_only_leaves():
    t = RadixTree(P)
    a = t.insert(toks(1), ids(1)).last
    b = t.insert(toks(1, 2), ids(1, 2)).last
    a.host_ids, b.host_ids = ids(7), ids(8)
    assert list(host_victims(t, LRU())) == []       # both on device
    b.device_ids = None
    assert list(host_victims(t, LRU())) == [b]
    b.lock_host = 1
    assert list(host_victims(t, LRU())) == []


def test_snapshot_victims_per_tier():
    t = RadixTree(P)
    a = t.insert(toks(1), ids(1)).last
    b = t.insert(toks(2), ids(2)).last
    a.snapshot = Snapshot(device_id=0, last_access=5)
    b.snapshot = Snapshot(device_id=1, host_id=3, last_access=2)
    assert [s.device_id for _, s in snapshot_victims(t, LRU(), "device")] == [1, 0]
    assert list(snapshot_victims(t, LRU(), "host")) == []   # b's host copy backs a device one
    a.snapshot.lock = 1
    assert [s.device_id for _, s in snapshot_victims(t, LRU(), "device")] == [1]


def test_hashes_chain_and_are_process_independent():
    t = RadixTree(P, hash_seed=b"s")
    node = t.insert(toks(1, 2), ids(1, 2)).last
    h1 = page_hash(b"s", b"\0" * 32, toks(1))
    assert node.hashes[0] == h1 and node.hashes[1] == page_hash(b"s", h1, toks(2))
    # mid-flight publish (one page, then the next) gives the same hashes as one publish
    t2 = RadixTree(P, hash_seed=b"s")
    t2.insert(toks(1), ids(1))
    last = t2.insert(toks(1, 2), ids(1, 2)).last
    assert [*last.parent.hashes, *last.hashes] == node.hashes
    code = ("import numpy as np; from hicache.tree import chain_hashes;"
            "print(chain_hashes(b's', bytes(32), np.repeat(np.array([1,2],np.int32),4), 4)[1].hex())")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                         env={"PYTHONHASHSEED": "7", "PATH": ""})
    assert out.stdout.strip() == node.hashes[1].hex()
    assert RadixTree(P, hash_seed=b"other").insert(toks(1), ids(1)).last.hashes[0] != h1


def test_integrity_detects_shadow_parent_of_device_child():
    t = RadixTree(P)
    a = t.insert(toks(1), ids(1)).last
    t.insert(toks(1, 2), ids(1, 2))
    a.host_ids, a.device_ids = ids(9), None
    with pytest.raises(AssertionError, match="shadow parent"):
        t.check_integrity()
