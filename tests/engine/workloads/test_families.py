"""Every family by name: the replay / sweep names, the workloads CLI, ShareGPT without a
system prompt, and traces written without conversation ids (independent requests)."""

from __future__ import annotations

import argparse
import json

import numpy as np
import pytest

from hicache.cli.replay_cmd import WORKLOADS, load_requests
from hicache.engine.workloads import FAMILIES, build_family, read_trace, reasoning, sharegpt, summarize, write_trace
from hicache.engine.workloads.__main__ import main as workloads_main
from hicache.engine.workloads.tokenizer import BOS, EOT, SYSTEM, USER
from hicache.errors import ConfigError

SIZES = {"reasoning": 2, "rag": 1, "mix": 3, "mix-poisson": 3, "production": 40, "agentic": 1, "chat": 2}


def test_replay_and_sweep_know_every_family():
    assert set(WORKLOADS) == set(FAMILIES) | {"synthetic"}
    with pytest.raises(ConfigError, match="workload"):
        build_family("nope", 1, 0)


@pytest.mark.parametrize("name", sorted(SIZES))
def test_replay_builds_the_family_by_name(name):
    n = SIZES[name]
    work = load_requests(argparse.Namespace(conversations=n, seed=1, trace=None, block_size=None, workload=name))
    expected = build_family(name, n, 1)
    assert work.name == f"{name} x{n}" and len(work.requests) == len(expected) > 0
    assert [r.prompt.tobytes() for r in work.requests] == [r.prompt.tobytes() for r in expected]
    if name == "production":
        assert len(work.requests) == n and len({r.conversation_id for r in work.requests}) == n


def test_sharegpt_without_system_prompt_by_name(capsys):
    work = load_requests(argparse.Namespace(conversations=5, seed=2, trace=None, block_size=None, workload="sharegpt-nosys"))
    expected = sharegpt(5, 2, system_prompt="")
    assert [r.prompt.tobytes() for r in work.requests] == [r.prompt.tobytes() for r in expected]
    for r in work.requests:
        if r.turn == 0:  # nothing before the first user message but the empty system turn
            assert list(r.prompt[:4]) == [BOS, SYSTEM, EOT, USER]
    assert workloads_main(["sharegpt-nosys", "--conversations", "5", "--seed", "2", "--json"]) == 0
    same = json.loads(capsys.readouterr().out)
    assert workloads_main(["sharegpt", "--no-system-prompt", "--conversations", "5", "--seed", "2", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["stats"] == same["stats"] == summarize(expected).as_dict()
    assert workloads_main(["rag", "--no-system-prompt"]) == 2
    assert "--no-system-prompt" in capsys.readouterr().err


def test_trace_without_conversation_ids(tmp_path, capsys):
    with_ids, without = tmp_path / "a.jsonl", tmp_path / "b.jsonl"
    for path, extra in ((with_ids, []), (without, ["--no-conversation-ids"])):
        assert workloads_main(["reasoning", "--conversations", "3", "--seed", "4", "--write-trace", str(path),
                               "--block-size", "512", "--json", *extra]) == 0
        capsys.readouterr()
    a = [json.loads(line) for line in with_ids.read_text().splitlines()]
    b = [json.loads(line) for line in without.read_text().splitlines()]
    assert all(set(rec) == {"timestamp", "input_length", "output_length", "block_size", "hash_ids"} for rec in b)
    assert {"conversation_id", "turn", "request_id"} <= set(a[0])
    keep = ("timestamp", "input_length", "output_length", "block_size", "hash_ids")
    assert [{k: rec[k] for k in keep} for rec in a] == b  # the same blocks, 512 tokens each
    assert all(rec["block_size"] == 512 for rec in b)
    loaded = read_trace(without).requests
    assert len({r.conversation_id for r in loaded}) == len(loaded) and {r.turn for r in loaded} == {0}
    linked = read_trace(with_ids).requests
    assert len({r.conversation_id for r in linked}) == 3
    # independent requests: the loader ties no turn to the next, so only the prompts' whole
    # blocks are shared -- which for reasoning is all there is (turn k+1 resumes at turn k's
    # prompt end), so the ceiling is the built workload's either way
    reqs = reasoning(3, 4)
    ceiling = summarize(reqs, page_tokens=512).reusable_tokens
    assert ceiling > 0
    assert summarize(loaded, page_tokens=512).reusable_tokens == ceiling
    assert summarize(linked, page_tokens=512).reusable_tokens == ceiling
    sim = pytest.importorskip("kvcache_sim.trace").parse_trace_file(without)
    assert sim.request_count == len(reqs) and sim.total_input_tokens == sum(r.prompt_len for r in reqs)


def test_write_trace_api_without_ids_and_full_blocks(tmp_path):
    reqs = build_family("chat", 2, 0)
    path = tmp_path / "c.jsonl"
    write_trace(reqs, path, block_size=512, partial_tail=False, conversation_ids=False)
    recs = [json.loads(line) for line in path.read_text().splitlines()]
    assert [len(rec["hash_ids"]) for rec in recs] == [r.prompt_len // 512 for r in reqs]
    assert not any("conversation_id" in rec or "turn" in rec for rec in recs)
    assert np.all(np.diff([rec["timestamp"] for rec in recs]) >= 0)
