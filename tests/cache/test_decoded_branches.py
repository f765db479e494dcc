"""A decode's pages are a branch no request has taken until one goes through them
(``TreeNode.decoded``), so the branch points the orders rank are where requests were seen
to go: the previous turn's decode beside the next turn's prompt is not a fork."""

from hicache.cache import Boundary
from hicache.tree import device_victims

from tests.cache.conftest import Engine, make_cache, mha_layout, node_of, toks


def turn(eng: Engine, prompt, output_pages: tuple, release: bool = True):
    """A request: its prompt published (PROMPT_END), then its decode's end (FINISH)."""
    _, lease = eng.start(prompt)
    pages = len(prompt) // 4
    if pages > lease.published_pages:
        eng.publish(lease, prompt, pages, Boundary.PROMPT_END)
    full = toks(*(list(prompt[::4][:pages]) + list(output_pages)))
    eng.publish(lease, full, len(full) // 4, Boundary.FINISH)
    if release:
        eng.cache.release(lease)
    eng.cache.check_integrity()
    return lease


def test_the_next_prompt_beside_a_decode_is_not_a_fork_and_its_resume_point_is_superseded():
    eng = Engine(make_cache(device_pages=32, device_snaps=8, eviction="reuse"))
    turn(eng, toks(1, 2), (7, 8))                 # turn 0: prompt pages 1 2, decode 7 8
    p = node_of(eng.cache, toks(1, 2))
    decode = node_of(eng.cache, toks(1, 2, 7, 8))
    assert decode.decoded and p.branches == 0 and not p.forked
    # turn 1 (the reasoning template: the thinking dropped) resumes at turn 0's prompt end
    turn(eng, toks(1, 2, 3, 4), (9,))
    assert eng.cache.counters.hit_tokens >= 8
    assert len(p.children) == 2 and p.branches == 1 and not p.forked   # the decode is not a branch taken
    assert p.snapshot is not None and p.snapshot.resumed == 1
    s = eng.cache._policy.strategy
    assert s.snapshot_priority(p, p.snapshot)[0] == 0              # resumed, and the chain went on: first
    eng.cache.check_integrity()
    eng.cache.close()


def test_decodes_below_a_resumed_prompt_end_do_not_supersede_it():
    # The same prompt twice (a trace without conversation ids repeats a request): the second
    # resumes at the first's prompt end and decodes a tail of its own beside the first's. The
    # tails' snapshots lie below, but no request went on past the prompt end, so under every
    # candidate that drops superseded snapshots it keeps its place; a later prompt that goes
    # on through it supersedes it.
    for eviction in ("reuse", "reuse-prompt", "reuse-prompt-late"):
        eng = Engine(make_cache(device_pages=32, device_snaps=8, eviction=eviction))
        turn(eng, toks(1, 2, extra=1), (7,))
        turn(eng, toks(1, 2, extra=1), (8,))
        p = node_of(eng.cache, toks(1, 2))
        assert p.snapshot is not None and p.snapshot.resumed == 1
        assert p.snapshots_below == 2 and p.branches == 0 and len(p.children) == 2
        s = eng.cache._policy.strategy
        assert s.snapshot_priority(p, p.snapshot)[0] == 1
        turn(eng, toks(1, 2, 3, 4), (9,))             # resumes at p and goes on past it
        assert p.branches == 1 and p.snapshot.resumed == 2 and p.snapshot.passed == 0
        assert s.snapshot_priority(p, p.snapshot)[0] == (1 if s.passed_only else 0)
        turn(eng, toks(1, 2, 3, 4, 5), (6,))          # resumes deeper: passes p
        assert p.snapshot.passed == 1 and s.snapshot_priority(p, p.snapshot)[0] == 0
        eng.cache.check_integrity()
        eng.cache.close()


def test_a_turn_that_goes_on_through_the_decode_takes_that_branch():
    eng = Engine(make_cache(device_pages=32, device_snaps=8, eviction="reuse"))
    turn(eng, toks(1, 2), (7, 8))
    p, decode = node_of(eng.cache, toks(1, 2)), node_of(eng.cache, toks(1, 2, 7, 8))
    turn(eng, toks(1, 2, 7, 8, 5), (6,))          # chat: the next prompt holds the previous output
    assert not decode.decoded and p.branches == 1
    turn(eng, toks(1, 2, 3), (9,))                # another request leaves the path at p: a real fork
    assert p.branches == 2 and p.forked
    eng.cache.check_integrity()
    eng.cache.close()


def test_a_finish_that_publishes_the_prompt_too_marks_only_the_decode():
    eng = Engine(make_cache(device_pages=32, device_snaps=8, eviction="reuse"))
    prompt = toks(1, 2)
    _, lease = eng.start(prompt)
    eng.publish(lease, toks(1, 2, 7), 3, Boundary.FINISH)    # no PROMPT_END publish before it
    eng.cache.release(lease)
    head, tail = node_of(eng.cache, toks(1, 2)), node_of(eng.cache, toks(1, 2, 7))
    assert not head.decoded and tail.decoded and head is not tail
    eng.cache.check_integrity()
    eng.cache.close()


def test_without_state_a_decodes_idle_pages_go_first_until_a_request_goes_through_them():
    # MHA: no snapshot carries idle_tails_first, so reuse-prompt ranks the decode's own
    # pages first (decoded_first) while no request has gone through them; lru ranks by age.
    for eviction, first in (("lru", 21), ("reuse-prompt", 7), ("probation", 7)):
        cache = make_cache(mha_layout(), device_pages=6, host_pages=0, eviction=eviction,
                           write_policy="write_back", storage="none://")
        eng = Engine(cache)
        eng.run(toks(21), why_last=Boundary.PROMPT_END)       # an older prompt-only page
        turn(eng, toks(1, 2), (7,))                           # prompt 1 2, decode 7
        tail, old = node_of(cache, toks(1, 2, 7)), node_of(cache, toks(21))
        assert tail.decoded and not old.decoded
        s = cache._policy.strategy
        ranked = eviction != "lru"   # lru's key is the access time alone
        assert not ranked or s.node_priority(tail)[0] == 0
        assert next(iter(device_victims(cache._tree, s))) is (tail if first == 7 else old)
        turn(eng, toks(1, 2, 7, 8), (9,))                     # a prompt goes on through 7
        assert not tail.decoded and (not ranked or s.node_priority(tail)[0] == 1)
        cache.check_integrity()
        cache.close()
