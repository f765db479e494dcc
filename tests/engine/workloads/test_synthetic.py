"""Synthetic conversations: exact template, shared prefixes, presets, arrivals, bad input."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from hicache.engine.workloads import PRESETS, summarize, synthetic, synthetic_spec
from hicache.engine.workloads.tokenizer import ASSISTANT, BOS, EOT, FIRST_TEXT_ID, SYSTEM, USER
from hicache.errors import ConfigError
from tests.engine.workloads.helpers import check_workload

TINY = dict(turns=(2, 2), system_prompts=1, system_len=10, user_len=5, output_len=3,
            arrival_rate=None, think_time_s=1.0)


def test_exact_template_and_lengths():
    reqs = synthetic(3, 7, **TINY)
    check_workload(reqs)
    assert len(reqs) == 6
    by_conv = {}
    for r in reqs:
        by_conv.setdefault(r.conversation_id, []).append(r)
    assert sorted(by_conv) == ["syn-0", "syn-1", "syn-2"]
    for first, second in by_conv.values():
        p = first.prompt
        # <bos><system> 10 tokens <eot> <user> 5 tokens <eot><assistant>
        assert first.prompt_len == 2 + 10 + 1 + 1 + 5 + 2 == 21
        assert list(p[:2]) == [BOS, SYSTEM] and p[12] == EOT and p[13] == USER
        assert list(p[19:]) == [EOT, ASSISTANT]
        assert first.output_len == 4 and first.output[-1] == EOT
        assert second.prompt_len == 21 + 4 + 1 + 5 + 2 == 33
        assert second.prompt[25] == USER and list(second.prompt[-2:]) == [EOT, ASSISTANT]
        body = np.concatenate([p[2:12], p[14:19], first.output[:3]])
        assert body.min() >= FIRST_TEXT_ID
    # one system prompt: every conversation starts with the same 13 tokens
    heads = {r.prompt[:13].tobytes() for r in reqs}
    assert len(heads) == 1


def test_system_prompts_are_shared_and_documents_reused():
    reqs = synthetic(40, 1, system_prompts=3, system_len=50, turns=(1, 1), user_len=4, output_len=2,
                     document_len=(30, 30), documents=2)
    check_workload(reqs)
    systems = {r.prompt[:53].tobytes() for r in reqs}
    docs = {r.prompt[54:84].tobytes() for r in reqs}  # after <user>
    assert len(systems) == 3 and len(docs) == 2
    stats = summarize(reqs, page_tokens=16)
    # every prompt is 53 + 1 + 30 + 4 + 2 = 90 tokens; at most 5 full pages usable (89 // 16)
    assert stats.prompt_tokens == 40 * 90 and stats.max_prompt_tokens == 90
    assert 0 < stats.reusable_tokens <= 40 * 5 * 16 and stats.reusable_tokens % 16 == 0


def test_same_flags_same_requests_and_seed_changes_them():
    a, b, c = synthetic(20, 5), synthetic(20, 5), synthetic(20, 6)
    assert [(r.conversation_id, r.turn, r.arrival_s) for r in a] == \
        [(r.conversation_id, r.turn, r.arrival_s) for r in b]
    assert all(np.array_equal(x.prompt, y.prompt) and np.array_equal(x.output, y.output)
               for x, y in zip(a, b))
    assert [r.prompt_len for r in a] != [r.prompt_len for r in c]


def test_poisson_arrivals_start_at_zero_and_turns_follow():
    reqs = synthetic(30, 2, arrival_rate=4.0, think_time_s=3.0)
    check_workload(reqs)
    firsts = sorted(r.arrival_s for r in reqs if r.turn == 0)
    assert firsts[0] == 0.0 and firsts[-1] > 0
    everyone_at_once = synthetic(5, 2, arrival_rate=None, think_time_s=0.0)
    assert {r.arrival_s for r in everyone_at_once} == {0.0}
    check_workload(everyone_at_once)


def test_long_context_preset_few_at_a_time_up_to_1m_tokens():
    spec = PRESETS["long-context"]
    reqs = synthetic(6, 0, preset="long-context")
    check_workload(reqs)
    assert max(r.prompt_len for r in reqs) <= spec.max_prompt_tokens == 1_048_576
    assert max(r.prompt_len for r in reqs) > 900_000
    spans = {}
    for r in reqs:
        lo, hi = spans.get(r.conversation_id, (r.arrival_s, r.arrival_s))
        spans[r.conversation_id] = (min(lo, r.arrival_s), max(hi, r.arrival_s))
    assert len(spans) == 6
    for cid, (start, _) in spans.items():
        open_then = [c for c, (lo, hi) in spans.items() if c != cid and lo <= start <= hi]
        assert len(open_then) <= spec.max_active - 1, (cid, open_then)
    turns = {}
    for r in reqs:
        turns[r.conversation_id] = r.turn + 1
    assert all(3 <= t <= 6 for t in turns.values())


def test_long_revisit_preset_reads_every_document_before_any_revisit():
    reqs = synthetic(4, 0, preset="long-revisit")
    check_workload(reqs)
    firsts = [r for r in reqs if r.turn == 0]
    revisits = [r for r in reqs if r.turn == 1]
    assert len(firsts) == len(revisits) == 4 and len(reqs) == 8
    assert [r.request_id for r in reqs[:4]] == sorted(r.request_id for r in firsts)  # reads come first
    assert max(r.arrival_s for r in firsts) < min(r.arrival_s for r in revisits)
    assert all(786_432 < r.prompt_len <= 1_048_576 for r in reqs)
    by_conv = {r.conversation_id: r for r in firsts}
    for r in revisits:  # a revisit extends its own conversation: prompt + answer of the read
        first = by_conv[r.conversation_id]
        assert np.array_equal(r.prompt[: first.prompt_len + len(first.output)],
                              np.concatenate([first.prompt, first.output]))


def test_max_prompt_tokens_drops_later_turns():
    reqs = synthetic(10, 3, turns=(6, 6), system_len=20, user_len=10, output_len=10, max_prompt_tokens=80)
    check_workload(reqs)
    assert max(r.prompt_len for r in reqs) <= 80
    # prompts: 23 + 13 = 36, then 36 + 11 + 13 = 60, then 84 > 80 -> exactly two turns fit
    assert {r.turn for r in reqs} == {0, 1} and len(reqs) == 20


@pytest.mark.parametrize("kwargs, field", [
    (dict(turns=(3, 1)), "turns"),
    (dict(turns=0), "turns"),
    (dict(user_len="long"), "user_len"),
    (dict(system_prompts=0), "system_prompts"),
    (dict(arrival_rate=-1.0), "arrival_rate"),
    (dict(max_active=0), "max_active"),
    (dict(think_time_s=float("nan")), "think_time_s"),
    (dict(max_prompt_tokens=100), "max_prompt_tokens"),
    (dict(colour="blue"), "colour"),
    (dict(preset="huge"), "preset"),
    (dict(conversations=0), "conversations"),
    (dict(seed=-1), "seed"),
])
def test_bad_input_raises_config_error(kwargs, field):
    kwargs = dict(kwargs)
    n = kwargs.pop("conversations", 2)
    seed = kwargs.pop("seed", 0)
    with pytest.raises(ConfigError) as info:
        synthetic(n, seed, **kwargs)
    assert info.value.field == field


def test_spec_overrides_keep_preset_defaults():
    spec = synthetic_spec("long-context", max_active=3)
    assert spec.max_active == 3 and spec.document_len == PRESETS["long-context"].document_len


@given(turns=st.tuples(st.integers(1, 4), st.integers(0, 3)), sys_len=st.integers(0, 40),
       user=st.tuples(st.integers(0, 30), st.integers(0, 30)),
       out=st.tuples(st.integers(0, 20), st.integers(0, 20)),
       rate=st.one_of(st.none(), st.floats(0.1, 50)), active=st.one_of(st.none(), st.integers(1, 4)),
       n=st.integers(1, 12), seed=st.integers(0, 2**32))
@settings(max_examples=60, deadline=None)
def test_random_specs_keep_the_invariants(turns, sys_len, user, out, rate, active, n, seed):
    lo_t, extra = turns
    reqs = synthetic(n, seed, turns=(lo_t, lo_t + extra), system_len=sys_len,
                     user_len=(min(user), max(user)), output_len=(min(out), max(out)),
                     arrival_rate=rate, max_active=active)
    check_workload(reqs)
    assert len({r.conversation_id for r in reqs}) == n
    for r in reqs:
        assert min(out) + 1 <= r.output_len <= max(out) + 1
        if r.turn == 0:
            assert 6 + sys_len + min(user) <= r.prompt_len <= 6 + sys_len + max(user)
