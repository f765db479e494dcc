"""``hicache sweep``: one replay per host budget, and kvcache-simulator's figures exactly as
``kvcache-simulator run`` prints them for the same trace and budget."""

from __future__ import annotations

import json

import pytest

from hicache.cli.main import main
from hicache.engine.workloads import synthetic, write_trace

ARGS = ["--config", "tiny-hybrid", "--device-gib", "0.00003", "--host-gib", "0.00002,0.00005", "--quiet"]


@pytest.fixture(scope="module")
def trace(tmp_path_factory):
    reqs = synthetic(24, 3, system_prompts=2, system_len=60, turns=(2, 5), user_len=(10, 120), output_len=(10, 80))
    path = tmp_path_factory.mktemp("sweep") / "t.jsonl"
    write_trace(reqs, path, block_size=16)
    return path


def test_sweep_matches_kvcache_simulator_run(trace, tmp_path, capsys):
    cli = pytest.importorskip("kvcache_sim.cli")
    plot = tmp_path / "sweep.png"
    assert main(["sweep", *ARGS, "--trace", str(trace), "--json", "--plot", str(plot)]) == 0
    out = json.loads(capsys.readouterr().out)
    assert {"points", "ceiling", "sim_model", "sim_kv_precision", "sim_indexer_precision"} <= set(out)
    assert plot.stat().st_size > 0 and out["skipped_records"] == 0
    assert [p["sim_status"] for p in out["points"]] == ["measured", "measured"]
    for p in out["points"]:
        for key in ("device_gib", "host_gib", "hit_rate", "hit_rate_last_half", "sim_gib", "sim_blocks",
                    "sim_lru", "sim_optimal", "ttft_p50_s", "l3_hit_tokens"):
            assert key in p, key
        assert p["mismatched_pages"] == 0 and p["verified_pages"] > 0
        assert p["sim_blocks"] == (p["device_pages"] + p["host_pages"]) * 16 // 16
        # our reference reads the trace as the simulator does: its block LRU is the simulator's
        assert p["ref_block_lru"] == pytest.approx(p["sim_lru"], abs=1e-9)
        assert p["ref_hybrid_lru"] is not None
    assert out["ref_chunk_blocks"] == 4096 // 16
    for p in out["points"]:
        dump = tmp_path / "sim.json"
        assert cli.main(["run", "--trace", str(trace), "--model", out["sim_model"], "--budgets-gib",
                         repr(p["sim_gib"]), "--policies", "lru,optimal", "--format", "json",
                         "--no-progress", "--output", str(dump)]) == 0
        (point,) = json.loads(dump.read_text())["points"]
        assert point["cacheBlocks"] == p["sim_blocks"]
        assert abs(point["results"]["lru"]["hitRate"] - p["sim_lru"]) * 100 < 0.5
        assert abs(point["results"]["optimal"]["hitRate"] - p["sim_optimal"]) * 100 < 0.5


def test_sweep_table_workload_and_bad_budgets(capsys):
    assert main(["sweep", *ARGS, "--workload", "synthetic", "--conversations", "6", "--no-sim"]) == 0
    table = capsys.readouterr().out
    assert "hicache sweep: tiny-hybrid" in table and "kvcache-simulator not run" in table
    assert main(["sweep", *ARGS[:-3], "--host-gib", "1,x", "--quiet"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "--host-gib" in err[0]


def test_sweep_table_prints_the_hybrid_reference_and_none_without_state(trace, capsys):
    pytest.importorskip("kvcache_sim.cli")
    assert main(["sweep", *ARGS, "--trace", str(trace)]) == 0
    table = capsys.readouterr().out
    assert "hybrid LRU" in table and "what the resume rule costs LRU" in table
    assert main(["sweep", "--config", "tiny-mha", *ARGS[2:], "--trace", str(trace), "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert all(p["ref_hybrid_lru"] is None and p["ref_block_lru"] is not None for p in out["points"])


def test_the_simulators_capacity_is_counted_tier_by_tier(configs_dir):
    from hicache.cli.sweep_cmd import _capacity_tokens
    from hicache.config import load_config
    from hicache.engine import kvsim

    layout, _ = load_config(configs_dir / "deepseek-v4-flash.yaml")
    P, page, snap = layout.page_tokens, layout.object_bytes("page"), layout.object_bytes("state")
    s = {"device_pages": 200, "host_pages": 300, "device_bytes": 2**28, "host_bytes": 2**29}
    arena = lambda b: kvsim.shared_capacity_tokens(b, page, snap, P, 5000.0)   # noqa: E731
    assert _capacity_tokens(s, "split", layout, 5000.0) == 500 * P
    assert _capacity_tokens(s, "shared_host", layout, 5000.0) == 200 * P + arena(2**29)
    assert _capacity_tokens(s, "shared", layout, 5000.0) == arena(2**28) + arena(2**29)
    assert 300 * P < arena(2**29) < 2**29 // page * P     # bytes at one snapshot per mean prompt


def test_sweep_bytes_none_gives_the_byte_sweeps_points_and_jobs_the_same(trace, capsys):
    runs = {}
    for name, extra in (("real", []), ("none", ["--bytes", "none"]), ("none-jobs", ["--bytes", "none", "--jobs", "2"])):
        assert main(["sweep", *ARGS, "--trace", str(trace), "--no-sim", "--json", *extra]) == 0
        runs[name] = json.loads(capsys.readouterr().out)
    assert (runs["real"]["bytes"], runs["none"]["bytes"], runs["none"]["verify"]) == ("real", "none", "off")
    keys = [k for k in runs["real"]["points"][0] if k not in ("wall_s", "verified_pages")]
    for p, q, r in zip(runs["real"]["points"], runs["none"]["points"], runs["none-jobs"]["points"]):
        assert p["verified_pages"] > 0 and q["verified_pages"] == 0 and p["hit_rate"] > 0
        assert {k: q[k] for k in keys} == {k: p[k] for k in keys} == {k: r[k] for k in keys}
    assert main(["sweep", *ARGS, "--trace", str(trace), "--no-sim", "--jobs", "2", "--storage", "memory://"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "--jobs" in err[0] and "none://" in err[0], err
