"""The reasoning workload: each turn decodes <think> thinking </think> answer <eot>, and the
next prompt keeps turn k's prompt and answer only -- it leaves turn k's prompt + output at
the first decoded token. Exact structure, reuse that stops at the prompt's end, a trace
round trip that keeps it, a replay with every page checked, and bad input."""

from __future__ import annotations

import dataclasses
import json

import numpy as np
import pytest

from hicache.cli.main import main as cli_main
from hicache.engine.workloads import (ReasoningSpec, load_trace, reasoning, reusable_per_request, summarize,
                                      write_trace)
from hicache.engine.workloads.tokenizer import ASSISTANT, END_THINK, EOT, FIRST_TEXT_ID, THINK, USER
from hicache.errors import ConfigError
from tests.engine.workloads.helpers import by_conversation, check_workload, common_prefix

SMALL = ReasoningSpec(turns=(2, 5), system_prompts=2, system_len=40, user_len=(5, 30), thinking_len=(40, 120),
                      answer_len=(3, 20), arrival_rate=1.0, think_time_s=2.0)


@pytest.fixture(scope="module")
def small():
    return reasoning(8, 3, spec=SMALL)


def test_next_prompt_keeps_the_prompt_and_the_answer_not_the_thinking(small):
    check_workload(small, prefix_chain=False)
    convs = by_conversation(small)
    assert len(convs) == 8
    for steps in convs.values():
        assert SMALL.turns[0] <= len(steps) <= SMALL.turns[1]
        for r in steps:
            out = r.output
            assert out[0] == THINK and out[-1] == EOT and list(r.prompt[-2:]) == [EOT, ASSISTANT]
            (end_think,) = np.flatnonzero(out == END_THINK)
            thinking, answer = out[1:end_think], out[end_think + 1:-1]
            assert SMALL.thinking_len[0] <= len(thinking) <= SMALL.thinking_len[1]
            assert SMALL.answer_len[0] <= len(answer) <= SMALL.answer_len[1]
            assert min(thinking.min(), answer.min()) >= FIRST_TEXT_ID
        for prev, r in zip(steps, steps[1:]):
            p = prev.prompt_len
            # turn k+1 starts with turn k's prompt exactly ...
            assert np.array_equal(r.prompt[:p], prev.prompt)
            # ... and leaves turn k's prompt + output at the first decoded token (<think>)
            assert common_prefix(r.prompt, np.concatenate([prev.prompt, prev.output])) == p
            # what follows is turn k's answer and <eot> (the end of its output), then the next user turn
            kept = prev.output[np.flatnonzero(prev.output == END_THINK)[0] + 1:]
            assert np.array_equal(r.prompt[p:p + len(kept)], kept)
            tail = r.prompt[p + len(kept):]
            assert tail[0] == USER and list(tail[-2:]) == [EOT, ASSISTANT]
            assert SMALL.user_len[0] <= len(tail) - 3 <= SMALL.user_len[1]
            # so no thinking token of turn k is in any later prompt
            assert r.prompt_len == p + len(kept) + len(tail)


def test_reuse_stops_at_the_previous_prompts_end(small):
    P = 16
    reuse = reusable_per_request(small, page_tokens=P)
    for steps in by_conversation(small).values():
        for prev, r in zip(steps, steps[1:]):
            # the page holding turn k's prompt end also holds <think> (its output): not reusable
            assert reuse[r.request_id] == min(prev.prompt_len // P, (r.prompt_len - 1) // P) * P


def test_same_seed_same_requests_conversations_independent_of_count(small):
    again = reasoning(8, 3, spec=SMALL)
    assert [(r.conversation_id, r.turn, r.arrival_s, r.prompt.tobytes(), r.output.tobytes()) for r in small] == \
        [(r.conversation_id, r.turn, r.arrival_s, r.prompt.tobytes(), r.output.tobytes()) for r in again]
    fewer = by_conversation(reasoning(3, 3, spec=SMALL))
    mine = by_conversation(small)
    for cid, steps in fewer.items():
        assert [(r.prompt.tobytes(), r.output.tobytes()) for r in steps] == \
            [(r.prompt.tobytes(), r.output.tobytes()) for r in mine[cid]]
    assert [r.prompt_len for r in reasoning(8, 4, spec=SMALL)] != [r.prompt_len for r in small]


def test_default_size_and_thinking_dominates_the_output():
    reqs = reasoning(100, 0)
    stats = summarize(reqs, page_tokens=256)
    assert 800 <= stats.requests <= 1500 and 4e6 < stats.prompt_tokens < 12e6
    thinking = sum(int(np.flatnonzero(r.output == END_THINK)[0]) - 1 for r in reqs)
    answers = sum(r.output_len for r in reqs) - thinking - 3 * len(reqs)
    assert thinking > 4 * answers  # several times longer than the answers


def test_trace_round_trip_keeps_the_resume_point(tmp_path):
    # short thinking, long user turns: turn k+1's prompt is long enough to hold turn k's whole
    # output, so only the output_in_next marker keeps the loader from linking it
    reqs = reasoning(6, 1, spec=dataclasses.replace(SMALL, thinking_len=(1, 4), user_len=(40, 60)))
    path = tmp_path / "r.jsonl"
    write_trace(reqs, path, block_size=16)
    recs = [json.loads(line) for line in path.read_text().splitlines()]
    last = {(r.conversation_id, r.turn) for r in reqs}
    marked = [rec.get("output_in_next") is False for rec in recs]
    assert marked == [(r.conversation_id, r.turn + 1) in last for r in sorted(reqs, key=lambda r: r.request_id)]
    loaded = load_trace(path)
    check_workload(loaded, prefix_chain=False)
    for steps in by_conversation(loaded).values():
        for prev, r in zip(steps, steps[1:]):
            assert np.array_equal(r.prompt[:prev.prompt_len], prev.prompt)
            assert common_prefix(r.prompt, np.concatenate([prev.prompt, prev.output])) == prev.prompt_len
    assert reusable_per_request(loaded, page_tokens=16) == reusable_per_request(reqs, page_tokens=16)
    # without the marker the loader would take turn k's output from turn k+1's prompt where it fits
    stripped = tmp_path / "s.jsonl"
    stripped.write_text("".join(json.dumps({k: v for k, v in rec.items() if k != "output_in_next"}) + "\n"
                                for rec in recs))
    wrong = reusable_per_request(load_trace(stripped), page_tokens=16)
    assert sum(wrong.values()) > sum(reusable_per_request(reqs, page_tokens=16).values())


def test_tiny_replay_checks_every_page(tmp_path, capsys):
    trace = tmp_path / "r.jsonl"
    write_trace(reasoning(4, 2, spec=SMALL), trace, block_size=16)
    assert cli_main(["replay", "--config", "tiny-hybrid", "--trace", str(trace), "--device-pages", "120",
                     "--host-pages", "200", "--verify", "full", "--json", "--quiet"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["mismatched_pages"] == 0 and out["verified_pages"] > 0
    assert out["finished_requests"] == out["requests"] and out["hit_tokens"] > 0


def test_bad_input_names_the_field():
    for kw, name in (({"answer_len": (0, 5)}, "answer_len"), ({"turns": (0, 2)}, "turns"),
                     ({"thinking_len": "long"}, "thinking_len"), ({"max_prompt_tokens": 100}, "max_prompt_tokens"),
                     ({"think_time_s": -1.0}, "think_time_s"), ({"system_prompts": 0}, "system_prompts")):
        with pytest.raises(ConfigError, match=name):
            ReasoningSpec(**kw)
    with pytest.raises(ConfigError, match="conversations"):
        reasoning(0, 0)
    with pytest.raises(ConfigError, match="seed"):
        reasoning(1, -1)
