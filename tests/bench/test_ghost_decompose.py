"""bench/ghost_decompose.py: each rung's figure on traces small enough to count by hand."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

SPEC = importlib.util.spec_from_file_location("ghost_decompose", Path(__file__).parents[2] / "bench" / "ghost_decompose.py")
gd = importlib.util.module_from_spec(SPEC)
SPEC.loader.exec_module(gd)


def req(hashes, extra=10, out=300):
    return {"input_length": 256 * len(hashes) + extra, "output_length": out, "block_size": 256, "hash_ids": hashes}


def test_a_fork_costs_the_resume_rule_one_miss_and_the_branch_snapshot_serves_the_rest():
    # A, then B and C leave A's path after its first two blocks. Measured half: B2, C2.
    reqs = [req([1, 2, 3, 4]), req([1, 2, 5, 6]), req([1, 2, 7, 8]), req([1, 2, 9, 10])]
    # last half = requests 2 and 3, hashed tokens 2 * 4 * 256 (the trailing 10 are unhashed)
    total = 2 * 4 * 256
    anywhere = gd.replay(reqs, "pages-anywhere", "lru", 1000, 4.0, 256)
    assert anywhere == pytest.approx(2 * 2 * 256 / total)
    # request 1 found no snapshot at 2 and offered one there (branch): 2 and 3 resume at it
    free = gd.replay(reqs, "snapshots-free", "lru", 1000, 4.0, 256)
    assert free == pytest.approx(2 * 2 * 256 / total)
    # measured alone (the last half of [A, B]), B is the miss: A offered no snapshot at 2
    assert gd.replay(reqs[:2], "snapshots-free", "lru", 1000, 4.0, 256) == 0.0
    assert gd.replay(reqs[:2], "pages-anywhere", "lru", 1000, 4.0, 256) == 0.5


def test_idle_decodes_below_a_repeated_prompt_do_not_cost_reuse_prompt_its_resume_point():
    # The same prompt again and again, each with a decode below it, and single-use prompts
    # between: under reuse-prompt the repeats keep resuming at the prompt's end.
    reqs = []
    for i in range(12):
        reqs.append(req([1, 2, 3]))
        reqs.append(req([100 + i, 200 + i]))
    # 20 pages: the repeat (3 pages + a 4-page snapshot) fits beside one single-use request
    # in flight with its decode; each of the last half's 6 repeats resumes at all 3 hashed
    # blocks, the 6 single-use prompts (2 blocks each) miss
    tails = gd.replay(reqs, "tails", "reuse-prompt", 20, 4.0, 256)
    dead = gd.replay(reqs, "tails-dead", "reuse-prompt", 20, 4.0, 256)
    assert tails == dead == pytest.approx(6 * 768 / (6 * 768 + 6 * 512))
    # the rule before 43a105f made the resumed prompt end superseded by the decodes below
    # it: every other repeat missed (0.3); plain LRU keeps the decodes as long as the prompt
    assert gd.replay(reqs, "tails", "lru", 20, 4.0, 256) == 0.0


@pytest.mark.parametrize("record, words", [({"input_length": "x", "hash_ids": [1], "block_size": 256}, ":2.input_length"),
                                           ({"input_length": 5, "hash_ids": [1], "block_size": 0}, ":2.block_size")])
def test_a_record_the_simulator_refuses_is_one_line_naming_it_and_exit_2(tmp_path, capsys, record, words):
    bad = tmp_path / "t.jsonl"
    bad.write_text(json.dumps(req([1, 2])) + "\n" + json.dumps(record) + "\n")
    with pytest.MonkeyPatch.context() as mp:
        mp.chdir(tmp_path)            # the default config is found by name, from anywhere
        assert gd.main(["--trace", str(bad), "--device-gib", "0.25", "--host-gib", "0.5", "--sim-blocks", "10"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "t.jsonl" + words in err


def test_records_the_simulator_skips_are_skipped(tmp_path):
    trace = tmp_path / "t.jsonl"
    trace.write_text(json.dumps({"input_length": 5}) + "\n" + json.dumps(req([1, 2])) + "\n")
    assert gd.read_trace(str(trace)) == [{"input_length": 522, "output_length": 300, "block_size": 256,
                                          "hash_ids": [0, 1]}]


@pytest.mark.parametrize("text, words", [("", "no usable records"),
                                         (json.dumps(req([1], out=1) | {"block_size": 100}) + "\n", "block_size 100")])
def test_an_empty_trace_or_an_odd_block_size_is_one_line_and_exit_2(tmp_path, capsys, text, words):
    bad = tmp_path / "t.jsonl"
    bad.write_text(text)
    assert gd.main(["--trace", str(bad), "--device-gib", "0.25", "--host-gib", "0.5", "--sim-blocks", "10"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and words in err
