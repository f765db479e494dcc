"""The hybrid reference LRU: exact hits on hand-built traces, and its command line."""

from __future__ import annotations

import json

import pytest

from hicache.engine.hybrid_ref import Request, hit_rate, load_trace, main

BS = 16


def req(blocks, tokens):
    return Request(tuple(blocks), tokens, BS)


def test_a_hybrid_hit_ends_at_a_request_end_or_a_fork():
    # r0, r1 warm up; r2, r3 are measured. r1 leaves r0's path after block 2: a fork
    # snapshot there. r3 reaches block 5 (r2's), which ends no request and no fork.
    reqs = [req([1, 2, 3], 48), req([1, 2, 4], 48), req([1, 2, 5, 6], 74), req([1, 2, 5, 8], 64)]
    assert hit_rate(reqs, 100, hybrid=False) == (32 + 48) / (74 + 64)
    assert hit_rate(reqs, 100, hybrid=True) == (32 + 32) / (74 + 64)


def test_eviction_is_lru_deepest_block_first_and_takes_the_snapshot_it_ends():
    # cap 3: r1 evicts r0's blocks 3 then 2 (same request: deeper first), so r2 finds only
    # block 1 -- a block hit, but no snapshot ends there (block 3's went with it).
    reqs = [req([1, 2, 3], 48), req([4, 5], 32), req([1, 2, 3], 48), req([4, 5], 32)]
    assert hit_rate(reqs, 3, hybrid=False) == 16 / 80
    assert hit_rate(reqs, 3, hybrid=True) == 0.0


def test_a_partial_last_block_counts_for_the_block_lru_only():
    # r2 repeats r0's 40 tokens (2 whole blocks + 8): the simulator counts all 40 as hit; a
    # hybrid cache resumes at the whole-block boundary, 32
    reqs = [req([1, 2, 3], 40), req([4], 16), req([1, 2, 3], 40), req([4], 16)]
    assert hit_rate(reqs, 100, hybrid=False) == 1.0
    assert hit_rate(reqs, 100, hybrid=True) == (32 + 16) / 56


def test_chunk_end_snapshots_let_a_hit_resume_inside_a_long_prompt():
    # chunks of 2 blocks: r0's prefill offers snapshots at blocks 2 and 4 (and its end, 5);
    # r2 reaches block 4 and r3 block 2, which without chunk snapshots end nothing
    reqs = [req([1, 2, 3, 4, 5], 80), req([1, 2, 3, 7], 64), req([1, 2, 3, 4, 8], 80), req([1, 2, 9], 48)]
    assert hit_rate(reqs, 100, hybrid=False) == 96 / 128
    assert hit_rate(reqs, 100, hybrid=True) == 48 / 128
    assert hit_rate(reqs, 100, hybrid=True, chunk_blocks=2) == 96 / 128


def test_command_line_and_bad_input(tmp_path, capsys):
    path = tmp_path / "t.jsonl"
    lines = [{"hash_ids": r.hash_ids, "input_length": r.input_length, "block_size": BS}
             for r in [req([1, 2, 3], 48), req([1, 2, 4], 48), req([1, 2, 5, 6], 74), req([1, 2, 5, 8], 64)]]
    path.write_text("\n".join(json.dumps(x) for x in lines) + "\n")
    assert len(load_trace(path)) == 4
    assert main([str(path), "--blocks", "100,3", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert [p["capacity_blocks"] for p in out] == [100, 3]
    assert out[0]["hybrid_lru"] == pytest.approx(64 / 138)
    assert main([str(path), "--blocks", "10", "--chunk-blocks", "2"]) == 0
    assert "hybrid LRU" in capsys.readouterr().out
    for argv in ([str(path), "--blocks", "x"], [str(path), "--blocks", "0"], [str(tmp_path / "no.jsonl"), "--blocks", "4"],
                 [str(path), "--blocks", "4", "--chunk-blocks", "-1"]):
        assert main(argv) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and err[0].startswith("error:"), err
    path.write_text('{"hash_ids": [1]}\n')
    assert main([str(path), "--blocks", "4"]) == 2
    assert "t.jsonl:1" in capsys.readouterr().err
