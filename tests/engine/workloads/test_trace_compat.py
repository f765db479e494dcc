"""Traces are read exactly as kvcache-simulator 0.1.3 reads them: same requests, same skips."""

from __future__ import annotations

import gzip
import json

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from hicache.engine.workloads import read_trace, synthetic, write_trace
from hicache.errors import ConfigError
from tests.engine.workloads.helpers import check_workload

sim_trace = pytest.importorskip("kvcache_sim.trace")


def sim_tokens(parsed) -> list[list[int]]:
    s = parsed.request_starts
    return [parsed.tokens[s[i]:s[i + 1]] for i in range(parsed.request_count)]


def assert_same_as_simulator(path, **kw):
    ours = read_trace(path, **kw)
    sim = sim_trace.parse_trace_file(path, **kw)
    assert (ours.skipped_records, ours.parse_errors, ours.block_size) == \
        (sim.skipped_records, sim.parse_errors, sim.block_size)
    assert len(ours.requests) == sim.request_count
    assert ours.hashed_tokens == sim.total_input_tokens
    return ours, sim


MESSY = [
    "", "   ",
    '{"hash_ids": [0, 1], "input_length": 480, "block_size": 256, "timestamp": 10, "extra": {"a": 1}}',
    "{not json at all",
    "[1, 2, 3]",
    '"a string"',
    '{"input_length": 100, "block_size": 256}',                      # no hash_ids: skipped
    '{"hash_ids": [], "input_length": 100, "block_size": 256}',      # short prompt: skipped
    '{"hash_ids": "0", "input_length": 100}',                        # not a list: skipped
    '{"hash_ids": [0], "input_length": 480, "timestamp": 5}',        # full blocks only, earlier ts
    '{"hash_ids": ["0", 7, "x"], "input_length": 600.9, "block_size": "256"}',
    '{"hash_ids": [0, 1, 2, 3], "input_length": "300"}',             # ids past the prompt: 1 token each
    '{"hash_ids": [0, 9], "input_length": 50, "block_tokens": [30, "20"], "output_length": "7"}',
    '{"hash_ids": [0], "input_length": 1000, "output_length": -3, "turn": "x"}',   # long tail
    '{"hash_ids": [0, 1], "input_length": 480, "block_size": null, "timestamp": "soon"}',
    "{\"hash_ids\": [5], \"input_length\": 256, \"note\": \"caf\xc3\xa9 \xff\"}",
    '{"hash_ids": [5], "input_length": 2',
]


@pytest.mark.parametrize("suffix", [".jsonl", ".jsonl.gz"])
def test_messy_trace_gives_the_simulators_requests_and_counts(tmp_path, suffix):
    path = tmp_path / f"messy{suffix}"
    data = "\n".join(MESSY).encode("latin-1") + b"\n"
    path.write_bytes(gzip.compress(data) if suffix.endswith(".gz") else data)
    ours, sim = assert_same_as_simulator(path)
    assert (ours.skipped_records, ours.parse_errors) == (5, 2)
    assert ours.first_parse_error.startswith(f"messy{suffix}:4: not valid JSON")
    assert [r.source_line for r in ours.requests] == [3, 10, 11, 12, 13, 14, 15, 16]
    reqs = ours.requests
    assert [r.prompt_len for r in reqs] == [480, 480, 600, 302, 50, 1000, 480, 256]
    assert [len(t) for t in sim_tokens(sim)] == [2, 1, 3, 4, 2, 1, 2, 1]
    assert sum(sim_tokens(sim)[1]) == 256       # full blocks only: the simulator counts 256 of 480
    assert [r.output_len for r in reqs] == [0, 0, 0, 0, 7, 0, 0, 0]
    assert [r.arrival_s for r in reqs] == [0.0] * 8 and ours.clamped_timestamps == 1
    assert np.array_equal(reqs[0].prompt[:256], reqs[1].prompt[:256])   # id 0 == id "0"
    assert not np.array_equal(reqs[0].prompt[256:480], reqs[1].prompt[256:480])  # tail is its own
    assert np.array_equal(reqs[4].prompt[:30], reqs[0].prompt[:30])     # explicit 30 tokens of id 0


def test_full_blocks_only_multi_turn_trace_replays_with_turns_linked(tmp_path):
    reqs = synthetic(10, 3, system_len=300, turns=(2, 5), user_len=(10, 200), output_len=(5, 150))
    path = tmp_path / "full.jsonl"
    write_trace(reqs, path, block_size=64, partial_tail=False)
    lines = [json.loads(x) for x in path.read_text().splitlines()]
    assert all(len(x["hash_ids"]) == x["input_length"] // 64 for x in lines)
    ours, sim = assert_same_as_simulator(path)
    assert ours.skipped_records == 0 and len(ours.requests) == len(reqs)
    check_workload(ours.requests)   # the unhashed tails were tied to the next turn's blocks
    for a, b in zip(reqs, ours.requests):
        assert (a.prompt_len, a.output_len, a.turn) == (b.prompt_len, b.output_len, b.turn)


def test_short_prompts_are_skipped_as_the_simulator_skips_them(tmp_path):
    reqs = synthetic(12, 5, system_len=20, turns=(1, 4), user_len=(5, 40), output_len=(5, 40))
    path = tmp_path / "short.jsonl"
    write_trace(reqs, path, block_size=64, partial_tail=False)
    short = sum(r.prompt_len < 64 for r in reqs)
    ours, _ = assert_same_as_simulator(path)
    assert ours.skipped_records == short > 0
    assert len(ours.requests) == len(reqs) - short
    assert [r.request_id for r in ours.requests] == list(range(len(ours.requests)))


# -- any record: both accept with the same requests, or both refuse ----------------------

scalar = st.one_of(st.none(), st.booleans(), st.integers(-3, 600), st.floats(-2, 600, allow_nan=False),
                   st.sampled_from(["12", "4.5", "x", "", "256"]))
hash_id = st.one_of(st.integers(0, 6), st.sampled_from(["0", "1", "a", "b"]), st.booleans(), st.floats(0, 3))
record = st.fixed_dictionaries({}, optional={
    "hash_ids": st.one_of(st.lists(hash_id, max_size=5), scalar),
    "input_length": st.one_of(scalar, st.integers(1, 600)),
    "block_size": st.one_of(st.just(16), st.just(16), scalar),
    "block_tokens": st.one_of(st.none(), st.lists(st.one_of(st.integers(-1, 40), scalar), max_size=5)),
    "timestamp": scalar, "output_length": scalar, "turn": scalar,
    "conversation_id": st.sampled_from(["c1", "c2", 3]), "junk": scalar})
line = st.one_of(record.map(json.dumps), st.sampled_from(["{oops", "[]", "7", ""]))


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(lines=st.lists(line, min_size=1, max_size=8), fallback=st.sampled_from([None, 8]))
def test_any_trace_reads_as_the_simulator_reads_it(tmp_path, lines, fallback):
    path = tmp_path / "h.jsonl"
    path.write_text("\n".join(lines) + "\n")
    try:
        sim = sim_trace.parse_trace_file(path, block_size=fallback)
    except ValueError:
        with pytest.raises(ConfigError, match="kvcache-simulator refuses"):
            read_trace(path, block_size=fallback)
        return
    ours = read_trace(path, block_size=fallback)
    assert (ours.skipped_records, ours.parse_errors, ours.block_size, len(ours.requests)) == \
        (sim.skipped_records, sim.parse_errors, sim.block_size, sim.request_count)
    for r, toks in zip(ours.requests, sim_tokens(sim)):
        assert r.prompt_len >= sum(toks) >= 1
