"""kvcache-simulator traces: write, load, round trip, token synthesis, bad lines."""

from __future__ import annotations

import gzip
import json

import numpy as np
import pytest

from hicache.engine.workloads import Request, load_trace, read_trace, synthetic, write_trace
from hicache.errors import ConfigError
from tests.engine.workloads.helpers import check_workload


def req(rid: int, prompt: list[int], output: list[int] = (9,), conv: str = "c", turn: int = 0,
        t: float = 0.0) -> Request:
    return Request(rid, conv, turn, t, np.array(prompt, np.int32), np.array(output, np.int32))


def records(path) -> list[dict]:
    opener = gzip.open if str(path).endswith(".gz") else open
    with opener(path, "rt") as fh:
        return [json.loads(line) for line in fh]


def test_written_hash_ids_chain_shared_prefixes(tmp_path):
    a = list(range(100, 110))
    reqs = [req(0, a, t=0.0),                          # blocks [0..3] [4..7] [8,9]
            req(1, a[:8] + [1, 2, 3, 4], t=0.5),        # shares two full blocks
            req(2, [7] + a[1:8], t=1.25),               # first block differs: nothing shared
            req(3, a[:4] + a[:4] + [5], t=2.0)]         # same tokens as block 0, other position
    written = write_trace(reqs, tmp_path / "t.jsonl", block_size=4)
    recs = records(tmp_path / "t.jsonl")
    assert [r["hash_ids"] for r in recs] == [[0, 1, 2], [0, 1, 3], [4, 5], [0, 6, 7]]
    assert [r["input_length"] for r in recs] == [10, 12, 8, 9]
    assert [r["timestamp"] for r in recs] == [0, 500, 1250, 2000]
    assert all(r["block_size"] == 4 and r["output_length"] == 1 for r in recs)
    assert (written.records, written.unique_blocks, written.total_blocks) == (4, 8, 11)


def test_round_trip_keeps_block_structure(tmp_path):
    reqs = synthetic(12, 4, system_len=300, user_len=(10, 400), output_len=(5, 200), turns=(1, 4))
    path = tmp_path / "syn.jsonl.gz"
    write_trace(reqs, path, block_size=64)
    loaded = load_trace(path)
    check_workload(loaded)  # turn k+1 starts with turn k's prompt + output again
    assert len(loaded) == len(reqs)
    for a, b in zip(reqs, loaded):
        assert (a.request_id, a.conversation_id, a.turn, a.prompt_len, a.output_len) == \
            (b.request_id, b.conversation_id, b.turn, b.prompt_len, b.output_len)
        assert abs(a.arrival_s - b.arrival_s) <= 0.0005
    # writing the loaded requests again gives the same file: same ids, same sharing
    write_trace(loaded, tmp_path / "again.jsonl.gz", block_size=64)
    assert records(path) == records(tmp_path / "again.jsonl.gz")


def test_loaded_tokens_follow_block_ids(tmp_path):
    lines = [{"hash_ids": [1, 2, 3], "input_length": 10, "block_size": 4, "output_length": 3},
             {"hash_ids": ["1", 2, 9], "input_length": 12, "block_size": 4},
             {"hash_ids": [5, 3], "input_length": 8, "block_size": 4, "timestamp": 40}]
    path = tmp_path / "t.jsonl"
    path.write_text("\n".join(json.dumps(x) for x in lines) + "\n\n")
    r0, r1, r2 = load_trace(path)
    assert (r0.prompt_len, r1.prompt_len, r2.prompt_len) == (10, 12, 8)
    assert (r0.output_len, r1.output_len) == (3, 0)
    assert np.array_equal(r0.prompt[:8], r1.prompt[:8])          # ids 1 ("1"), 2 shared
    assert np.array_equal(r0.prompt[8:], r2.prompt[4:6])         # partial block 3 = prefix of block 3
    assert not np.array_equal(r1.prompt[8:], r2.prompt[4:])      # id 9 != id 3
    assert not np.array_equal(r2.prompt[:4], r0.prompt[:4])      # id 5 != id 1
    assert r0.prompt.min() >= 16 and (r0.conversation_id, r1.conversation_id) == ("trace-0", "trace-1")
    assert [r.arrival_s for r in (r0, r1, r2)] == [0.0, 0.0, 0.04]


def test_block_tokens_and_fallback_block_size(tmp_path):
    path = tmp_path / "t.jsonl"
    path.write_text(json.dumps({"hash_ids": [1, 2], "input_length": 5, "block_tokens": [3, 2]}) + "\n")
    (r,) = load_trace(path, block_size=4)
    assert r.prompt_len == 5
    (full,) = load_trace(_one(tmp_path, {"hash_ids": [1], "input_length": 4, "block_size": 4}))
    assert np.array_equal(r.prompt[:3], full.prompt[:3])


def _one(tmp_path, record, name="one.jsonl") -> str:
    path = tmp_path / name
    path.write_text((record if isinstance(record, str) else json.dumps(record)) + "\n")
    return str(path)


@pytest.mark.parametrize("lines, match", [
    ([{"hash_ids": [True], "input_length": 4, "block_size": 4}], "hash ids must be integers or strings"),
    ([{"hash_ids": [1.5], "input_length": 4, "block_size": 4}], "hash ids must be integers or strings"),
    ([{"hash_ids": [1], "input_length": 0, "block_size": 4}], "input_length"),
    ([{"hash_ids": [1], "input_length": "4.5", "block_size": 4}], "input_length"),
    ([{"hash_ids": [1], "block_size": 4}], "input_length"),
    ([{"hash_ids": [1], "input_length": 4}], "block_size"),
    ([{"hash_ids": [1], "input_length": 4, "block_size": 0}], "block_size"),
    ([{"hash_ids": [1], "input_length": 4, "block_size": 4},
      {"hash_ids": [1], "input_length": 8, "block_size": 8}], "differs from the trace's 4"),
    ([{"hash_ids": [1, 2], "input_length": 5, "block_size": 4, "block_tokens": [4]}], "one token count"),
    ([{"hash_ids": [1, 2], "input_length": 5, "block_size": 4, "block_tokens": [4, 0]}], "positive"),
    (["{not json", "[1, 2]", {"hash_ids": [], "input_length": 3}], "has no usable records"),
    ([], "has no usable records"),
])
def test_what_the_simulator_refuses_is_refused_naming_the_line(tmp_path, lines, match):
    path = tmp_path / "bad.jsonl"
    path.write_text("".join((x if isinstance(x, str) else json.dumps(x)) + "\n" for x in lines))
    with pytest.raises(ConfigError, match=match) as info:
        load_trace(path)
    assert "kvcache-simulator refuses" in str(info.value)
    if "usable" not in match:
        assert "bad.jsonl:" in str(info.value)
    sim_trace = pytest.importorskip("kvcache_sim.trace")
    with pytest.raises(ValueError):
        sim_trace.parse_trace_file(path)


def test_missing_file_and_bad_block_size(tmp_path):
    with pytest.raises(ConfigError, match="no such file"):
        load_trace(tmp_path / "absent.jsonl")
    with pytest.raises(ConfigError, match="block_size"):
        write_trace([req(0, [20, 21])], tmp_path / "x.jsonl", block_size=0)


def test_simulator_accepts_our_file(tmp_path):
    sim_trace = pytest.importorskip("kvcache_sim.trace")
    from kvcache_sim.plan import build_execution_plan

    reqs = synthetic(15, 9, system_len=100, turns=(1, 3), user_len=(10, 90), output_len=(5, 60))
    written = write_trace(reqs, tmp_path / "s.jsonl", block_size=32)
    parsed = sim_trace.parse_trace_file(tmp_path / "s.jsonl")
    assert (parsed.request_count, parsed.block_size, parsed.parse_errors, parsed.skipped_records) == \
        (len(reqs), 32, 0, 0)
    assert parsed.total_input_tokens == sum(r.prompt_len for r in reqs)
    # chained ids: the simulator's prefix trie has exactly one node per distinct id
    assert build_execution_plan(parsed).unique_blocks == parsed.unique_raw_blocks == written.unique_blocks


def test_continuation_only_for_named_turns_and_can_be_off(tmp_path):
    reqs = synthetic(6, 2, turns=(3, 3), system_len=50, user_len=(5, 60), output_len=(5, 60))
    path = tmp_path / "t.jsonl"
    write_trace(reqs, path, block_size=32)
    plain = load_trace(path, continuation=False)
    check_workload(plain, prefix_chain=False)
    linked = load_trace(path)
    broken = 0
    for a, b, c in zip(reqs, plain, linked):
        full = a.prompt_len // 32 * 32
        assert np.array_equal(b.prompt[:full], c.prompt[:full])  # full blocks: tokens of their ids
        assert b.output_len == c.output_len == a.output_len
    by_key = {(r.conversation_id, r.turn): r for r in plain}
    for r in plain:
        nxt = by_key.get((r.conversation_id, r.turn + 1))
        if nxt is not None:
            head = np.concatenate([r.prompt, r.output])
            broken += not np.array_equal(nxt.prompt[:len(head)], head)
    assert broken == 12  # without continuation no turn extends the previous one
    # the simulator sees the same file either way. A plain turn whose prompt is whole blocks
    # is the start of the next one (its tokens are its ids'), but its synthetic output is not:
    # its line says so (the others' open ends have their own tokens, so they are no prefix)
    write_trace(plain, tmp_path / "p.jsonl", block_size=32)
    write_trace(linked, tmp_path / "l.jsonl", block_size=32)
    marked = [i for i, rec in enumerate(records(tmp_path / "p.jsonl")) if rec.get("output_in_next") is False]
    assert marked == [i for i, r in enumerate(plain)
                      if (r.conversation_id, r.turn + 1) in by_key and r.prompt_len % 32 == 0]
    assert marked  # this draw has such turns
    unmarked = [{k: v for k, v in rec.items() if k != "output_in_next"} for rec in records(tmp_path / "p.jsonl")]
    assert records(path) == unmarked == records(tmp_path / "l.jsonl")
    # lines without conversation_id and turn (Mooncake-style) are never linked
    stripped = tmp_path / "s.jsonl"
    anonymous = [{k: v for k, v in rec.items() if k not in ("conversation_id", "turn")}
                 for rec in records(path)]
    stripped.write_text("".join(json.dumps(rec) + "\n" for rec in anonymous))
    for a, b in zip(load_trace(stripped), plain):
        assert np.array_equal(a.prompt, b.prompt) and np.array_equal(a.output, b.output)


def test_alias_cycles_are_refused(tmp_path):
    lines = [{"conversation_id": "a", "turn": 0, "hash_ids": ["x"], "input_length": 2, "block_size": 4},
             {"conversation_id": "a", "turn": 1, "hash_ids": ["y"], "input_length": 3, "block_size": 4},
             {"conversation_id": "a", "turn": 2, "hash_ids": ["x"], "input_length": 4, "block_size": 4}]
    path = tmp_path / "c.jsonl"
    path.write_text("".join(json.dumps(x) + "\n" for x in lines))
    r0, r1, r2 = load_trace(path)
    assert np.array_equal(r0.prompt, r1.prompt[:2])   # x is the start of y
    assert np.array_equal(r0.prompt, r2.prompt[:2])   # x is x wherever it appears


def test_unreadable_traces_are_config_errors(tmp_path):
    p = tmp_path / "t.jsonl.gz"
    p.write_bytes(b"\x1f\x8b\x08\x00 not really gzip")
    with pytest.raises(ConfigError) as exc:
        load_trace(p)
    assert exc.value.field == "trace" and "cannot be read" in str(exc.value)


def test_bad_utf8_is_replaced_as_the_simulator_does(tmp_path):
    # kvcache-simulator opens traces with errors="replace": a line of bad bytes is a parse error.
    p = tmp_path / "t.jsonl"
    p.write_bytes(b'{"hash_ids": [1], "input_length": 4, "block_size": 4}\n\xff\xfe\n')
    loaded = read_trace(p)
    assert len(loaded.requests) == 1 and loaded.parse_errors == 1


def test_requests_too_long_to_materialize_are_refused(tmp_path):
    p = tmp_path / "t.jsonl"
    p.write_text(json.dumps({"hash_ids": [1], "input_length": 10**12, "block_size": 256}) + "\n")
    with pytest.raises(ConfigError, match="materialized"):
        load_trace(p)
