"""The agentic preset: exact branching structure, steps that extend their own branch,
grouped arrivals, determinism, the size of the default preset, and a replay of it on the
tiny hybrid layout with every page checked."""

from __future__ import annotations

import argparse
import itertools
import json

import numpy as np
import pytest

from hicache.cli.main import main as cli_main
from hicache.cli.replay_cmd import load_requests
from hicache.engine.workloads import (PRESETS, AgenticSpec, agentic, load_trace, reusable_per_request, summarize,
                                      synthetic, write_trace)
from hicache.engine.workloads.__main__ import main as workloads_main
from hicache.engine.workloads.agentic import agent_prompts
from hicache.engine.workloads.tokenizer import ASSISTANT, BOS, EOT, FIRST_TEXT_ID, SYSTEM, TOOL, USER
from hicache.errors import ConfigError
from tests.engine.workloads.helpers import check_workload

SMALL = AgenticSpec(system_prompts=(2, 2), system_len=(40, 60), task_len=(10, 30), rollouts=(2, 4),
                    steps=(2, 4), call_len=(3, 10), result_len=(5, 20), arrival_rate=1.0,
                    rollout_spread_s=0.2, think_time_s=1.0)
TASKS, SEED = 6, 3


def by_rollout(reqs):
    """{(task, g): [requests by step]} from the ``agent-<task>-<g>`` conversation ids."""
    out: dict[tuple[int, int], list] = {}
    for r in reqs:
        _, t, g = r.conversation_id.split("-")
        out.setdefault((int(t), int(g)), []).append(r)
    return out


def common_prefix(a: np.ndarray, b: np.ndarray) -> int:
    n = min(len(a), len(b))
    diff = np.flatnonzero(a[:n] != b[:n])
    return int(diff[0]) if len(diff) else n


def full(steps) -> np.ndarray:
    """A rollout's whole token sequence: its last step's prompt + output."""
    return np.concatenate([steps[-1].prompt, steps[-1].output])


@pytest.fixture(scope="module")
def small():
    return agentic(TASKS, SEED, spec=SMALL)


def test_rollouts_share_exactly_system_and_task_then_diverge(small):
    check_workload(small)
    rollouts = by_rollout(small)
    prompts = agent_prompts(SMALL, SEED)
    assert len(prompts) == 2 and prompts[0][2] != prompts[1][2]  # distinct from the first text token
    tasks = sorted({t for t, _ in rollouts})
    assert tasks == list(range(TASKS))
    shared, system_of = {}, {}
    for t in tasks:
        group = [rollouts[(t, g)] for g in itertools.takewhile(lambda g: (t, g) in rollouts, itertools.count())]
        assert SMALL.rollouts[0] <= len(group) <= SMALL.rollouts[1]
        assert len(group) == sum(1 for key in rollouts if key[0] == t)  # numbered 0..G-1
        first = group[0][0].prompt
        # <bos><system> agent prompt <eot> <user> task <eot> <assistant>
        (s,) = [i for i, p in enumerate(prompts) if np.array_equal(first[:len(p)], p)]
        sys_len = len(prompts[s])
        assert list(first[:2]) == [BOS, SYSTEM] and first[sys_len - 1] == EOT and first[sys_len] == USER
        assert list(first[-2:]) == [EOT, ASSISTANT]
        task_len = len(first) - sys_len - 3
        assert SMALL.task_len[0] <= task_len <= SMALL.task_len[1]
        assert first[sys_len + 1:-2].min() >= FIRST_TEXT_ID
        shared[t], system_of[t] = first, s
        # step 0 is the same prompt for every rollout (n-sampling) ...
        assert all(np.array_equal(steps[0].prompt, first) for steps in group)
        # ... and the branches part at the first decoded token, never later
        for a, b in itertools.combinations(group, 2):
            assert common_prefix(full(a), full(b)) == len(first)
            assert a[0].output[0] != b[0].output[0]
    for t, u in itertools.combinations(tasks, 2):
        expect = len(prompts[system_of[t]]) + 1 if system_of[t] == system_of[u] else 2
        assert common_prefix(shared[t], shared[u]) == expect  # the agent prompt and <user>, or <bos><system>
    assert len(set(system_of.values())) == 2  # this draw uses both agent prompts


def test_each_step_extends_its_own_branch(small):
    for steps in by_rollout(small).values():
        assert SMALL.steps[0] <= len(steps) <= SMALL.steps[1]
        assert [r.turn for r in steps] == list(range(len(steps)))
        for prev, r in zip(steps, steps[1:]):
            head = np.concatenate([prev.prompt, prev.output])
            assert np.array_equal(r.prompt[:len(head)], head)
            # the tool result: <tool> text <eot> <assistant>
            tail = r.prompt[len(head):]
            assert tail[0] == TOOL and list(tail[-2:]) == [EOT, ASSISTANT]
            assert SMALL.result_len[0] <= len(tail) - 3 <= SMALL.result_len[1]
            assert tail[1:-2].min() >= FIRST_TEXT_ID
        for r in steps:
            assert r.output[-1] == EOT and SMALL.call_len[0] <= r.output_len - 1 <= SMALL.call_len[1]
            assert r.output[:-1].min() >= FIRST_TEXT_ID


def test_arrivals_group_rollouts_and_chain_steps(small):
    rollouts = by_rollout(small)
    assert small[0].arrival_s == 0.0
    task_start = {}
    for (t, g), steps in sorted(rollouts.items()):
        start = steps[0].arrival_s
        if g == 0:
            task_start[t] = start
        assert task_start[t] <= start <= task_start[t] + SMALL.rollout_spread_s
        times = [r.arrival_s for r in steps]
        assert times == sorted(times) and len(set(times)) == len(times)
    starts = [task_start[t] for t in range(TASKS)]
    assert starts == sorted(starts) and starts[-1] > 0


def test_same_seed_same_requests_and_tasks_independent_of_count(small):
    again = agentic(TASKS, SEED, spec=SMALL)
    assert [(r.request_id, r.conversation_id, r.turn, r.arrival_s) for r in small] == \
        [(r.request_id, r.conversation_id, r.turn, r.arrival_s) for r in again]
    assert all(np.array_equal(a.prompt, b.prompt) and np.array_equal(a.output, b.output)
               for a, b in zip(small, again))
    other = agentic(TASKS, SEED + 1, spec=SMALL)
    assert [r.prompt_len for r in other] != [r.prompt_len for r in small]
    fewer = by_rollout(agentic(2, SEED, spec=SMALL))
    mine = by_rollout(small)
    for key, steps in fewer.items():
        assert [(r.prompt.tobytes(), r.output.tobytes()) for r in steps] == \
            [(r.prompt.tobytes(), r.output.tobytes()) for r in mine[key]]
    via_preset = synthetic(TASKS, SEED, preset="agentic", **{f: getattr(SMALL, f) for f in (
        "system_prompts", "system_len", "task_len", "rollouts", "steps", "call_len", "result_len",
        "arrival_rate", "rollout_spread_s", "think_time_s")})
    assert [r.prompt.tobytes() for r in via_preset] == [r.prompt.tobytes() for r in small]


def test_default_preset_size_reuse_and_working_set(tmp_path):
    assert PRESETS["agentic"] == AgenticSpec()
    reqs = synthetic(100, 0, preset="agentic")
    stats = summarize(reqs, page_tokens=256)
    assert 1000 < stats.requests <= 4000
    assert stats.conversations > 300 and stats.reuse_ratio > 0.85
    written = write_trace(reqs, tmp_path / "a.jsonl", block_size=256)
    # ~1 MB per DeepSeek-V4-Flash page: many times a 0.25 GiB device's 256 pages
    assert written.unique_blocks > 8 * 256


def test_bad_agentic_input_names_the_field():
    with pytest.raises(ConfigError, match="turns"):
        synthetic(2, 0, preset="agentic", turns=3)  # a chat field, not an agentic one
    with pytest.raises(ConfigError, match="rollouts"):
        AgenticSpec(rollouts=(0, 2))
    with pytest.raises(ConfigError, match="rollout_spread_s"):
        AgenticSpec(rollout_spread_s=-1.0)
    with pytest.raises(ConfigError, match="rollouts"):
        AgenticSpec(vocab_size=FIRST_TEXT_ID + 4, system_prompts=(1, 1))  # 8 rollouts need 8 distinct first ids
    tiny_vocab = AgenticSpec(vocab_size=FIRST_TEXT_ID + 4, system_prompts=(1, 1), rollouts=(1, 2))
    with pytest.raises(ConfigError, match="conversations"):
        agentic(5, 0, spec=tiny_vocab)
    with pytest.raises(ConfigError, match="conversations"):
        agentic(0, 0, spec=SMALL)


def test_workloads_cli_describes_and_writes_the_preset(capsys, tmp_path):
    out_path = tmp_path / "a.jsonl"
    assert workloads_main(["synthetic", "--preset", "agentic", "--conversations", "2", "--seed", "1",
                           "--write-trace", str(out_path), "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    expected = summarize(synthetic(2, 1, preset="agentic")).as_dict()
    assert out["stats"] == expected
    assert out["trace_written"]["records"] == expected["requests"] == len(load_trace(out_path))
    args = argparse.Namespace(conversations=2, seed=1, trace=None, block_size=None, workload="agentic")
    work = load_requests(args)
    assert work.name == "agentic x2" and len(work.requests) == expected["requests"]


def test_tiny_replay_of_the_trace_checks_every_page_and_waits_for_each_step(tmp_path, capsys):
    reqs = agentic(4, 1, spec=SMALL)
    trace, rows = tmp_path / "a.jsonl", tmp_path / "req.jsonl"
    write_trace(reqs, trace, block_size=16)
    # The linked trace keeps the sharing structure, except that a partial block is linked
    # to one successor only: of G identical step-0 prompts, only the first rollout's
    # decoded tokens continue into its step 1, so the other rollouts' step 1 can lose the
    # page where the prompt ends (docs/workloads.md, agentic).
    built = reusable_per_request(reqs, page_tokens=16)
    loaded = reusable_per_request(load_trace(trace), page_tokens=16)
    assert built.keys() == loaded.keys()
    for r in reqs:
        if r.turn == 1 and not r.conversation_id.endswith("-0"):
            assert built[r.request_id] - 16 <= loaded[r.request_id] <= built[r.request_id]
        else:
            assert loaded[r.request_id] == built[r.request_id], r
    assert cli_main(["replay", "--config", "tiny-hybrid", "--trace", str(trace), "--device-pages", "120",
                     "--host-pages", "200", "--verify", "full", "--requests-out", str(rows),
                     "--json", "--quiet"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["mismatched_pages"] == 0 and out["verified_pages"] > 0
    assert out["requests"] == out["finished_requests"] == len(reqs)
    assert out["hit_tokens"] > 0
    records = [json.loads(line) for line in rows.read_text().splitlines()]
    last: dict[str, dict] = {}
    for rec in sorted(records, key=lambda r: (r["conversation_id"], r["turn"])):
        prev = last.get(rec["conversation_id"])
        if prev is not None:  # step k+1 is admitted only once step k has finished
            assert rec["turn"] == prev["turn"] + 1
            assert rec["ready_s"] + rec["queue_s"] >= prev["finish_s"] - 1e-9, (prev, rec)
        last[rec["conversation_id"]] = rec
