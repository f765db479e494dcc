"""Ghost caches (hicache.tree.ghost): metadata-only replicas fed the cache's events."""

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from hicache.tree import CANDIDATES, LRU, Ranked, Value, get_strategy
from hicache.tree.ghost import GhostCache


def serve(g: GhostCache, req: object, keys: list, kind: str | None = "prompt_end") -> int:
    """One request as the engine makes it: lookup, publish its pages (and a snapshot, unless
    ``kind`` is None), release."""
    hit = g.lookup(req, keys)
    g.publish(req, keys, kind or "prefill", kind is not None)
    g.release(req)
    g.check()
    return hit


def test_hits_stop_at_the_deepest_snapshot_and_the_least_recent_leaf_goes_first():
    g = GhostCache(LRU(), capacity_units=6, snapshot_units=1)
    assert serve(g, "a", [1, 2]) == 0          # 2 pages + its end snapshot: 3 units
    assert serve(g, "b", [3, 4]) == 0          # 6 units: full
    assert serve(g, "c", [1, 2]) == 2          # resumes at its snapshot
    assert serve(g, "d", [5, 6]) == 0          # 9 units: (3, 4) is least recent, goes leaf by leaf
    assert sorted(g.nodes) == [1, 2, 5, 6] and g.used == 6
    assert g.evicted_pages == 2 and g.evicted_snapshots == 1


def test_a_dead_leaf_goes_before_any_live_one_then_the_least_recent():
    g = GhostCache(LRU(), capacity_units=9, snapshot_units=1)
    serve(g, "a", [1, 2])                       # 3 units
    serve(g, "b", [3, 4])                       # 6
    g.publish("e", [3, 4, 7], "prefill", False)             # 7: no snapshot at 7, a dead leaf once released
                                                # (publishing through b's chain counts as using it)
    g.release("e")
    serve(g, "f", [8])                          # 9: full
    serve(g, "g", [9])                          # 11: two units go
    assert 7 not in g.nodes                     # the dead leaf first, though newer than a's chain
    assert 2 not in g.nodes and 1 in g.nodes    # then the least recent leaf, 2, with its snapshot
    assert g.nodes[4].snapshot is not None and g.used == 8


def test_a_publish_holds_and_touches_cached_pages_past_its_resume_point():
    """Pages already cached below the resume point (their snapshot went) are the request's
    own once it publishes through them: pinned, touched, never its own publish's victims
    (hypothesis found the ghost evicting them)."""
    g = GhostCache(LRU(), capacity_units=4, snapshot_units=2)
    assert g.lookup("r", [5]) == 0
    g.publish("x", [300, 301, 302], "prefill", False)   # cached with no snapshot: resumable nowhere
    g.release("x")
    g.publish("r", [300, 301, 302], "prefill", True)     # 3 pages + a snapshot: over capacity
    assert all(k in g.nodes for k in (300, 301, 302)) and g.nodes[302].snapshot is not None
    g.release("r")
    g.check()


def test_a_running_request_pins_its_path_and_its_two_snapshots_only():
    g = GhostCache(LRU(), capacity_units=8, snapshot_units=1)
    serve(g, "a", [1])                          # 2 units, snapshot at 1
    assert g.lookup("r", [1, 2, 3]) == 1        # resumes at 1: its path and that snapshot pinned
    serve(g, "b", [9])                          # 4 units
    g.publish("r", [1], "prefill", True)        # nothing new: still its resume point
    g.publish("r", [1, 2], "prefill", True)     # 6: past it (its engine has read it), 2's is the newest
    g.publish("r", [1, 2, 3], "prompt_end", True)   # 8: the newest is 3's now
    serve(g, "c", [10])                         # 10: two units go, the least recent unpinned:
    assert 9 not in g.nodes                     # b's leaf with its snapshot (older than 1's touch)
    serve(g, "d", [11])                         # 10 again: now 1's snapshot (no longer held), not a page
    assert g.nodes[1].snapshot is None and g.nodes[3].snapshot is not None
    assert g.nodes[2].snapshot is None          # ... and 2's (free since 3's was published): both older
    assert all(k in g.nodes for k in (1, 2, 3)) and g.used == 8
    g.release("r")
    serve(g, "e", [12])                         # 10: r's pages may go now, its dead leaves first
    assert g.used <= 8


def test_a_publish_makes_its_room_before_it_lets_go_of_the_snapshots_it_held():
    """A reasoning turn: the decode's pages were allocated while the prompt's end was the
    request's newest snapshot, so the room they take never came out of that snapshot --
    the point the next turn resumes from. (Let go first, it was the ghost's victim at every
    finish while the cache kept it: a mix's reasoning turns hit 22% less in the LRU ghost
    than in `--eviction lru`.)"""
    g = GhostCache(LRU(), capacity_units=10, snapshot_units=1)
    assert g.lookup("t0", [1, 2]) == 0
    g.publish("t0", [1, 2], "prompt_end", True)         # 3 units, 2's snapshot its newest
    serve(g, "x", [30, 31])                             # 6 units, all newer than 2's snapshot
    g.publish("t0", [1, 2, 3, 4, 5, 6], "finish", True)  # 11: one unit must go
    g.release("t0")
    assert 31 not in g.nodes and 30 in g.nodes          # x's leaf (with its snapshot), not 2's
    assert g.nodes[2].snapshot is not None and g.used == 9
    assert g.lookup("t1", [1, 2, 7]) == 2               # the next turn resumes at the prompt's end
    g.release("t1")
    g.check()


def test_what_a_publish_let_go_goes_when_nothing_else_can():
    g = GhostCache(LRU(), capacity_units=5, snapshot_units=1)
    assert g.lookup("t0", [1, 2]) == 0
    g.publish("t0", [1, 2], "prompt_end", True)         # 3 units
    g.publish("t0", [1, 2, 3, 4], "finish", True)       # 6: everything else is the request's own
    assert g.nodes[2].snapshot is None and g.nodes[4].snapshot is not None and g.used == 5
    g.release("t0")
    g.check()


def test_a_ghost_leaves_a_snapshot_where_a_prompt_leaves_its_own_history():
    """The engine snapshots a fork its tree shows (MatchResult.branch_tokens); a ghost
    takes the forks of its own tree, whatever the real cache offered."""
    g = GhostCache(LRU(), capacity_units=100, snapshot_units=1)
    assert serve(g, "a", [1, 2, 3, 4]) == 0            # a snapshot at 4 only
    assert g.lookup("b", [1, 2, 7, 8]) == 0            # leaves the history at 2: its fork
    g.publish("b", [1, 2, 7, 8], "prompt_end", True)
    g.release("b")
    assert g.nodes[2].snapshot is not None and g.nodes[2].snapshot.kind == "branch"
    assert serve(g, "c", [1, 2, 9, 10]) == 2            # the next task resumes at the fork
    assert g.nodes[1].snapshot is None                  # nowhere else
    # no fork past the prompt's last whole page, or where the walk ends at the resume point
    h = GhostCache(LRU(), capacity_units=100, snapshot_units=1)
    serve(h, "a", [1, 2, 3, 4])
    assert h.lookup("d", [1, 2, 3], prompt_pages=3) == 0   # history 3 = the prompt's pages
    h.publish("d", [1, 2, 3], "prompt_end", True)
    h.release("d")
    assert h.nodes[2].snapshot is None
    h.check()
    # without state every page is a resume point: no fork to keep
    s = GhostCache(LRU(), capacity_units=100, snapshot_units=0, stateless=True)
    serve(s, "a", [1, 2, 3, 4], kind=None)
    assert serve(s, "b", [1, 2, 7, 8], kind=None) == 2 and s.nodes[2].snapshot is None


def test_superseded_first_gives_up_a_snapshot_the_chain_has_moved_past():
    # conversation A: turn 0 publishes a snapshot at 2; turn 1 resumes there and goes on to
    # 4. A's snapshot at 2 is superseded; B's (older, never resumed) is not.
    for strategy, gone in ((LRU(), "B"), (Ranked("s", superseded_first=True), "A2")):
        g = GhostCache(strategy, capacity_units=13, snapshot_units=2)
        serve(g, "b0", [21, 22])                # B: 2 + 2
        serve(g, "a0", [1, 2])                  # A: 2 + 2
        assert serve(g, "a1", [1, 2, 3, 4]) == 2    # 2 + 2 more = 12
        serve(g, "c0", [31])                    # 15: 2 units must go
        if gone == "B":                         # lru: B's leaf and snapshot, oldest
            assert 22 not in g.nodes and g.nodes[2].snapshot is not None
        else:                                   # A's superseded snapshot, B untouched
            assert g.nodes[2].snapshot is None and g.nodes[22].snapshot is not None
            assert g.nodes[2].snapshot is None and g.nodes[4].snapshot.kind == "prompt_end"


def test_idle_tails_go_first_until_a_request_resumes_from_or_passes_them():
    # A's decode tail was resumed from (A's next turn came back); B's, newer, never was.
    for name, gone in (("lru", 3), ("reuse-prompt", 13)):
        g = GhostCache(get_strategy(name), capacity_units=10, snapshot_units=2)
        serve(g, "a", [1, 2, 3], kind="finish")         # 5 units
        assert g.lookup("a2", [1, 2, 3, 4]) == 3         # resumes at A's decode end
        g.release("a2")
        serve(g, "b", [11, 12, 13], kind="finish")      # 10: full
        serve(g, "x", [31])                              # 13: three units go
        kept = 13 if gone == 3 else 3
        assert gone not in g.nodes                       # its snapshot, then its page (dead by then)
        assert g.nodes[kept].snapshot is not None and g.used == 10
    assert g.nodes[3].snapshot.resumed == 1 and g.nodes[3].snapshot.kind == "finish"


def test_an_expected_decode_end_is_not_idle_in_the_ghost_as_in_the_cache():
    # As HiCache.expect does in the real tree: a queued request's resume snapshot is marked
    # expected, and the idle-tail rule no longer puts it first; an idle one beside it stays first.
    s = get_strategy("reuse-prompt")
    g = GhostCache(s, capacity_units=40, snapshot_units=2)
    serve(g, "a", [1, 2, 3], kind="finish")
    serve(g, "b", [11, 12, 13], kind="finish")
    assert s.first_class(g.nodes[3], g.nodes[3].snapshot) and s.first_class(g.nodes[13], g.nodes[13].snapshot)
    g.expect([1, 2, 3, 4])
    assert g.nodes[3].snapshot.expected and not g.nodes[3].snapshot.resumed
    assert not s.first_class(g.nodes[3], g.nodes[3].snapshot)
    assert s.first_class(g.nodes[13], g.nodes[13].snapshot) and not g.nodes[13].snapshot.expected
    g.check()


def test_a_decode_below_a_resumed_snapshot_does_not_supersede_it():
    # Two requests with the same prompt [1, 2]: the second resumes at the first's prompt end,
    # and each leaves a decode's tail (with its idle snapshot) below it. No request has gone
    # on past 2, so the snapshot there is the one the next such request needs: not first.
    # Only once a prompt continues through 2 to a deeper snapshot is it superseded.
    s = get_strategy("reuse-prompt")
    g = GhostCache(s, capacity_units=40, snapshot_units=2)
    g.lookup("a", [1, 2], prompt_pages=2)
    g.publish("a", [1, 2], "prompt_end")
    g.publish("a", [1, 2, 7], "finish")
    g.release("a")
    assert g.lookup("b", [1, 2], prompt_pages=2) == 2
    g.publish("b", [1, 2, 8], "finish")
    g.release("b")
    p = g.nodes[2]
    assert p.snapshot.resumed == 1 and p.snapshots_below == 2 and p.branches == 0
    assert not s.first_class(p, p.snapshot)             # the decodes below are not the chain moving on
    assert s.first_class(g.nodes[7], g.nodes[7].snapshot)   # an idle decode's end is
    assert g.lookup("c", [1, 2, 3, 4], prompt_pages=4) == 2
    g.publish("c", [1, 2, 3, 4], "prompt_end")
    g.release("c")
    assert p.branches == 1 and s.first_class(p, p.snapshot)   # now it is superseded
    g.check()


def test_probation_gives_up_what_was_never_reused_before_what_was():
    # A (older) was resumed from once; B (newer) never was. LRU evicts A first, probation B.
    for name, gone, kept in (("lru", 2, 12), ("probation", 12, 2)):
        s = get_strategy(name)
        g = GhostCache(s, capacity_units=9, snapshot_units=1)
        serve(g, "a", [1, 2])                       # 3 units
        assert g.lookup("a2", [1, 2, 3]) == 2       # A's chain reused
        g.release("a2")
        serve(g, "b", [11, 12])                     # 6 units
        serve(g, "c", [21])                         # 8 units, c newest
        serve(g, "d", [31])                         # 10: one page and one snapshot must go
        assert gone not in g.nodes and kept in g.nodes, name
        g.check()
    assert not s.first_class(g.nodes[2], g.nodes[2].snapshot)   # ranks early, still worth a host copy


def test_forks_last_keeps_a_branch_points_snapshot_over_every_leaf():
    g = GhostCache(get_strategy("reuse"), capacity_units=12, snapshot_units=1)
    serve(g, "s", [1, 2])                       # a shared prefix, snapshot at 2
    serve(g, "a", [1, 2, 3])
    serve(g, "b", [1, 2, 4])                    # 2 is a branch point now
    assert g.nodes[2].forked and len(g.nodes[2].children) == 2
    for i, k in enumerate((9, 8, 7)):
        serve(g, f"x{i}", [k])
    assert g.nodes[2].snapshot is not None and 3 not in g.nodes


def test_a_layout_without_state_resumes_at_any_page():
    g = GhostCache(LRU(), capacity_units=4, snapshot_units=0, stateless=True)
    g.publish("a", [1, 2, 3], "prefill", False)
    g.release("a")
    assert g.lookup("b", [1, 2, 9]) == 2 and g.used == 3
    g.release("b")
    g.check()


def _reference_victim(g: GhostCache):
    """The victim by a full scan (what the heaps must agree with)."""
    best = None
    for node in g.nodes.values():
        if not node.children and not node.pins:
            key = ((g.stateless or node.snapshot is not None, g.strategy.node_priority(node)), 0)
            if best is None or key[0] < best[0][0]:
                best = (key, node, False)
        if node.snapshot is not None and not node.spins and not g.stateless:
            key = ((True, g.strategy.snapshot_priority(node, node.snapshot)), 1)
            if best is None or key[0] < best[0][0]:
                best = (key, node, True)
    return best


OPS = st.lists(st.tuples(st.sampled_from(["lookup", "publish", "expect", "release"]),
                         st.integers(0, 5), st.integers(0, 3), st.integers(1, 6),
                         st.sampled_from([None, "prefill", "prompt_end", "finish", "branch"])),
               min_size=1, max_size=60)


@settings(max_examples=150, deadline=None)
@given(OPS, st.sampled_from(["lru", "value", "reuse", "reuse-prompt"]), st.integers(4, 30))
def test_random_events_keep_the_ghost_consistent(ops, name, capacity):
    strategy = Value() if name == "value" else get_strategy(name)
    g = GhostCache(strategy, capacity_units=capacity, snapshot_units=2)
    prefixes = {b: [b * 100 + i for i in range(8)] for b in range(4)}
    for op, req, branch, depth, kind in ops:
        keys = prefixes[branch][:depth]
        if op == "lookup":
            hit = g.lookup(req, keys)
            assert 0 <= hit <= depth
            assert hit == 0 or g.nodes[keys[hit - 1]].snapshot is not None
        elif op == "publish":
            g.publish(req, keys, kind or "prefill", kind is not None)
            assert all(k in g.nodes for k in keys)          # a publish never evicts its own pages
            assert kind is None or g.nodes[keys[-1]].snapshot is not None
            # a publish evicts until the ghost fits, or until only pinned things are left
            assert g.used <= capacity or _reference_victim(g) is None
        elif op == "expect":
            g.expect(keys)
        else:
            g.release(req)
        g.check()
    for req in range(6):
        g.release(req)
    g.check()
    assert all(n.pins == 0 and n.spins == 0 for n in g.nodes.values())


def _state(g: GhostCache) -> tuple:
    """Everything a ghost holds that decides its next hits and victims."""
    nodes = {k: (n.parent.key if n.parent is not None else None, sorted(n.children), n.depth, n.last_access,
                 n.hit_count, n.forked, n.decoded, n.branches, n.snapshots_below, n.pins, n.spins,
                 None if n.snapshot is None else (n.snapshot.last_access, n.snapshot.kind, n.snapshot.resumed,
                                                  n.snapshot.passed, n.snapshot.expected))
             for k, n in g.nodes.items()}
    held = {r: [n.key for n in ns] for r, ns in g._held.items()}
    snap_held = {r: [None if n is None else n.key for n in ns] for r, ns in g._snap_held.items()}
    return nodes, g.used, g.clock, held, snap_held, g._prompt, g._fork


@settings(max_examples=100, deadline=None)
@given(OPS, OPS, st.sampled_from(["lru", "value", "reuse", "probation"]), st.integers(4, 30))
def test_a_clone_is_the_ghost_switched_to_another_order_now(before, after, name, capacity):
    """The selector's trial: a clone taken mid-run, ranking by another strategy, holds and
    hits exactly what the ghost itself would had it been reordered at that moment -- and
    the original is untouched by the clone's events."""
    strategy = Value() if name == "value" else get_strategy(name)
    g = GhostCache(LRU(), capacity_units=capacity, snapshot_units=2)
    prefixes = {b: [b * 100 + i for i in range(8)] for b in range(4)}

    def play(ghost: GhostCache, ops) -> list:
        seen = []
        for op, req, branch, depth, kind in ops:
            keys = prefixes[branch][:depth]
            if op == "lookup":
                seen.append(ghost.lookup(req, keys))
            elif op == "publish":
                ghost.publish(req, keys, kind or "prefill", kind is not None)
            elif op == "expect":
                ghost.expect(keys)
            else:
                ghost.release(req)
            ghost.check()
        return seen

    play(g, before)
    frozen = _state(g)
    twin = g.clone(strategy)
    twin.check()
    assert _state(twin) == frozen and twin.strategy is strategy
    twin_hits = play(twin, after)
    assert _state(g) == frozen                   # the clone shares no node with the original
    g.reorder(strategy)
    assert play(g, after) == twin_hits and _state(g) == _state(twin)


def test_eviction_takes_the_smallest_key_a_full_scan_finds():
    rng = np.random.default_rng(3)
    for name in ("lru", "value", "reuse", "reuse-prompt"):
        strategy = Value() if name == "value" else get_strategy(name)
        g = GhostCache(strategy, capacity_units=25, snapshot_units=3)
        for step in range(400):
            conv = int(rng.integers(8))
            keys = [conv * 1000 + i for i in range(int(rng.integers(1, 10)))]
            req = step
            g.lookup(req, keys)
            g.release(req)
            # the next victim, if the ghost has to evict now, is the scan's smallest
            expected = _reference_victim(g)
            before = dict(g.nodes)
            snaps = {k: n.snapshot for k, n in g.nodes.items()}
            g.capacity, cap = g.used - 0.5, g.capacity
            g._evict()
            g.capacity = cap
            if expected is not None:
                _, node, is_snap = expected
                if is_snap:
                    assert snaps[node.key] is not None and (node.key not in g.nodes or g.nodes[node.key].snapshot is None)
                else:
                    assert node.key in before and node.key not in g.nodes
            g.publish(req, keys, str(rng.choice(["prompt_end", "finish", "prefill"])), True)
            g.release(req)
            g.check()


def test_the_named_candidates_are_ranked_strategies():
    for name, flags in CANDIDATES.items():
        s = get_strategy(name)
        assert isinstance(s, Ranked) and s.name == name
        assert all(getattr(s, k) == v for k, v in flags.items())


def test_a_publish_off_the_path_a_request_holds_keeps_its_pages():
    """Hypothesis found it: request 0 holds [0, 1] (two pages deep) and publishes [100], one
    page deep on another branch; the ghost took it as already held (depth 1 <= 2) and evicted
    the page the request had just published."""
    g = GhostCache(get_strategy("lru"), capacity_units=4, snapshot_units=2)
    g.lookup(0, [0])
    g.publish(0, [0, 1], "prefill", True)
    g.publish(1, [100], "prefill", False)
    g.release(1)
    g.publish(0, [100], "prefill", False)
    assert 100 in g.nodes and g.nodes[100].pins == 1
    g.release(0)
    assert g.nodes[100].pins == 0
    g.check()


def test_without_state_a_decodes_idle_pages_go_first_under_the_tail_rules():
    # A stateless ghost ranks as the real tree does: reuse-prompt (and probation) put a
    # decode's pages no request went through first; lru takes the oldest leaf.
    for name, gone in (("lru", 21), ("reuse-prompt", 3), ("probation", 3)):
        g = GhostCache(get_strategy(name, stateless=True), capacity_units=4, snapshot_units=0, stateless=True)
        serve(g, "p", [21], kind=None)                  # an older prompt page
        assert g.lookup("a", [1, 2]) == 0
        g.publish("a", [1, 2, 3], "finish", False)      # page 3 is the decode's
        g.release("a")
        assert g.nodes[3].decoded and not g.nodes[21].decoded
        serve(g, "x", [31], kind=None)                  # 5 pages: one goes
        assert gone not in g.nodes and g.used == 4
        g.check()


def test_the_decoded_rule_is_for_layouts_without_state_only():
    assert get_strategy("reuse-prompt", stateless=True).decoded_first
    assert get_strategy("probation", stateless=True).decoded_first
    assert not get_strategy("reuse-prompt").decoded_first          # the snapshot rule does it there
    assert not get_strategy("reuse", stateless=True).decoded_first  # no idle_tails_first
