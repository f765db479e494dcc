"""Ghost caches and the depth tuner (hicache.tree.ghost)."""

import numpy as np
import pytest

from hicache.tree.ghost import DepthTuner, GhostCache, page_keys


def test_hits_stop_at_the_deepest_snapshot_and_lru_leaves_go_first():
    g = GhostCache(capacity_units=6, snapshot_units=1, weight=0)
    assert g.step([1, 2]) == 0          # 2 pages + its end snapshot: 3 units
    assert g.step([3, 4]) == 0          # 6 units: full
    assert g.step([1, 2]) == 2          # resumes at its snapshot
    assert g.step([5, 6]) == 0          # 9 units: the least recent leaf (3, 4) goes whole
    assert sorted(g.pages) == [1, 2, 5, 6]
    assert g.used == 6
    assert g.step([1, 2, 7]) == 2       # 8 units; its own pages are protected: (5, 6) goes
    assert sorted(g.pages) == [1, 2, 7] and g.used == 5
    # the snapshot at 2 is now intermediate (one child, a deeper one at 7): the next
    # request's room comes from it before any live leaf
    assert g.step([9]) == 0
    assert not g.pages[2].snap and g.pages[7].snap and 9 in g.pages
    assert g.used == 6


def test_a_branch_point_snapshot_is_never_a_victim_of_its_own():
    g = GhostCache(capacity_units=12, snapshot_units=1, weight=0)
    g.step([1, 2])                      # snapshot at 2
    g.step([1, 2, 3])                   # 2 becomes intermediate ...
    g.step([1, 2, 4])                   # ... then a branch point (two children)
    assert g.pages[2].kids == 2 and g.pages[2].snap
    g.step([9])
    g.step([8])                         # 6 pages + 5 snapshots = 11; then 13: evict
    g.step([7])
    assert g.pages[2].snap              # the leaves below went first
    assert 3 not in g.pages


def test_a_former_branch_point_snapshot_ranks_with_the_leaves_not_first():
    g = GhostCache(capacity_units=11, snapshot_units=1, weight=0)
    g.step([1, 2])                      # snapshot at 2
    g.step([1, 2, 3])
    g.step([1, 2, 4])                   # 2 is a branch point
    g.step([1, 2, 3, 5])                # 3's snapshot is intermediate
    g.step([9])                         # 6 pages + 5 snapshots = 11 units: full
    g.step([8])                         # 13: 3's snapshot goes, then the oldest leaf, 4
    assert 4 not in g.pages and not g.pages[3].snap and g.used == 11 - 1
    assert g.pages[2].forked and g.pages[2].kids == 1 and g.pages[2].snap
    assert g.step([1, 2, 3, 5]) == 4    # passes 2 (a touch), resumes at 5
    g.step([7])                         # 12: the oldest leaf (9) goes, not 2's snapshot
    assert 9 not in g.pages and g.pages[2].snap and g.used == 10


def test_a_depth_weight_keeps_a_deep_chain_over_a_newer_shallow_one():
    deep = list(range(100, 130))        # 30 pages
    for weight, survivor in ((0, "shallow"), (10, "deep")):
        g = GhostCache(capacity_units=40, snapshot_units=1, weight=weight)
        g.step(deep)
        g.step([1, 2])
        g.step([3, 4, 5, 6, 7, 8, 9])   # 31 + 3 + 8 = 42 units: one chain must go
        if survivor == "deep":
            assert deep[-1] in g.pages and 1 not in g.pages
        else:
            assert deep[-1] not in g.pages and 1 in g.pages


def test_the_tuner_follows_the_ghost_that_hit_most_in_its_window():
    rng = np.random.default_rng(0)
    weights, window = (0.0, 10.0, 30.0), 50
    tuner = DepthTuner(60, 2, weights, window)
    ghosts = [GhostCache(60, 2, w) for w in weights]
    hits: list[list[int]] = [[] for _ in weights]
    convs = {c: [1000 * c] for c in range(12)}
    for _ in range(400):
        c = int(rng.integers(12))
        convs[c] = convs[c] + [convs[c][-1] + 1 + k for k in range(int(rng.integers(1, 4)))]
        keys = convs[c]
        for g, h in zip(ghosts, hits):
            h.append(g.step(keys))
        tuner.observe(keys)
        sums = [sum(h[-window:]) for h in hits]
        best = max(range(len(weights)), key=lambda i: (sums[i], -weights[i]))
        assert tuner.weight == weights[best]


def test_page_keys_name_prefixes():
    a = np.arange(1024, dtype=np.int32)
    b = a.copy()
    b[300] = -1                          # page 1 differs
    ka, kb = page_keys(a, 256, 4), page_keys(b, 256, 4)
    assert len(ka) == 4 and ka[0] == kb[0]
    assert all(x != y for x, y in zip(ka[1:], kb[1:]))   # a changed page changes every key after it
    assert page_keys(a, 256, 0) == []


@pytest.mark.parametrize("bad", [[], [-1], ["x"], [float("inf")], "10", [True]])
def test_depth_weights_are_checked(bad):
    from hicache.config import TreeConfig
    from hicache.errors import ConfigError
    with pytest.raises(ConfigError, match="depth_weights"):
        TreeConfig(eviction="value", depth_weights=bad)


def test_a_ghost_that_never_evicts_keeps_its_heaps_small():
    g = GhostCache(capacity_units=10_000, snapshot_units=1, weight=0)
    for _ in range(2000):
        g.step([1, 2, 3])                # the same chain again and again: one live leaf
    assert len(g._leaves) + len(g._inter) + len(g._dead) <= 2 * len(g.pages) + 64


def test_used_units_stay_exact_when_keys_come_back_and_the_weight_moves():
    # A key evicted and inserted again is a new page: a heap entry left from the old one
    # must not pass for it (it once did, and the ghost's unit count drifted).
    rng = np.random.default_rng(3)
    g = GhostCache(capacity_units=30, snapshot_units=2.5, weight=0)
    for i in range(3000):
        g.weight = (0.0, 5.0)[i % 2]
        root = int(rng.integers(6))
        g.step([root * 100 + d for d in range(int(rng.integers(1, 9)))])
        assert g.used == pytest.approx(len(g.pages) + 2.5 * sum(p.snap for p in g.pages.values()))
