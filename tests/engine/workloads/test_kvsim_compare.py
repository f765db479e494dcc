"""bench/kvsim_compare.py: the budget scaling gives kvcache-simulator exactly our capacity."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

from hicache.engine.workloads import synthetic, write_trace
from hicache.errors import ConfigError

kvsim = pytest.importorskip("kvcache_sim")
from kvcache_sim.plan import build_execution_plan  # noqa: E402
from kvcache_sim.policies import simulate_policy  # noqa: E402
from kvcache_sim.trace import parse_trace_file  # noqa: E402

ROOT = Path(__file__).resolve().parents[3]


def load_bench():
    spec = importlib.util.spec_from_file_location("kvsim_compare", ROOT / "bench" / "kvsim_compare.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def trace_path(tmp_path_factory) -> Path:
    reqs = synthetic(60, 1, system_prompts=3, system_len=600, turns=(2, 5), user_len=(50, 400),
                     output_len=(50, 300))
    path = tmp_path_factory.mktemp("kvsim") / "syn.jsonl"
    write_trace(reqs, path, block_size=256)
    return path


def test_capacity_blocks_are_exact_and_match_a_direct_run(trace_path):
    bench = load_bench()
    plan = build_execution_plan(parse_trace_file(trace_path))
    capacity_blocks = plan.unique_blocks // 4
    out = bench.compare(str(trace_path), capacity_blocks * 256 + 100, backend="python")
    assert out["status"] == "measured"
    assert out["capacity_blocks"] == capacity_blocks and out["block_size"] == 256
    assert out["warmup_requests"] == out["requests"] // 2
    for policy in ("lru", "optimal"):
        direct = simulate_policy(plan, policy, capacity_blocks)
        assert out[policy]["hit_tokens"] == direct.hitTokens
        assert out[policy]["total_tokens"] == direct.totalTokens == out["measured_tokens"]
    assert out["lru"]["hit_rate"] <= out["optimal"]["hit_rate"] <= out["ceiling"]["hit_rate"]
    assert out["lru"]["hit_rate"] < out["ceiling"]["hit_rate"]  # the capacity binds
    k = out["kvsim"]
    assert k["kv_precision"] == "fp8_int8" and k["indexer_precision"] == "fp4_int4"
    assert k["bytes_per_block"] == pytest.approx(k["bytes_per_token"] * 256)
    assert kvsim.simulator.cache_blocks_for_gib(k["budget_gib"], k["bytes_per_block"]) == capacity_blocks


def test_whole_trace_capacity_and_errors(trace_path, tmp_path):
    bench = load_bench()
    plan = build_execution_plan(parse_trace_file(trace_path))
    out = bench.compare(str(trace_path), plan.unique_blocks * 256, backend="python")
    assert out["status"] == "capacity_holds_whole_trace"
    assert out["lru"] == out["optimal"] == out["ceiling"]
    with pytest.raises(ConfigError, match="less than one block"):
        bench.compare(str(trace_path), 255, backend="python")
    with pytest.raises(ConfigError, match="no such file"):
        bench.compare(str(tmp_path / "absent.jsonl"), 1024)


def test_command_line_json_uses_our_config_for_bytes(trace_path, capsys):
    bench = load_bench()
    assert bench.main([str(trace_path), "--capacity-tokens", "65536", "--backend", "python", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["capacity_blocks"] == 256
    assert out["ours"]["history_bytes_per_token"] == 3850.25
    assert out["ours"]["history_gib_for_capacity"] == 65536 * 3850.25 / 2**30
    ours_gib = out["ours"]["history_gib_for_capacity"]
    assert out["budget_scale"] == pytest.approx(out["kvsim"]["budget_gib"] / ours_gib)
    assert bench.main([str(trace_path), "--capacity-tokens", "0"]) == 2
