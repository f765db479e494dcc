"""The production trace: written from block ids without tokens, no conversation ids, real
prefix chains (equal ids mean equal prefixes), a low reuse ceiling that the read-back trace
and kvcache-simulator agree on, 512-token and full-block variants, the full size in
seconds, bad input."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from hicache.engine.workloads import (ProductionSpec, production, production_records, read_trace, summarize,
                                      write_production_trace)
from hicache.engine.workloads.__main__ import main as workloads_main
from hicache.errors import ConfigError

def lines(path) -> list[dict]:
    return [json.loads(line) for line in Path(path).read_text().splitlines()]


@pytest.fixture(scope="module")
def trace(tmp_path_factory):
    path = tmp_path_factory.mktemp("prod") / "p.jsonl"
    return path, write_production_trace(path, 1500, 0)


def test_lines_have_no_conversation_ids_and_real_prefix_chains(trace):
    path, written = trace
    recs = lines(path)
    assert len(recs) == written.records == 1500
    assert all(set(r) == {"timestamp", "input_length", "output_length", "block_size", "hash_ids"} for r in recs)
    ts = [r["timestamp"] for r in recs]
    assert ts[0] == 0 and ts == sorted(ts)
    assert all(0 < r["input_length"] <= 131_072 for r in recs)
    assert all(len(r["hash_ids"]) == -(-r["input_length"] // 256) for r in recs)
    # a chain: an id names its whole prefix, so it sits at one position after one parent
    parent: dict[int, tuple[int, int | None]] = {}
    for r in recs:
        for i, h in enumerate(r["hash_ids"]):
            where = (i, r["hash_ids"][i - 1] if i else None)
            assert parent.setdefault(h, where) == where
    # ids are numbered in order of first appearance
    seen = -1
    for r in recs:
        for h in r["hash_ids"]:
            assert h <= seen + 1
            seen = max(seen, h)
    assert written.unique_blocks == seen + 1 and written.total_blocks == sum(len(r["hash_ids"]) for r in recs)


def test_reuse_is_low_and_comes_from_system_prompts_and_sessions(trace):
    path, written = trace
    recs = lines(path)
    stats = written.stats
    assert 0.1 < stats.reuse_ratio < 0.45
    assert written.reused_blocks < 0.15 * written.unique_blocks  # most blocks never recur
    first = {}
    for r in recs:
        first[r["hash_ids"][0]] = first.get(r["hash_ids"][0], 0) + 1
    assert max(first.values()) > 50  # a hot system prompt's first block
    # sessions (not written to the file): turn k+1 repeats turn k's full-block ids, then only
    # new ids (the previous partial block, the output and the new message)
    prev: dict[int, tuple[int, ...]] = {}
    prev_len: dict[int, int] = {}
    highest, continued = -1, 0
    for rec in production_records(1500, 0):
        ids = rec.hash_ids
        if rec.turn > 0:
            full = prev[rec.session][:prev_len[rec.session] // 256]
            assert ids[:len(full)] == full and all(h > highest for h in ids[len(full):])
            assert rec.reusable_tokens == min(len(full), (rec.input_length - 1) // 256) * 256
            continued += 1
        prev[rec.session] = ids
        prev_len[rec.session] = rec.input_length
        highest = max(highest, max(ids))
    assert continued > 20
    assert stats.conversations < stats.requests and stats.max_turns > 1


def test_read_back_and_simulator_agree(trace):
    path, written = trace
    loaded = read_trace(path)
    assert len(loaded.requests) == 1500 and loaded.skipped_records == 0
    assert len({r.conversation_id for r in loaded.requests}) == 1500  # independent requests
    assert loaded.hashed_tokens == written.stats.prompt_tokens
    assert summarize(loaded.requests, page_tokens=256).reusable_tokens == written.stats.reusable_tokens
    in_memory = production(200, 0)  # the first 200 requests of the same stream, as the replay builds them
    assert [(r.prompt.tobytes(), r.output_len, r.arrival_s) for r in in_memory] == \
        [(r.prompt.tobytes(), r.output_len, r.arrival_s) for r in loaded.requests[:200]]
    sim_trace = pytest.importorskip("kvcache_sim.trace")
    parsed = sim_trace.parse_trace_file(path)
    assert (parsed.request_count, parsed.total_input_tokens, parsed.unique_raw_blocks, parsed.skipped_records) == \
        (1500, written.stats.prompt_tokens, written.unique_blocks, 0)


def test_kvcache_simulator_runs_on_it_and_counts_our_ceiling(trace, tmp_path):
    cli = pytest.importorskip("kvcache_sim.cli")
    path, _ = trace
    dump = tmp_path / "sim.json"
    assert cli.main(["run", "--trace", str(path), "--model", "deepseek-v4-flash", "--budgets-gib", "0.25",
                     "--policies", "lru", "--format", "json", "--no-progress", "--output", str(dump)]) == 0
    out = json.loads(dump.read_text())
    # its ceiling is over the last half of the requests; no prompt here is all seen blocks,
    # so its whole-block count and ours (one token short of each prompt) agree exactly
    recs = list(production_records(1500, 0))[750:]
    assert out["hitRateCeiling"] == pytest.approx(sum(r.reusable_tokens for r in recs) /
                                                  sum(r.input_length for r in recs), abs=1e-12)
    (point,) = out["points"]
    assert 0 < point["results"]["lru"]["hitRate"] < out["hitRateCeiling"]


def test_block_size_512_and_full_blocks_only(tmp_path, trace):
    path, written = trace
    big = write_production_trace(tmp_path / "b.jsonl", 1500, 0, block_size=512, partial_tail=False)
    recs, base = lines(tmp_path / "b.jsonl"), lines(path)
    assert [r["input_length"] for r in recs] == [r["input_length"] for r in base]  # lengths don't depend on it
    assert all(r["block_size"] == 512 and len(r["hash_ids"]) == r["input_length"] // 512 for r in recs)
    assert big.stats.page_tokens == 512 and big.stats.reusable_tokens <= written.stats.reusable_tokens
    loaded = read_trace(tmp_path / "b.jsonl")  # prompts under one block have no ids: skipped
    assert loaded.skipped_records == sum(r["input_length"] < 512 for r in recs)
    assert len(loaded.requests) + loaded.skipped_records == 1500


def test_full_size_in_seconds():
    written = write_production_trace(None, 12_000, 1)
    assert written.records == 12_000 and written.stats.prompt_tokens > 100_000_000
    assert written.stats.reuse_ratio < 0.5 and written.stats.max_prompt_tokens <= 131_072


def test_cli_writes_and_refuses(tmp_path, capsys):
    out = tmp_path / "c.jsonl"
    assert workloads_main(["production", "--requests", "300", "--seed", "2", "--write-trace", str(out),
                           "--block-size", "512", "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["trace_written"]["records"] == 300 == len(lines(out))
    assert report["stats"]["page_tokens"] == 512
    for argv in (["production", "--conversations", "5"], ["rag", "--requests", "5"],
                 ["production", "--requests", "0"], ["production", "--page-tokens", "64"],
                 ["production", "--write-trace", str(tmp_path / "absent" / "p.jsonl")]):
        assert workloads_main(argv) == 2
        err = capsys.readouterr().err
        assert len([line for line in err.splitlines() if "error:" in line]) == 1 and "Traceback" not in err


def test_bad_input_names_the_field():
    for kw, name in (({"system_share": 2.0}, "system_share"), ({"turns": (0, 3)}, "turns"),
                     ({"max_prompt_tokens": 1000}, "max_prompt_tokens"), ({"arrival_rate": None}, "arrival_rate"),
                     ({"context_len": (0, 10)}, "context_len"), ({"system_popularity": -1}, "system_popularity")):
        with pytest.raises(ConfigError, match=name):
            ProductionSpec(**kw)
    for call, name in ((lambda: list(production_records(0, 0)), "requests"),
                       (lambda: list(production_records(5, 0, block_size=0)), "block_size"),
                       (lambda: production(5, -1), "seed")):
        with pytest.raises(ConfigError, match=name):
            call()
