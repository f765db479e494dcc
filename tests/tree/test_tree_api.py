"""Tree operations the cache builds on: depth, node_at, resume points, publishing from a
start node, subtree removal returning ids, pin checks, observed writes."""

from __future__ import annotations

from hicache.tree import LRU, RadixTree, Snapshot, page_hash
from tests.tree.test_radix import P, ids, toks


def test_depth_is_kept_through_splits_and_node_at_splits_where_asked():
    t = RadixTree(P)
    node = t.insert(toks(1, 2, 3, 4), ids(10, 11, 12, 13)).last
    assert node.depth == 4 and node.num_pages == 4
    path = t.walk(toks(1, 2, 3, 4, 5), 5)
    assert t.node_at(path, 0) is t.root
    upper = t.node_at(path, 2)
    assert (upper.depth, upper.num_pages, upper.device_ids.tolist()) == (2, 2, [10, 11])
    assert (node.depth, node.num_pages, node.device_ids.tolist()) == (4, 2, [12, 13])
    assert node.parent is upper and node.tokens.tolist() == toks(3, 4).tolist()
    path = t.walk(toks(1, 2, 3, 4), 4)
    assert t.node_at(path, 4) is node and t.node_at(path, 2) is upper
    mid = t.node_at(path, 3)   # a second split, of the lower part
    assert (mid.depth, mid.device_ids.tolist(), node.device_ids.tolist()) == (3, [12], [13])
    assert t.depth_pages(node) == 4
    t.check_integrity()


def test_walk_compares_whole_pages_and_stops_inside_a_node():
    t = RadixTree(P)
    t.insert(toks(1, 2, 3), ids(10, 11, 12))
    q = toks(1, 2, 3)
    q[2 * P + 1] = 99                        # page 2 differs in its second token
    m = t.walk(q, 3)
    assert [(n.num_pages, k) for n, k in m.segments] == [(3, 2)] and m.num_pages == 2
    assert m.last_hash == t.root.children[toks(1)[:P].tobytes()].hashes[1]
    assert t.walk(toks(1, 2), 5).num_pages == 2      # capped by the tokens given
    assert t.walk(toks(1, 2, 3)[:-1], 3).num_pages == 2   # a partial last page never matches


def test_resume_point_without_state_is_the_deepest_page_and_counts_device_prefix():
    t = RadixTree(P)
    a = t.insert(toks(1, 2), ids(10, 11)).last
    b = t.insert(toks(1, 2, 3, 4), ids(10, 11, 12, 13)).last
    b.host_ids, b.device_ids = ids(5, 6), None          # b is a shadow
    r = t.resume_point(t.walk(toks(1, 2, 3, 4, 9), 4))
    assert (r.pages, r.node, r.device_pages, r.snapshot) == (4, b, 2, None)
    r = t.resume_point(t.walk(toks(1, 2, 3, 9), 3))       # ends inside b
    assert (r.pages, r.node, r.device_pages) == (3, None, 2)
    r = t.resume_point(t.walk(toks(1, 2, 3, 4), 4), device_only=True)
    assert (r.pages, r.node, r.device_pages) == (2, a, 2)


def test_resume_point_with_state_needs_a_snapshot_and_device_only_a_device_copy():
    t = RadixTree(P, needs_snapshots=True)
    a = t.insert(toks(1), ids(10)).last
    b = t.insert(toks(1, 2), ids(10, 11)).last
    c = t.insert(toks(1, 2, 3), ids(10, 11, 12)).last
    a.snapshot = Snapshot(device_id=0)
    c.snapshot = Snapshot(host_id=4)                    # host copy only
    path = t.walk(toks(1, 2, 3, 7), 3)
    r = t.resume_point(path)
    assert (r.pages, r.node, r.device_pages, r.snapshot) == (3, c, 3, c.snapshot)
    r = t.resume_point(path, device_only=True)
    assert (r.pages, r.node, r.snapshot) == (1, a, a.snapshot)
    b.snapshot = Snapshot(device_id=1)
    assert t.resume_point(path, device_only=True).node is b
    assert t.resume_point(t.walk(toks(1, 2, 3, 7), 2)).node is b   # a walk cut at 2 pages


def test_insert_from_a_start_node_looks_only_past_it():
    t = RadixTree(P)
    first = t.insert(toks(1, 2), ids(10, 11)).last
    t.insert(toks(1, 2, 3, 4), ids(10, 11, 12, 13))     # a sibling published pages 2..3 first
    # The request holds pages 0..1 (node `first`) and publishes pages 2..4 with its own ids.
    r = t.insert(toks(1, 2, 3, 4, 5), ids(22, 23, 24), start=first)
    assert r.page_ids.tolist() == [12, 13, 24] and r.duplicates.tolist() == [22, 23]
    assert r.last.depth == 5 and r.last.parent.depth == 4 and r.private.size == 0
    assert [n.device_ids.tolist() for n in r.new_nodes] == [[24]]
    # Start below the root on a node whose next copy is loading: private from there.
    loading = r.last.parent
    loading.load_ticket = object()
    r = t.insert(toks(1, 2, 3, 4, 5), ids(32, 33, 34), start=first)
    assert r.private.tolist() == [2, 3, 4] and r.last is first and r.duplicates.size == 0
    # Nothing to publish past the start node: the start node is the boundary.
    r = t.insert(toks(1, 2), ids(), start=first)
    assert r.last is first and r.page_ids.size == 0
    t.check_integrity()


def test_insert_host_and_insert_share_the_split_descent():
    t = RadixTree(P)
    t.insert(toks(1, 2, 3), ids(10, 11, 12))
    unused, last, added = t.insert_host(toks(1, 2, 8), ids(100, 101, 102))
    # pages 1, 2 split off the device node and gain host copies; page 8 is a new shadow
    assert unused.size == 0 and [n.depth for n in added] == [2, 3]
    assert added[0].host_ids.tolist() == [100, 101] and added[0].device_ids.tolist() == [10, 11]
    assert last.is_shadow and last.host_ids.tolist() == [102]
    t.check_integrity()


def build_branch():
    """root -> a[1] (device 10, host 20) -> b[2] (host 21) -> {c[3] (host 22), d[4] (host 23,
    snapshot host 7)}; a also has e[5] (device 15, snapshot device 3, host 4)."""
    t = RadixTree(P, needs_snapshots=True)
    a = t.insert(toks(1), ids(10)).last
    e = t.insert(toks(1, 5), ids(10, 15)).last
    a.host_ids = ids(20)
    b = t.insert_host(toks(1, 2), ids(21), start_page=1)[1]
    c = t.insert_host(toks(1, 2, 3), ids(22), start_page=2)[1]
    d = t.insert_host(toks(1, 2, 4), ids(23), start_page=2)[1]
    d.snapshot = Snapshot(host_id=7)
    e.snapshot = Snapshot(device_id=3, host_id=4)
    return t, a, b, c, d, e


def test_remove_subtree_returns_every_id_children_first():
    t, a, b, c, d, e = build_branch()
    assert not t.subtree_pinned(a)
    snap_d = d.snapshot
    seen = []
    removed = t.remove_subtree(b, on_detach=lambda n: seen.append((n.node_id, n.parent.node_id)))
    assert [n.node_id for n in removed.nodes] == [c.node_id, d.node_id, b.node_id]
    assert seen == [(c.node_id, b.node_id), (d.node_id, b.node_id), (b.node_id, a.node_id)]  # still attached
    assert removed.snapshots == [snap_d] and snap_d._node is None
    assert removed.host_pages.tolist() == [22, 23, 21] and removed.device_pages.size == 0
    assert (removed.device_snapshots, removed.host_snapshots) == ([], [7])
    assert b.parent is None and list(a.children.values()) == [e] and d.snapshot is None
    removed = t.remove_subtree(a)
    assert removed.device_pages.tolist() == [15, 10] and removed.host_pages.tolist() == [20]
    assert (removed.device_snapshots, removed.host_snapshots) == ([3], [4])
    assert not t.root.children
    t.check_integrity()


def test_subtree_pinned_sees_locks_copies_in_flight_and_a_predicate():
    t, a, b, c, d, e = build_branch()
    assert not t.subtree_pinned(b)
    c.lock_host = 1
    assert t.subtree_pinned(b) and t.subtree_pinned(a) and not t.subtree_pinned(d)
    c.lock_host = 0
    d.snapshot.put_pending = True
    assert t.subtree_pinned(b) and d.busy
    d.snapshot.put_pending = False
    e.load_ticket = object()
    assert t.subtree_pinned(a) and not t.subtree_pinned(b)
    e.load_ticket = None
    assert t.subtree_pinned(b, busy=lambda n: n is c) and not t.subtree_pinned(d, busy=lambda n: n is c)


def test_snapshot_knows_its_node_and_reports_changes():
    t = RadixTree(P, needs_snapshots=True)
    a = t.insert(toks(1), ids(10)).last
    order = t.eviction_order(LRU())
    s1 = Snapshot(device_id=0, last_access=1)
    a.snapshot = s1
    assert s1._node is a and [n for n, _ in order.snapshot_victims("device")] == [a]
    s1.loading = True                                   # an H2D load fills it: not a victim
    assert list(order.snapshot_victims("device")) == [] and a.busy
    s1.loading = False
    s2 = Snapshot(device_id=1)
    a.snapshot = s2                                     # replaced: s1 leaves the order
    assert s1._node is None and [s for _, s in order.snapshot_victims("device")] == [s2]
    t.check_integrity()


def test_hashes_are_chained_from_bytes_as_from_arrays():
    t = RadixTree(P, hash_seed=b"s")
    node = t.insert(toks(1, 2), ids(1, 2)).last
    h1 = page_hash(b"s", b"\0" * 32, toks(1))
    assert node.hashes == [h1, page_hash(b"s", h1, toks(2).tobytes())]


def test_evictable_totals_follow_locks_residency_splits_and_removal():
    t = RadixTree(P, needs_snapshots=True)
    a = t.insert(toks(1, 2), ids(10, 11)).last
    b = t.insert(toks(1, 2, 3), ids(10, 11, 12)).last
    ev = lambda: (t.evictable("device", "page"), t.evictable("host", "page"),  # noqa: E731
                  t.evictable("device", "state"), t.evictable("host", "state"))
    assert ev() == (3, 0, 0, 0)
    t.lock(b)
    assert ev() == (0, 0, 0, 0)
    t.lock(b, -1)
    b.host_ids, b.device_ids = ids(7), None               # b demoted to a shadow
    assert ev() == (2, 1, 0, 0)
    b.lock_host = 1
    assert ev() == (2, 0, 0, 0)
    b.lock_host = 0
    a.snapshot = Snapshot(device_id=0)
    b.snapshot = Snapshot(host_id=5)
    assert ev() == (2, 1, 1, 1)
    a.snapshot.lock = 1
    assert ev() == (2, 1, 0, 1)
    t.split(a, 1)                                          # the pages move, the totals stay
    assert ev() == (2, 1, 0, 1)
    t.remove_subtree(b)
    assert ev() == (2, 0, 0, 0)
    t.check_integrity()


def test_a_repeated_walk_is_reused_only_while_the_tree_shape_is_unchanged():
    t = RadixTree(P)
    t.insert(toks(1, 2, 3), ids(10, 11, 12))
    first = t.walk(toks(1, 2, 3, 4), 3)
    assert t.walk(toks(1, 2, 3, 4), 3) is first            # same tokens, same shape
    assert t.walk(toks(1, 2, 3, 4), 2) is not first        # another cap
    node = first.segments[0][0]
    node.host_ids, node.device_ids = ids(5, 6, 7), None     # residency is not shape
    again = t.walk(toks(1, 2, 3, 4), 3)
    assert again == first and t.walk(toks(1, 2, 3, 4), 3) is again
    t.insert(toks(1, 2, 3, 4), ids(10, 11, 12, 13))       # a new child: the walk goes deeper
    assert t.walk(toks(1, 2, 3, 4, 5), 4).num_pages == 4
    t.split(t.walk(toks(1, 2, 3), 3).segments[0][0], 1)   # a split: segments change
    assert [k for _, k in t.walk(toks(1, 2, 3, 4, 5), 4).segments] == [1, 2, 1]
    t.check_integrity()


def test_move_lock_changes_only_the_nodes_on_one_path():
    t = RadixTree(P)
    a = t.insert(toks(1, 2), ids(10, 11)).last
    b = t.insert(toks(1, 2, 3), ids(10, 11, 12)).last
    c = t.insert(toks(1, 2, 4), ids(10, 11, 14)).last
    d = t.insert(toks(5), ids(15)).last
    locks = lambda: [n.lock_device for n in (a, b, c, d)]  # noqa: E731
    t.lock(a)
    t.move_lock(a, b)                 # extend: only b gains
    assert locks() == [1, 1, 0, 0]
    t.move_lock(b, c)                 # sideways: b drops, c gains, a keeps its lock
    assert locks() == [1, 0, 1, 0]
    t.move_lock(c, d)                 # across the root
    assert locks() == [0, 0, 0, 1]
    t.move_lock(d, t.root)            # back to nothing held
    assert locks() == [0, 0, 0, 0] and t.evictable("device", "page") == 5
    t.move_lock(t.root, c)
    assert locks() == [1, 0, 1, 0] and t.evictable("device", "page") == 2
    t.check_integrity()
