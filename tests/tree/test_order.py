"""The incrementally kept eviction order against a brute-force scan of the tree.

The reference below recomputes, from the documented rules and public node fields only,
which nodes and snapshots are eligible and in what order; hypothesis drives random
sequences of tree changes and evictions and compares the two after every step.
"""

from __future__ import annotations

import numpy as np
from hypothesis import HealthCheck, given, settings, strategies as st

from hicache.tree import (LFU, LRU, RadixTree, Ranked, Snapshot, Value, device_victims, get_strategy, host_victims,
                          snapshot_victims)
from hicache.tree.order import LazyHeap

P = 2


def toks(*pages: int) -> np.ndarray:
    return np.repeat(np.asarray(pages, np.int32), P)


def ids(*v: int) -> np.ndarray:
    return np.asarray(v, np.int64)


# -- the reference ---------------------------------------------------------------------------
def _snap_busy(s):
    return s is not None and (s.backup_pending or s.put_pending or s.loading)


def ref_device_eligible(n) -> bool:
    return (n.parent is not None and n.on_device and n.lock_device == 0 and n.backup_pending == 0
            and n.load_ticket is None and not _snap_busy(n.snapshot)
            and not any(c.on_device for c in n.children.values()))


def ref_host_eligible(n) -> bool:
    s = n.snapshot
    return (n.parent is not None and n.is_shadow and not n.children and n.lock_host == 0 and n.lock_device == 0
            and n.load_ticket is None and not _snap_busy(s) and not (s is not None and s.lock))


def ref_key(tree, strategy, n) -> tuple:
    alive = not tree.needs_snapshots or bool(n.children) or (n.snapshot is not None and not n.snapshot.empty)
    return (alive, strategy.node_priority(n), n.node_id)


def ref_device(tree, strategy) -> list[int]:
    nodes = [n for n in tree.nodes() if ref_device_eligible(n)]
    return [n.node_id for n in sorted(nodes, key=lambda n: ref_key(tree, strategy, n))]


def ref_host(tree, strategy) -> list[int]:
    nodes = [n for n in tree.nodes() if ref_host_eligible(n)]
    return [n.node_id for n in sorted(nodes, key=lambda n: ref_key(tree, strategy, n))]


def ref_snapshot_priority(strategy, n, s) -> tuple:
    if isinstance(strategy, Ranked):   # the documented rules, snapshots below n by a walk
        below, stack = 0, list(n.children.values())
        while stack:
            c = stack.pop()
            below += c.snapshot is not None
            stack.extend(c.children.values())
        taken = sum(not c.decoded for c in n.children.values())   # branches requests took
        if strategy.forks_last and taken >= 2:
            return (2, s.last_access)
        used = (s.passed if strategy.passed_only else s.resumed or s.passed) > 0
        if below and taken <= 1 and not n.forked and (
                strategy.intermediate_first or (strategy.superseded_first and taken == 1 and used)):
            return (0, s.last_access)
        if strategy.idle_tails_first and s.kind == "finish" and not (s.resumed or s.passed or s.expected):
            return (0, s.last_access)
        if strategy.probation and not (s.resumed or s.passed or s.expected):
            return (0.5, s.last_access)
        return (1, s.last_access)
    return strategy.priority(s.last_access, 0)


def ref_snapshots(tree, strategy, tier) -> list[int]:
    def ok(s):
        if s.lock or _snap_busy(s):
            return False
        return s.device_id is not None if tier == "device" else (s.host_id is not None and s.device_id is None)

    found = [(ref_snapshot_priority(strategy, n, s), n.node_id) for n, s in tree.snapshots() if ok(s)]
    return [nid for _, nid in sorted(found)]


# -- LazyHeap ----------------------------------------------------------------------------------
def test_lazy_heap_orders_rekeys_and_removes():
    h = LazyHeap()
    for item, key in (("a", (3,)), ("b", (1,)), ("c", (2,))):
        h.set(item, key)
    assert list(h.ascending()) == ["b", "c", "a"]
    h.set("b", (5,))
    h.set("c", None)
    assert list(h.ascending()) == ["a", "b"] and len(h) == 2 and "c" not in h
    for i in range(1000):              # stale entries are compacted, not accumulated
        h.set("a", (i,))
    assert len(h._heap) <= 2 * len(h) + 70
    assert list(h.ascending()) == ["b", "a"] and h.key("a") == (999,)


def test_lazy_heap_iteration_sees_changes_and_never_repeats():
    h = LazyHeap()
    for i, item in enumerate("abcd"):
        h.set(item, (i,))
    it = h.ascending(skip=lambda x: x == "b")
    assert next(it) == "a"
    h.set("a", (10,))          # re-keyed after being yielded: not yielded again
    h.set("e", (0,))           # entered during the iteration: yielded in its place
    assert list(it) == ["e", "c", "d"]
    assert list(h.ascending()) == ["e", "b", "c", "d", "a"]   # "b" was only passed over


def test_lazy_heap_survives_an_abandoned_iteration():
    h = LazyHeap()
    for i, item in enumerate("abc"):
        h.set(item, (i,))
    it = h.ascending()
    assert next(it) == "a" and next(it) == "b"   # 'it' stays alive, never finished
    assert list(h.ascending()) == ["a", "b", "c"]
    assert list(it) == ["c"]


# -- exact orders ------------------------------------------------------------------------------
def test_dead_tails_go_first_then_strategy_then_node_id():
    t = RadixTree(P, needs_snapshots=True)
    a = t.insert(toks(1), ids(1)).last
    b = t.insert(toks(2), ids(2)).last
    c = t.insert(toks(3), ids(3)).last
    a.snapshot = Snapshot(device_id=0)
    c.snapshot = Snapshot(device_id=1)
    t.touch(t.walk(toks(2), 1))                 # b is the most recent, but dead
    assert [n.node_id for n in device_victims(t, LRU())] == [b.node_id, a.node_id, c.node_id]
    t.touch(t.walk(toks(1), 1))
    assert [n.node_id for n in device_victims(t, LRU())] == [b.node_id, c.node_id, a.node_id]
    b.snapshot = Snapshot(device_id=2)          # now alive: back in LRU place (c 3, b 4, a 5)
    assert [n.node_id for n in device_victims(t, LRU())] == [c.node_id, b.node_id, a.node_id]


def test_value_ranks_intermediate_snapshots_first_and_branch_points_last():
    t = RadixTree(P, needs_snapshots=True)
    a = t.insert(toks(1, 2), ids(10, 11)).last       # a conversation: turn 1 ends at a
    a.snapshot = Snapshot(device_id=0, last_access=t.tick())
    b = t.insert(toks(1, 2, 3), ids(10, 11, 12)).last    # turn 2 resumes at a and ends at b
    b.snapshot = Snapshot(device_id=1, last_access=t.tick())
    c = t.insert(toks(7), ids(13)).last         # another conversation, older than b
    c.snapshot = Snapshot(device_id=2, last_access=t.tick())
    a.snapshot.last_access = t.tick()            # recency alone would now keep a over c
    b.snapshot.last_access = t.tick()
    order = lambda: [n.node_id for n, _ in snapshot_victims(t, Value(), "device")]
    assert a.snapshots_below == 1 and b.snapshots_below == 0
    assert order() == [a.node_id, c.node_id, b.node_id]    # a is intermediate: first, though newer than c
    d = t.insert(toks(1, 2, 9), ids(10, 11, 14)).last     # a second request diverges at a: a branch point
    assert len(a.children) == 2
    assert order() == [c.node_id, b.node_id, a.node_id]    # a branch point goes last, b newer though it is
    t.remove_subtree(d)                             # the other branch goes: a is a former branch
    assert a.forked and order() == [c.node_id, a.node_id, b.node_id]   # point, ranked by recency
    b.snapshot = None                               # the deeper snapshot goes: a is the newest turn
    assert a.snapshots_below == 0
    assert order() == [c.node_id, a.node_id]
    t.check_integrity()


def test_busy_nodes_leave_the_order_and_come_back():
    t = RadixTree(P, needs_snapshots=True)
    a = t.insert(toks(1), ids(1)).last
    b = t.insert(toks(2), ids(2)).last
    a.snapshot = Snapshot(device_id=0)
    b.snapshot = Snapshot(device_id=1)
    order = [a.node_id, b.node_id]
    for field in ("backup_pending", "put_pending", "loading"):
        setattr(a.snapshot, field, True)
        assert [n.node_id for n in device_victims(t, LRU())] == [b.node_id]
        setattr(a.snapshot, field, False)
        assert [n.node_id for n in device_victims(t, LRU())] == order
    a.load_ticket = object()
    assert [n.node_id for n in device_victims(t, LRU())] == [b.node_id]
    a.load_ticket = None
    a.backup_pending = 1
    assert [n.node_id for n in device_victims(t, LRU())] == [b.node_id]
    a.backup_pending = 0
    assert [n.node_id for n in device_victims(t, LRU())] == order


def test_host_order_leaves_out_locked_snapshots_and_parents_join_after_children():
    t = RadixTree(P)
    a = t.insert(toks(1), ids(1)).last
    b = t.insert(toks(1, 2), ids(1, 2)).last
    c = t.insert(toks(3), ids(3)).last
    for n, h in ((a, 7), (b, 8), (c, 9)):
        n.host_ids, n.device_ids = ids(h), None
    b.snapshot = Snapshot(host_id=4)
    b.snapshot.lock = 1
    assert [n.node_id for n in host_victims(t, LRU())] == [c.node_id]
    b.snapshot.lock = 0
    got = []
    for n in host_victims(t, LRU()):
        got.append(n.node_id)
        if n is b:
            b.snapshot = None
            t.remove_subtree(b)
    # b (access 2) first though c (3) is older than nothing; a (1) joins once b is gone and,
    # being the oldest, comes before c
    assert got == [b.node_id, a.node_id, c.node_id]


# -- random sequences against the reference ------------------------------------------------------
OPS = st.lists(st.tuples(st.sampled_from(["insert", "insert", "touch", "lock", "unlock", "backup", "shadow",
                                          "shadow", "shadow", "ticket", "snap", "snap", "snapflag", "snapuse", "snapuse", "snaplock",
                                          "evict_device", "evict_device", "evict_host", "evict_host", "evict_snap",
                                          "split"]),
                         st.lists(st.integers(0, 3), min_size=1, max_size=5), st.integers(0, 1000)),
               min_size=5, max_size=50)
SEQS = st.lists(st.lists(st.integers(0, 3), min_size=1, max_size=6), min_size=2, max_size=12)


def _pick(tree, r):
    nodes = list(tree.nodes())
    return nodes[r % len(nodes)] if nodes else None


def _check(tree, strategies):
    for strategy in strategies:
        order = tree.eviction_order(strategy)
        assert [n.node_id for n in order.device_victims()] == ref_device(tree, strategy)
        assert [n.node_id for n in order.host_victims()] == ref_host(tree, strategy)
        for tier in ("device", "host"):
            assert [n.node_id for n, _ in order.snapshot_victims(tier)] == ref_snapshots(tree, strategy, tier)
    tree.check_integrity()


def _pinned(tree, node):
    return tree.subtree_pinned(node, busy=lambda n: n.snapshot is not None and n.snapshot.lock > 0)


def _evict_device(tree, strategy, k):
    """Evict up to k device victims the way the cache does, checking each against the
    reference minimum over what is eligible and not yet yielded in this pass."""
    yielded = set()
    for node in device_victims(tree, strategy):
        expect = [i for i in ref_device(tree, strategy) if i not in yielded]
        assert expect and node.node_id == expect[0]
        yielded.add(node.node_id)
        if k <= 0:
            break
        k -= 1
        if node.on_host:
            node.device_ids = None                       # demote
        elif not _pinned(tree, node):
            node.device_ids = None
            tree.remove_subtree(node)                    # drop with its shadow subtree
        # else: it stays (something reads the subtree) and is not offered again


def _publish(tree, pages, new_ids):
    """Publish ``pages`` the way the cache does: from the deepest device node on the path."""
    path = tree.walk(toks(*pages), len(pages))
    rp = tree.resume_point(path, device_only=True)
    start = tree.node_at(path, rp.pages)
    return tree.insert(toks(*pages), new_ids(len(pages) - rp.pages), start=start).last


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(seqs=SEQS, ops=OPS, state=st.booleans(), lfu=st.booleans())
def test_incremental_order_matches_a_fresh_scan(seqs, ops, state, lfu):
    tree = RadixTree(P, needs_snapshots=state)
    strategies = [LFU() if lfu else LRU(), LRU(), Value(), get_strategy("reuse"), get_strategy("reuse-prompt"),
                  get_strategy("probation")]
    next_id = [100]
    locked: list = []

    def new_ids(n):
        next_id[0] += n
        return np.arange(next_id[0] - n, next_id[0], dtype=np.int64)

    _check(tree, strategies)   # orders exist from the start: every change goes through them
    for i, pages in enumerate(seqs):   # a starting tree: published requests, every other with a snapshot
        last = _publish(tree, pages, new_ids)
        if i % 2 and last.parent is not None:
            last.snapshot = Snapshot(device_id=i, last_access=tree.tick())
    _check(tree, strategies)
    for op, pages, r in ops:
        node = _pick(tree, r)
        if op == "insert":
            _publish(tree, pages, new_ids)
        elif op == "touch":
            tree.touch(tree.walk(toks(*pages), len(pages)), hit=bool(r % 2))
        elif op == "lock" and node is not None:
            tree.lock(node)
            locked.append(node)
        elif op == "unlock" and locked:
            tree.lock(locked.pop(r % len(locked)), -1)
        elif op == "backup" and node is not None:
            node.backup_pending = 1 - min(node.backup_pending, 1)
        elif op == "shadow" and node is not None and node.on_device:
            while any(c.on_device for c in node.children.values()):   # down to a device leaf
                node = next(c for c in node.children.values() if c.on_device)
            if not node.on_host:
                node.host_ids = new_ids(node.num_pages)          # backed up
            if node.lock_device == 0 and r % 3:
                node.device_ids = None                           # and demoted
        elif op == "ticket" and node is not None and node.on_device:
            node.load_ticket = None if node.load_ticket is not None else object()
        elif op == "snap" and node is not None:
            node.snapshot = None if node.snapshot is not None and r % 3 == 0 else Snapshot(
                device_id=r if r % 2 else None, host_id=None if r % 2 else r, last_access=tree.tick())
        elif op == "snapflag" and node is not None and node.snapshot is not None:
            field = ("backup_pending", "put_pending", "loading", "last_access", "resumed", "passed", "kind")[r % 7]
            if field == "last_access":
                value: object = tree.tick()
            elif field in ("resumed", "passed"):
                value = getattr(node.snapshot, field) + 1        # what a lease's lookup writes
            elif field == "kind":
                value = "finish" if node.snapshot.kind != "finish" else "prompt_end"
            else:
                value = not getattr(node.snapshot, field)
            setattr(node.snapshot, field, value)
        elif op == "snapuse" and node is not None and node.snapshot is not None:
            # what a lease's lookup writes (resumed here / passed on the way deeper), what an
            # expect writes (a queued request resumes here), or a kind
            field = ("resumed", "passed", "kind", "expected")[r % 4]
            value = {"kind": "finish", "expected": True}.get(field)
            setattr(node.snapshot, field, getattr(node.snapshot, field) + 1 if value is None else value)
        elif op == "snaplock" and node is not None and node.snapshot is not None:
            node.snapshot.lock = 1 - min(node.snapshot.lock, 1)
        elif op == "evict_device":
            _evict_device(tree, strategies[0], r % 4)
        elif op == "evict_host":
            for victim in host_victims(tree, strategies[0]):
                if not _pinned(tree, victim):
                    tree.remove_subtree(victim)
                break
        elif op == "evict_snap":
            for _, snap in snapshot_victims(tree, strategies[0], "device" if r % 2 else "host"):
                if snap.device_id is not None and snap.host_id is not None:
                    snap.device_id = None
                else:
                    snap._node.snapshot = None
                break
        elif op == "split" and node is not None and node.num_pages > 1:
            tree.split(node, 1 + r % (node.num_pages - 1))
        locked = [n for n in locked if n.parent is not None]
        _check(tree, strategies)


def test_the_reuse_rules_rank_by_what_requests_were_seen_to_use():
    """reuse: a snapshot the chain moved past (resumed from or passed, a deeper one below on
    its only path) goes before an older one that is the end of its path; reuse-prompt also
    puts a decode's end that no request used first. The order follows each observation."""
    tree = RadixTree(P, needs_snapshots=True)
    reuse, prompt = get_strategy("reuse"), get_strategy("reuse-prompt")
    old = tree.insert(toks(7), ids(0)).last                      # another chain, the oldest
    old.snapshot = Snapshot(device_id=0, last_access=tree.tick())
    a = tree.insert(toks(1, 2), ids(1, 2)).last
    a.snapshot = Snapshot(device_id=1, last_access=tree.tick(), kind="prompt_end")
    b = tree.insert(toks(1, 2, 3), ids(3), start=a).last
    b.snapshot = Snapshot(device_id=2, last_access=tree.tick(), kind="finish")
    victims = lambda s: [n.node_id for n, _ in snapshot_victims(tree, s, "device")]  # noqa: E731
    assert victims(reuse) == [old.node_id, a.node_id, b.node_id]        # nothing used: recency
    assert victims(prompt) == [b.node_id, old.node_id, a.node_id]       # an idle decode end first
    a.snapshot.passed += 1                                              # a request went on past a
    assert victims(reuse) == [a.node_id, old.node_id, b.node_id]
    assert victims(prompt)[:2] == [a.node_id, b.node_id] or victims(prompt)[:2] == [b.node_id, a.node_id]
    b.snapshot.resumed += 1                                             # the decode's end was used
    assert victims(prompt) == [a.node_id, old.node_id, b.node_id]
    tree.check_integrity()


def test_a_decode_end_a_queued_request_will_resume_from_is_not_idle():
    """An overloaded engine queues a conversation's next turn behind the one that decoded it;
    ``HiCache.expect`` marks the turn's resume snapshot ``expected``, so the idle-tail rule
    (and probation's) no longer puts it first: recency alone ranks it, as under LRU."""
    tree = RadixTree(P, needs_snapshots=True)
    prompt, probation = get_strategy("reuse-prompt"), get_strategy("probation")
    old = tree.insert(toks(7), ids(0)).last
    old.snapshot = Snapshot(device_id=0, last_access=tree.tick(), kind="prompt_end")
    b = tree.insert(toks(1, 2, 3), ids(1, 2, 3)).last
    b.snapshot = Snapshot(device_id=1, last_access=tree.tick(), kind="finish")
    victims = lambda s: [n.node_id for n, _ in snapshot_victims(tree, s, "device")]  # noqa: E731
    assert victims(prompt) == [b.node_id, old.node_id]      # an idle decode end first
    assert victims(probation) == [b.node_id, old.node_id]
    b.snapshot.expected = True                               # a queued turn resumes there
    assert victims(prompt) == [old.node_id, b.node_id] and victims(probation) == [old.node_id, b.node_id]
    tree.check_integrity()
