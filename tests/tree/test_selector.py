"""Choosing the eviction policy online (hicache.tree.selector)."""

import numpy as np
import pytest

from hicache.tree import LRU, GhostCache, PolicySelector, Ranked, get_strategy


class Never(Ranked):
    """A candidate whose ghost never hits: it evicts what was just published first."""

    def __init__(self):
        super().__init__("never")

    def node_priority(self, node):
        return (1, -node.last_access)

    def snapshot_priority(self, node, snap):
        return (0, -snap.last_access)


def turn(chains: dict, rng, i: int) -> list[int]:
    """The next request of multi-turn traffic: one of the live conversations continues by
    1-3 pages (the most recent ones likelier), or ends and a new one starts."""
    c = min(int(rng.geometric(0.35)) - 1, len(chains) - 1)
    key = list(chains)[-1 - c]
    if len(chains[key]) > 12:
        del chains[key]
        key = 1_000_000 * (i + 1)
        chains[key] = [key]
    chain = chains.pop(key)
    chain = chain + [chain[-1] + 1 + k for k in range(int(rng.integers(1, 4)))]
    chains[key] = chain            # most recent last
    return chain


def drive(sel: PolicySelector, rng, steps: int, convs: int = 6) -> list[bool]:
    chains = {c * 10_000: [c * 10_000] for c in range(convs)}
    switched = []
    for i in range(steps):
        keys = turn(chains, rng, i)
        switched.append(sel.lookup(i, keys))
        sel.publish(i, keys, "prompt_end", True)
        sel.release(i)
    return switched


def test_it_follows_the_candidate_whose_ghost_hit_most_and_counts_the_regret():
    rng = np.random.default_rng(0)
    sel = PolicySelector([Never(), LRU()], capacity_units=40, snapshot_units=2, window=40, margin=0.05)
    assert sel.strategy.name == "never"          # the first candidate until the ghosts speak
    switched = drive(sel, rng, 400)
    st = sel.stats()
    assert sel.strategy.name == "lru" and st.followed == "lru"
    assert switched.index(True) < 2 * 40 and st.switches == 1     # within two windows, once
    assert st.ghost_hit_pages["lru"] > 1.2 * st.ghost_hit_pages["never"]
    # regret: per window, the best ghost's hits less those of the candidate followed at
    # each lookup (the lookups before the switch followed "never"); the windows' best is
    # at least lru, so it is at least what following lru all along would have added
    assert st.followed_hit_pages < st.ghost_hit_pages["lru"]
    assert st.regret_pages >= st.ghost_hit_pages["lru"] - st.followed_hit_pages > 0
    assert st.regret_pages < 0.05 * st.followed_hit_pages
    assert st.lookups == 400 and st.window == 40


def test_the_margin_keeps_a_close_second_from_switching():
    rng = np.random.default_rng(1)
    twin = Ranked("lru-twin")                    # ranks exactly as LRU: the same hits
    sel = PolicySelector([LRU(), twin], capacity_units=30, snapshot_units=2, window=50, margin=0.0)
    drive(sel, rng, 300)
    assert sel.switches == 0 and sel.strategy.name == "lru"   # ties go to the earlier candidate
    st = sel.stats()
    assert st.ghost_hit_pages["lru"] == st.ghost_hit_pages["lru-twin"] and st.regret_pages == 0


def test_a_switch_needs_a_lead_larger_than_the_margin():
    rng = np.random.default_rng(2)
    lazy = PolicySelector([Never(), LRU()], capacity_units=40, snapshot_units=2, window=20, margin=1.0)
    drive(lazy, rng, 100)
    assert lazy.switches == 0 and lazy.strategy.name == "never"   # no lead exceeds every page looked up


def test_candidates_must_be_named_apart():
    with pytest.raises(AssertionError):
        PolicySelector([LRU(), LRU()], capacity_units=10, snapshot_units=1)


def test_a_ghost_following_the_selector_stays_near_the_best_candidate():
    """The floor the selector gives, on traffic where one candidate is far better than
    another: a ghost that follows the selector's choice hits within a few percent of the
    best candidate's ghost (the cost of the first window and of converging after a switch)."""
    rng = np.random.default_rng(4)
    sel = PolicySelector([Never(), get_strategy("reuse"), LRU()], capacity_units=60, snapshot_units=3,
                         window=30, margin=0.01)
    follower = GhostCache(sel.strategy, 60, 3)
    chains = {c * 10_000: [c * 10_000] for c in range(8)}
    hits = 0
    for i in range(600):
        keys = turn(chains, rng, i)
        hits += follower.lookup(i, keys)
        if sel.lookup(i, keys):
            follower.reorder(sel.strategy)
        for g in (sel, follower):
            g.publish(i, keys, "prompt_end", True)
            g.release(i)
    best = max(sel.stats().ghost_hit_pages.values())
    assert hits >= 0.95 * best and sel.strategy.name != "never"


class Scripted:
    """A stand-in ghost that resumes a scripted number of pages at each lookup: ``[(from
    lookup, hits), ...]``, each phase until the next one starts."""

    def __init__(self, phases: list[tuple[int, float]]):
        self.phases = phases
        self.i = 0

    def lookup(self, request, keys, prompt_pages=None):
        hits = [h for start, h in self.phases if start <= self.i][-1]
        self.i += 1
        return hits


def scripted(phases: list[list[tuple[int, float]]], margin: float = 0.03, margin_hits: float = 0.1,
             window: int = 10, floor: str | None = None, record_windows: int = 4) -> PolicySelector:
    """A selector over ``lru`` and candidates ``c1``, ``c2``, ... whose ghosts are scripted."""
    sel = PolicySelector([LRU(), *(Ranked(f"c{i}") for i in range(1, len(phases)))], capacity_units=10,
                         snapshot_units=1, window=window, margin=margin, margin_hits=margin_hits, floor=floor,
                         record_windows=record_windows)
    sel.ghosts = [Scripted(p) for p in phases]
    return sel


@pytest.mark.parametrize("hits, margin_hits, switches", [
    ((10, 12), 0.0, False),    # 20% more hits, 2% of the pages: under the 3% page margin
    ((10, 12), 0.1, True),     # ... but over 10% of the followed one's hits: follows
    ((10, 10.8), 0.1, False),  # 8% more hits: under both
    ((80, 82), 0.1, False),    # an 80% hit rate: the page margin (3) is the smaller, and binds
    ((80, 84), 0.1, True),     # 4% of the pages: over it
    ((0, 0.2), 0.1, False),    # a cold window: 0.2% of the pages, under the floor (0.3%)
    ((0, 0.5), 0.1, True),     # 0.5%: over it
])
def test_the_lead_a_switch_needs_is_the_smaller_of_the_page_and_hit_margins(hits, margin_hits, switches):
    sel = scripted([[(0, h)] for h in hits], margin=0.03, margin_hits=margin_hits)
    switched = [sel.lookup(i, list(range(100))) for i in range(30)]
    if not switches:
        assert not any(switched) and sel.strategy.name == "lru"
    else:   # at the lookup that fills the window (10), not before
        assert switched.index(True) == 9 and sel.switches == 1 and sel.strategy.name == "c1"


def test_no_switch_before_the_window_is_full():
    # c1 hits every page LRU misses from the first lookup: a lead of the whole window, but
    # over 1, 2, ... lookups -- too few to judge (a cold start); taken once 25 are in
    sel = scripted([[(0, 0.0)], [(0, 100.0)]], window=25)
    names = follow(sel, 40)
    assert names[:24] == ["lru"] * 24 and names[24:] == ["c1"] * 16 and sel.switches == 1


def follow(sel: PolicySelector, lookups: int) -> list[str]:
    out = []
    for i in range(lookups):
        sel.lookup(i, list(range(100)))
        out.append(sel.strategy.name)
    return out


def test_with_the_floor_a_candidate_that_falls_under_lru_is_left_at_once():
    # c1 leads by 20% for 20 lookups, then hits 1% less than LRU: its window score falls
    # under LRU's once the window (10) holds none of its leading lookups, at lookup 29.
    phases = [[(0, 10.0)], [(0, 12.0), (20, 9.9)]]
    sel = scripted(phases, floor="lru")
    names = follow(sel, 60)
    assert names[8] == "lru" and names[9] == "c1" and names[19] == "c1"   # taken once the window is full
    back = names.index("lru", 9)
    assert back == 29 and set(names[back:]) == {"lru"} and sel.switches == 2
    # ... while without the floor the deficit, inside the margin, keeps it followed for good
    assert set(follow(scripted(phases, floor=None), 60)[9:]) == {"c1"}


def test_a_candidate_under_the_floor_is_left_for_the_best_one_lately():
    # c1 falls under LRU while c2 leads LRU by 1%, under the margin: c2 is taken at once (a
    # switch is paid for either way), not LRU
    phases = [[(0, 10.0)], [(0, 12.0), (20, 9.0)], [(0, 10.0), (20, 10.1)]]
    names = follow(scripted(phases, floor="lru"), 60)
    assert names[9] == "c1"
    left = next(i for i, n in enumerate(names) if i > 9 and n != "c1")
    assert names[left] == "c2" and set(names[left:]) == {"c2"}
    # ... and LRU when it is the best itself; without the floor c1 stays (inside the margin
    # of both)
    phases[2] = [(0, 10.0), (20, 9.95)]
    assert follow(scripted(phases, floor="lru"), 60)[-1] == "lru"
    phases[1] = [(0, 12.0), (20, 9.9)]
    assert set(follow(scripted(phases, floor=None), 60)[9:]) == {"c1"}


def test_with_the_floor_a_window_lead_is_trusted_only_from_a_candidate_not_behind_lru_over_the_record():
    # c1 trails LRU by 20% for 30 lookups, then leads by 20%. Its window lead passes the
    # margin (10 pages: 10% of LRU's 100) at lookup 37, but over the record (4 windows, 40
    # lookups) it sums 204 + 4 i against LRU's 400: not behind from lookup 49, taken there.
    phases = [[(0, 10.0)], [(0, 8.0), (30, 12.0)]]
    names = follow(scripted(phases, floor="lru"), 80)
    assert names.index("c1") == 49 and set(names[49:]) == {"c1"}
    # a record of one window is the window itself: taken at 37, as without a floor
    assert follow(scripted(phases, floor="lru", record_windows=1), 80).index("c1") == 37
    assert follow(scripted(phases, floor=None), 80).index("c1") == 37


def test_a_followed_candidate_is_not_left_for_one_behind_lru_over_the_record():
    # c2 is taken at lookup 9 (a steady 15% lead); from 30 on c1 leads it by 26%, past the
    # margin at lookup 37, but c1 trailed LRU before: over the record it sums 131.5 + 6.5 i
    # against LRU's 400, so c2 is kept until 42
    phases = [[(0, 10.0)], [(0, 8.0), (30, 14.5)], [(0, 11.5)]]
    names = follow(scripted(phases, floor="lru"), 80)
    assert names[9:42] == ["c2"] * 33 and names[42:] == ["c1"] * 38
    assert follow(scripted(phases, floor="lru", record_windows=1), 80).index("c1") == 37


def test_the_floor_must_be_a_candidate():
    with pytest.raises(AssertionError):
        PolicySelector([Ranked("a"), Ranked("b")], capacity_units=10, snapshot_units=1, floor="lru")


class Listed:
    """A stand-in ghost that resumes ``hits[i]`` pages at lookup i (the last value after)."""

    def __init__(self, hits: list[float]):
        self.hits = hits
        self.i = 0

    def lookup(self, request, keys, prompt_pages=None):
        h = self.hits[min(self.i, len(self.hits) - 1)]
        self.i += 1
        return h


def listed(hits: list[list[float]], z: float, floor: str | None = "lru") -> PolicySelector:
    sel = PolicySelector([LRU(), *(Ranked(f"c{i}") for i in range(1, len(hits)))], capacity_units=10,
                         snapshot_units=1, window=10, margin=0.03, margin_hits=0.1, floor=floor, z=z)
    sel.ghosts = [Listed(h) for h in hits]
    return sel


@pytest.mark.parametrize("c1, z, taken_at", [
    ([10.0] * 5 + [40.0] + [10.0] * 50, 2.0, None),   # +30 pages in one lookup: a lumpy lead, not clear
    ([10.0] * 5 + [40.0] + [10.0] * 50, 0.0, 9),      # ... taken without the spread test
    ([13.0] * 56, 2.0, 9),                            # +30 spread over the window: clear, taken
    ([10.0] * 5 + [40.0] * 3 + [10.0] * 50, 2.0, None),   # three lookups of +30: 90 < 2 x 52
    ([10.0] * 5 + [40.0] * 5 + [10.0] * 50, 2.0, 9),      # five: 150 > 2 x 67
])
def test_a_lead_must_stand_clear_of_its_lookups_spread(c1, z, taken_at):
    names = follow(listed([[10.0] * 56, c1], z), 14)
    if taken_at is None:
        assert set(names) == {"lru"}
    else:
        assert names.index("c1") == taken_at


def test_the_floors_exit_takes_a_candidate_only_on_a_clear_lead_over_lru_across_the_record():
    # c1 leads steadily and is taken at 9, then hits 5 a lookup from 10 on: its window sum
    # goes under LRU's at 13, and the cache must leave it. c2 leads LRU by 30 pages there,
    # all made in one lookup (11): not clear of its spread, so the exit goes to LRU
    c1 = [13.0] * 10 + [5.0] * 40
    lumpy = [10.0] * 11 + [40.0] + [10.0] * 40
    names = follow(listed([[10.0] * 56, c1, lumpy], 2.0), 20)
    assert names[9:13] == ["c1"] * 4 and names[13:] == ["lru"] * 7
    # c2 a page ahead of LRU at every lookup: clear over the record, the exit takes it
    steady = [11.0] * 56
    names = follow(listed([[10.0] * 56, c1, steady], 2.0), 20)
    assert names[9:13] == ["c1"] * 4 and names[13:] == ["c2"] * 7
    # without the spread test the exit takes the lumpy lead too
    assert follow(listed([[10.0] * 56, c1, lumpy], 0.0), 20)[13:] == ["c2"] * 7


class Trialled(Listed):
    """A stand-in ghost whose clone (a trial of a switch to ``strategy`` from its state)
    resumes ``then[strategy.name][k]`` pages at the trial's k-th lookup."""

    def __init__(self, hits: list[float], then: dict[str, list[float]]):
        super().__init__(hits)
        self.then = then
        self.cloned: list[tuple[int, str]] = []

    def clone(self, strategy):
        self.cloned.append((self.i, strategy.name))
        return Listed(self.then[strategy.name])


def trialled(c1_clone: list[float], trial: int = 10) -> tuple[PolicySelector, Trialled]:
    """LRU's ghost hits 10 a lookup, c1's a steady 13: a clear lead from the first window;
    a switch from LRU's state to c1 hits ``c1_clone`` in the trial."""
    sel = PolicySelector([LRU(), Ranked("c1")], capacity_units=10, snapshot_units=1, window=10, margin=0.03,
                         margin_hits=0.1, floor="lru", z=2.0, trial=trial)
    lru = Trialled([10.0] * 80, {"c1": c1_clone})
    sel.ghosts = [lru, Listed([13.0] * 80)]
    return sel, lru


def test_a_switch_on_trial_is_taken_when_its_clone_beat_staying():
    # the lead is clear at lookup 9 (the window fills): the trial starts there, from LRU's
    # ghost, and its clone leads LRU's ghost by 3 a lookup over lookups 10-19: taken at 19
    sel, lru = trialled([13.0] * 80)
    names = follow(sel, 30)
    assert names[:19] == ["lru"] * 19 and names[19:] == ["c1"] * 11
    assert lru.cloned == [(10, "c1")] and sel.switches == 1 and sel.stats().trials == 1
    # without a trial the same lead is taken at once
    sel, lru = trialled([13.0] * 80, trial=0)
    assert follow(sel, 30).index("c1") == 9 and lru.cloned == []


@pytest.mark.parametrize("c1_clone", [
    [8.0] * 80,                    # the switch costs: what c1 drops first, LRU's state still needed
    [10.0] * 80,                   # a tie: not worth paying for
    [10.0] * 9 + [40.0] * 71,      # +30 in one lookup: a lump, not clear of its spread
    [10.5] * 80,                   # clear (a steady half page a lookup), but 5 pages: under
                                   # the window's lead over the trial's 10 lookups (10 pages)
])
def test_a_switch_whose_clone_did_not_clearly_beat_staying_is_not_taken(c1_clone):
    # c1's own ghost keeps its lead, so trials follow one another (each from where LRU's
    # ghost stands then), each dropped when it ends: 9-19, 20-30, 31-41
    sel, lru = trialled(c1_clone)
    assert set(follow(sel, 42)) == {"lru"} and sel.switches == 0
    assert [i for i, _ in lru.cloned] == [10, 21, 32] and sel.stats().trials == 3


def test_the_floors_exit_goes_to_lru_and_ends_a_trial():
    # c2 is tried from LRU's state (lookups 10-14) and taken at 14; c1 then leads c2, and its
    # trial, from c2's state, starts at 22 (to end at 27). From 20 c2 hits 5 a lookup: under
    # LRU over the window at 25, when the floor's exit goes at once to LRU, though c1 leads
    # LRU: with trials, every other candidate is tried from the floor. The trial from c2's
    # state is dropped; c1 is tried again from LRU's (26-31) and taken at 31.
    sel = PolicySelector([LRU(), Ranked("c1"), Ranked("c2")], capacity_units=10, snapshot_units=1, window=10,
                         margin=0.03, margin_hits=0.1, floor="lru", z=0.0, trial=5)
    lru = Trialled([10.0] * 60, {"c2": [12.0] * 60, "c1": [14.0] * 60})
    c2 = Trialled([12.0] * 12 + [16.0] * 8 + [5.0] * 40, {"c1": [20.0] * 60})
    sel.ghosts = [lru, Listed([10.0] * 12 + [14.0] * 48), c2]
    names = follow(sel, 40)
    assert names[:14] == ["lru"] * 14 and names[14:25] == ["c2"] * 11
    assert names[25:31] == ["lru"] * 6 and names[31:] == ["c1"] * 9
    assert lru.cloned == [(10, "c2"), (27, "c1")] and c2.cloned == [(23, "c1")]
    assert sel.switches == 3 and sel.stats().trials == 3


def test_a_trial_is_dropped_when_its_candidates_ghost_falls_under_lru():
    # c1's clone leads LRU's ghost through its trial (9-19), but c1's own ghost hits 5 a
    # lookup from 10 on: under LRU over the window when the trial ends, so taking it would
    # only have the floor's exit leave it at the next lookup
    sel, lru = trialled([13.0] * 80)
    sel.ghosts[1] = Listed([13.0] * 10 + [5.0] * 70)
    assert set(follow(sel, 40)) == {"lru"} and sel.switches == 0 and sel.stats().trials == 1


def test_the_window_spread_is_kept_against_the_followed_candidate_across_switches():
    # the spread a switch's lead is judged against, kept incrementally per candidate and
    # rebuilt at each switch, equals the sum of squared differences recomputed from the window
    rng = np.random.default_rng(3)
    sel = PolicySelector([Never(), LRU(), get_strategy("reuse")], capacity_units=40, snapshot_units=2,
                         window=40, margin=0.0, z=0.5)
    chains = {c * 10_000: [c * 10_000] for c in range(6)}
    seen = set()
    for i in range(600):
        keys = turn(chains, rng, i)
        sel.lookup(i, keys)
        seen.add(sel.followed)
        f = sel.followed
        assert sel._sq == [sum((h[c] - h[f]) ** 2 for h in sel._recent) for c in range(3)]
        sel.publish(i, keys, "prompt_end", True)
        sel.release(i)
    assert sel.switches >= 1 and len(seen) >= 2
