"""bench/ghost_fidelity.py: each admission filed under its kind, the totals the replay's own."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

SPEC = importlib.util.spec_from_file_location("ghost_fidelity", Path(__file__).parents[2] / "bench" / "ghost_fidelity.py")
gf = importlib.util.module_from_spec(SPEC)
SPEC.loader.exec_module(gf)

MIX = ["--config", "deepseek-v4-flash", "--workload", "mix", "--conversations", "12", "--device-gib", "0.25",
       "--host-gib", "0.25"]


def test_a_kind_is_the_conversation_ids_leading_letters():
    assert [gf.kind_of(c) for c in ("reason-12", "rag-3-4", "syn-0", "agent_7-2", "42", "")] == \
        ["reason", "rag", "syn", "agent", "-", "-"]


def test_every_admission_is_filed_and_the_sums_are_the_replays(capsys):
    assert gf.main(["--json", "--", *MIX]) == 0
    out = json.loads(capsys.readouterr().out)
    rows, replay = out["rows"], out["replay"]
    assert out["follow"] == "lru" and out["candidates"][0] == "lru"
    assert replay["policy_followed"] in ("lru", "lru-tails") and replay["policy_switches"] == 0
    assert {r["kind"] for r in rows} == {"agent", "rag", "reason", "syn"}
    assert replay["preemptions"] == 0   # every lookup a first admission: the sums below are exact
    assert sum(r["lookups"] for r in rows) == replay["requests"] - replay["rejected_requests"]
    page = 256
    assert sum(r["real"] for r in rows) * page == replay["hit_tokens"]
    for name in out["candidates"]:
        assert sum(r[name] for r in rows) == replay["ghost_hit_pages"][name], name


def test_following_another_order_ranks_by_it_throughout(capsys):
    assert gf.main(["--json", "--follow", "reuse-prompt", "--", *MIX]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["candidates"][0] == "reuse-prompt"
    assert out["replay"]["policy_followed"] == "reuse-prompt" and out["replay"]["policy_switches"] == 0


def test_an_order_that_is_not_a_candidate_is_one_line_and_exit_2(capsys):
    assert gf.main(["--follow", "fifo", "--", *MIX]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "--follow fifo" in err


def test_a_bad_replay_argument_is_the_replays_one_line_and_exit_2(capsys):
    assert gf.main(["--", "--config", "deepseek-v4-flash", "--device-gib", "-1"]) == 2
    captured = capsys.readouterr()
    assert captured.err.count("\n") == 1 and "--device-gib" in captured.err and captured.out == ""
