"""The owner index (hicache.tree.owners): exact holders through adds, splits, frees, reuse."""

from __future__ import annotations

import numpy as np

from hicache.tree import RadixTree, Snapshot

P = 4


def toks(*pages: int) -> np.ndarray:
    return np.repeat(np.asarray(pages, np.int32), P)


def ids(*v: int) -> np.ndarray:
    return np.asarray(v, np.int64)


def test_lookups_follow_adds_splits_frees_and_reuse():
    t = RadixTree(P, needs_snapshots=True)
    a = t.insert(toks(1, 2, 3), ids(10, 11, 12)).last
    index = t.owner_index()                      # built from a scan of what is there
    assert index.page("device", 11) == (a, 1)
    b = t.insert(toks(1, 2, 3, 4, 5), ids(10, 11, 12, 13, 14)).last   # added after: recorded
    assert b is not a and index.page("device", 14) == (b, 1)
    upper = t.split(a, 2)                        # upper takes ids 10, 11; a keeps 12
    assert index.page("device", 10) == (upper, 0) and index.page("device", 11) == (upper, 1)
    assert index.page("device", 12) == (a, 0)
    a.host_ids = ids(7)                           # a host copy: recorded on the host side
    assert index.page("host", 7) == (a, 0) and index.page("device", 7) is None
    b.device_ids = None                           # freed: nobody holds 13, 14 now
    assert index.page("device", 13) is None and index.page("device", 14) is None
    b.device_ids = ids(30, 14)                    # 14 given back to b, at another position
    assert index.page("device", 14) == (b, 1) and index.page("device", 30) == (b, 0)
    assert index.page("device", 99) is None       # never given
    snap = Snapshot(device_id=3)
    a.snapshot = snap
    assert index.snapshot("device", 3) is snap
    snap.device_id, snap.host_id = None, 5        # demoted: the device row is free
    assert index.snapshot("device", 3) is None and index.snapshot("host", 5) is snap
    a.snapshot = None                             # detached: not the tree's any more
    assert index.snapshot("host", 5) is None
    t.check_integrity()


def test_a_removed_node_holds_nothing():
    t = RadixTree(P)
    keep = t.insert(toks(1, 2), ids(0, 1)).last
    gone = t.insert(toks(1, 2, 3), ids(0, 1, 2)).last
    index = t.owner_index()
    assert index.page("device", 2) == (gone, 0)
    gone.device_ids = None
    gone.host_ids = ids(4)
    gone.host_ids = None
    t.remove(gone)
    assert index.page("device", 2) is None and index.page("host", 4) is None
    keep.device_ids = ids(0, 2)                   # id 2 reused by a node still in the tree
    assert index.page("device", 2) == (keep, 1)
    t.check_integrity()
