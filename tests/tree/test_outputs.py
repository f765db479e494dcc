"""Whether later prompts read a decode's output (hicache.tree.outputs), and the floor's two
orders that evidence picks between (hicache.tree.selector)."""

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from hicache.tree import LRU, PolicySelector, get_strategy
from hicache.tree.outputs import PER_PROMPT, OutputEvidence


def test_a_prompt_into_a_decodes_output_goes_through_and_one_past_its_start_goes_around():
    ev = OutputEvidence(needed=2, limit=100)
    ev.finished([1, 2, 3, 90, 91], prompt_pages=3)      # prompt 1 2 3, decode 90 91
    ev.lookup([1, 2, 3])                                # a repeat of the prompt: neither
    assert (ev.through, ev.around, ev.dead) == (0, 0, False)
    ev.lookup([1, 2, 3, 4, 5])                          # the next turn without the output
    assert (ev.through, ev.around, ev.dead) == (0, 1, False)
    ev.lookup([7, 8])                                   # unrelated: neither
    ev.lookup([1, 2, 3, 6])
    assert (ev.through, ev.around, ev.dead) == (0, 2, True)
    ev.lookup([1, 2, 3, 90, 91, 92])                    # a turn carrying the output
    assert (ev.through, ev.around, ev.dead) == (1, 2, False)
    ev.lookup([1, 2, 3, 4])                             # settled for good: nothing counts now
    assert (ev.through, ev.around, ev.dead) == (1, 2, False)


def test_through_wins_over_around_within_one_prompt():
    # a shared prefix ends one request's prompt (page 2) and another's (page 4); a prompt
    # that passes the first by its own way and goes on into the second's output went through
    ev = OutputEvidence(needed=1, limit=100)
    ev.finished([1, 2, 50], prompt_pages=2)
    ev.finished([1, 2, 3, 4, 60], prompt_pages=4)
    ev.lookup([1, 2, 3, 4, 60, 61])
    assert (ev.through, ev.around) == (1, 0)


def test_every_decode_from_one_prompt_end_counts_and_short_decodes_are_not_remembered():
    ev = OutputEvidence(needed=1, limit=100)
    ev.finished([1, 2, 10], prompt_pages=2)
    ev.finished([1, 2, 20], prompt_pages=2)   # the same prompt, sampled again
    ev.finished([5, 6], prompt_pages=2)       # no whole page past the prompt
    ev.finished([9], prompt_pages=0)          # a prompt under a page
    ev.lookup([5, 6, 7])
    ev.lookup([9, 10])
    assert (ev.through, ev.around) == (0, 0)
    ev.lookup([1, 2, 20, 21])
    assert (ev.through, ev.around) == (1, 0)


def test_only_the_last_limit_decodes_are_remembered():
    ev = OutputEvidence(needed=1, limit=2)
    ev.finished([1, 10], prompt_pages=1)
    ev.finished([2, 20], prompt_pages=1)
    ev.finished([1, 11], prompt_pages=1)      # refreshes prompt end 1
    ev.finished([3, 30], prompt_pages=1)      # evicts prompt end 2, the oldest
    ev.lookup([2, 20, 21])
    assert (ev.through, ev.around) == (0, 0)
    ev.lookup([1, 12])
    assert (ev.through, ev.around) == (0, 1)


class Turns:
    """Multi-turn traffic: each conversation's next prompt carries its previous output
    (``through``) or only its previous prompt plus a page (a trace without conversation
    ids); every output is one page of its own."""

    def __init__(self, sel: PolicySelector, convs: int, through: bool):
        self.sel = sel
        self.through = through
        self.prompts = {c: [1000 * (c + 1)] for c in range(convs)}
        self.i = 0

    def one(self, c: int) -> bool:
        """Conversation ``c``'s next turn; True if the cache must reorder at its lookup."""
        sel, i = self.sel, self.i
        prompt = self.prompts[c] + [self.prompts[c][-1] + 1]
        changed = sel.lookup(i, prompt, len(prompt))
        sel.publish(i, prompt, "prompt_end", True)
        out = prompt + [500_000 + i]
        sel.publish(i, out, "finish", True)
        sel.release(i)
        self.prompts[c] = out if self.through else prompt
        self.i += 1
        return changed

    def rounds(self, n: int) -> list[bool]:
        return [self.one(c) for _ in range(n) for c in self.prompts]


def selector(dead_outputs: int = 3, **kwargs) -> PolicySelector:
    args = {"floor": "lru", "tails": get_strategy("lru-tails"), "dead_outputs": dead_outputs, **kwargs}
    return PolicySelector([LRU(), get_strategy("reuse")], capacity_units=400, snapshot_units=1, window=1000,
                          **args)


def test_the_floor_drops_idle_tails_first_once_outputs_are_shown_unread_and_returns_for_good():
    sel = selector(dead_outputs=3)
    assert sel.strategy.name == "lru"
    t = Turns(sel, convs=2, through=False)
    # round 0: first turns, nothing to go around; round 1: both go around (2 of 3)
    assert t.rounds(2) == [False] * 4 and sel.strategy.name == "lru"
    # the third prompt that goes around settles it: the followed floor reorders at that lookup
    assert t.rounds(1) == [True, False]
    assert sel.strategy.name == "lru-tails" and sel.ghosts[0].strategy.name == "lru-tails"
    st = sel.stats()
    assert st.followed == "lru-tails" and set(st.ghost_hit_pages) == {"lru", "reuse"}
    # the first prompt into an output sends it back, and no later evidence takes it again
    t.through = True
    assert t.one(0) is False       # publishes conversation 0's output, whose next turn ...
    assert t.one(0) is True        # ... carries it
    assert sel.strategy.name == "lru" and sel.ghosts[0].strategy.name == "lru"
    t.through = False
    assert not any(t.rounds(20))
    assert sel.strategy.name == "lru" and sel._outputs is not None and sel._outputs.evidence.through == 1


def test_traffic_whose_prompts_carry_the_output_keeps_plain_lru():
    sel = selector(dead_outputs=1)
    assert not any(Turns(sel, convs=4, through=True).rounds(10))
    assert sel._outputs is not None
    ev = sel._outputs.evidence
    assert sel.strategy.name == "lru" and ev.around == 0 and ev.through > 0


@pytest.mark.parametrize("kwargs", [{"dead_outputs": 0}, {"floor": None}, {"tails": None}])
def test_without_the_evidence_or_a_floor_the_floor_order_never_changes(kwargs):
    sel = selector(**kwargs)
    Turns(sel, convs=2, through=False).rounds(5)
    assert sel.strategy.name == "lru" and sel._outputs is None


def reference(events) -> tuple[int, int]:
    """(through, around) by brute force: every finish kept, every prompt position checked."""
    pairs: list[tuple[int, int]] = []
    through = around = 0
    for kind, keys, p in events:
        if kind == "finish":
            if 1 <= p < len(keys):
                pairs.append((keys[p - 1], keys[p]))
        elif not through:
            ends = {e for e, _ in pairs}
            if any((keys[i], keys[i + 1]) in pairs for i in range(len(keys) - 1)):
                through += 1
            elif any(keys[i] in ends for i in range(len(keys) - 1)):
                around += 1
    return through, around


@st.composite
def traffic(draw):
    """Finishes and lookups over a small alphabet of page keys, so prompts meet decodes."""
    keys = st.lists(st.integers(0, 7), min_size=0, max_size=6)
    return draw(st.lists(st.one_of(st.tuples(st.just("finish"), keys, st.integers(0, 6)),
                                   st.tuples(st.just("lookup"), keys, st.just(0))), max_size=40))


@settings(max_examples=300, deadline=None)
@given(traffic())
def test_the_counts_match_a_brute_force_reading_of_the_same_traffic(events):
    ev = OutputEvidence(needed=1, limit=10_000)
    for kind, keys, p in events:
        if kind == "finish":
            ev.finished(keys, p)
        else:
            ev.lookup(keys)
    assert (ev.through, ev.around) == reference(events)
    assert ev.dead == (ev.through == 0 and ev.around >= 1)


def test_one_prompt_decoded_many_ways_keeps_its_newest_decodes():
    ev = OutputEvidence(needed=1, limit=100)
    for d in range(PER_PROMPT + 1):
        ev.finished([1, 1000 + d], prompt_pages=1)
    ev.finished([1, 1001], prompt_pages=1)      # decoded again: newest now
    ev.finished([1, 2000], prompt_pages=1)      # pushes out 1002, the oldest left
    ev.lookup([1, 1002])
    assert (ev.through, ev.around) == (0, 1)
    ev.lookup([1, 1001])
    assert (ev.through, ev.around) == (1, 1)
