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
    assert out["prompt_grain"] == 16   # auto: the trace's block size (here a page: no extra boundary)
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


# --policies: every (policy, host budget) pair one replay; the simulator once.
POLICIES = ["lru", "value", "adaptive"]
POLICY_ARGS = [*ARGS[:4], "--host-gib", "0.00001,0.00005", "--quiet", "--bytes", "none", "--storage", "none://"]


def test_policies_give_each_policy_what_a_sweep_with_its_eviction_gives(trace, tmp_path, capsys):
    plot = tmp_path / "policies.png"
    assert main(["sweep", *POLICY_ARGS, "--trace", str(trace), "--no-sim", "--json", "--policies", ",".join(POLICIES),
                 "--jobs", "2", "--plot", str(plot)]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["policies"] == POLICIES and out["measure"] == "hit_rate_last_half_sim"   # a trace: its own measure
    assert plot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and plot.stat().st_size > 10_000
    singles = {}
    for name in POLICIES:
        assert main(["sweep", *POLICY_ARGS, "--trace", str(trace), "--no-sim", "--json", "--eviction", name]) == 0
        singles[name] = json.loads(capsys.readouterr().out)
        assert "policies" not in singles[name] and "policies" not in singles[name]["points"][0]   # the old shape
    assert len(out["points"]) == 2
    for i, point in enumerate(out["points"]):
        assert set(point) == {"device_gib", "host_gib", "device_pages", "host_pages", "sim_gib", "sim_blocks",
                              "sim_status", "sim_lru", "sim_optimal", "ref_block_lru", "ref_hybrid_lru", "policies",
                              "sim_status_served", "sim_lru_served", "sim_optimal_served"}
        assert point["sim_lru"] is None and point["sim_status"] is None
        assert point["sim_status_served"] is None   # every request served: no second simulator run
        assert list(point["policies"]) == POLICIES
        for name, entry in point["policies"].items():
            single = singles[name]["points"][i]
            assert {k: single[k] for k in ("device_gib", "host_gib", "device_pages", "host_pages")} == \
                   {k: point[k] for k in ("device_gib", "host_gib", "device_pages", "host_pages")}
            shared = [k for k in single if k in entry and k != "wall_s"]
            assert len(shared) >= 15, shared
            assert {k: entry[k] for k in shared} == {k: single[k] for k in shared}, name
            assert entry["eviction"] == name and entry["measured"] == single["hit_rate_last_half_sim"]
            assert entry["gap_closed"] is None and entry["at_least_sim_lru"] is None
    low = out["points"][0]["policies"]
    assert low["lru"]["hit_rate_last_half"] != low["value"]["hit_rate_last_half"]   # the policies did differ
    assert (low["lru"]["policy_followed"], low["value"]["policy_followed"]) == ("lru", "value")
    assert low["adaptive"]["policy_followed"] in low["adaptive"]["adaptive_candidates"]
    assert set(low["adaptive"]["ghost_hit_pages"]) == set(low["adaptive"]["adaptive_candidates"])

    from hicache.cli.sweep_report import print_policies_table

    print_policies_table(out)
    lines = capsys.readouterr().out.splitlines()
    header = lines[1].split()
    assert header[6:9] == POLICIES and "gap" in header and "follows" in header
    assert lines[3].split()[0] == "1e-05" and lines[4].split()[0] == "5e-05" and lines[5] == ""
    assert any(line.startswith("policy columns: hit_rate_last_half_sim") for line in lines)
    assert "kvcache-simulator not run (not installed, or --no-sim)" in lines


def test_policies_beside_the_simulator_run_it_once_and_close_its_gap(trace, tmp_path, capsys, monkeypatch):
    pytest.importorskip("kvcache_sim.cli")
    from hicache.cli.sweep_report import gap_closed
    from hicache.engine import kvsim

    calls = []
    simulate = kvsim.simulate
    monkeypatch.setattr(kvsim, "simulate", lambda *a, **k: calls.append(a) or simulate(*a, **k))
    plot = tmp_path / "policies.png"
    assert main(["sweep", *POLICY_ARGS, "--trace", str(trace), "--json", "--policies", "lru,value",
                 "--plot", str(plot)]) == 0
    out = json.loads(capsys.readouterr().out)
    assert len(calls) == 1 and plot.stat().st_size > 10_000
    assert main(["sweep", *POLICY_ARGS, "--trace", str(trace), "--json", "--eviction", "value"]) == 0
    single = json.loads(capsys.readouterr().out)
    assert len(calls) == 2 and out["sim_ceiling"] == single["sim_ceiling"]
    keys = ("sim_gib", "sim_blocks", "sim_status", "sim_lru", "sim_optimal", "ref_block_lru", "ref_hybrid_lru")
    closed = []
    for point, p in zip(out["points"], single["points"]):
        assert {k: point[k] for k in keys} == {k: p[k] for k in keys}
        assert point["sim_status"] == "measured" and point["sim_optimal"] > point["sim_lru"]
        assert point["policies"]["value"]["measured"] == p["hit_rate_last_half_sim"]
        for entry in point["policies"].values():
            lru, opt = round(point["sim_lru"], 4), round(point["sim_optimal"], 4)
            assert entry["gap_closed"] == round(gap_closed(entry["measured"], lru, opt), 4)
            assert entry["at_least_sim_lru"] == (entry["measured"] >= lru) == (entry["gap_closed"] >= 0)
            closed.append(entry["gap_closed"])
    assert any(g < 0 for g in closed) and any(g > 0 for g in closed)   # the sign is kept


def test_bad_policies_are_one_line_before_anything_runs(capsys, monkeypatch):
    import hicache.cli.sweep_cmd as sweep_cmd

    def never(*a, **k):
        raise AssertionError("the requests were loaded before --policies was checked")

    monkeypatch.setattr(sweep_cmd, "load_requests", never)
    base = ["sweep", *POLICY_ARGS, "--workload", "synthetic", "--conversations", "2", "--no-sim"]
    for bad in ("lru,bogus", "lru,lru", "", "lru,", "LRU"):
        assert main([*base, "--policies", bad]) == 2, bad
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and "--policies" in err[0], err
        assert "lru,lfu,value,reuse,reuse-prompt,reuse-prompt-late,probation,adaptive" in err[0], err
    assert main([*base, "--policies", "lru,value", "--eviction", "value"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "--policies" in err[0] and "--eviction" in err[0], err


def test_every_policy_must_have_the_same_pools_at_a_budget():
    from hicache.cli.sweep_cmd import _check_same_pools

    pools = {"device_pages": 4, "host_pages": 8, "device_bytes": 64, "host_bytes": 128, "budget": "split"}
    _check_same_pools({"lru": [pools, pools], "value": [pools, dict(pools)]}, [1.0, 2.0])
    with pytest.raises(AssertionError, match="host 2 GiB"):
        _check_same_pools({"lru": [pools, pools], "value": [pools, {**pools, "host_pages": 9}]}, [1.0, 2.0])


def test_a_trace_without_block_size_sweeps_with_the_flag_as_with_the_field(trace, tmp_path, capsys):
    pytest.importorskip("kvcache_sim.cli")
    bare = tmp_path / "bare.jsonl"
    rows = [json.loads(line) for line in trace.read_text().splitlines()]
    bare.write_text("".join(json.dumps({k: v for k, v in r.items() if k != "block_size"}) + "\n" for r in rows))
    flags = [*ARGS, "--bytes", "none", "--storage", "none://", "--json"]
    assert main(["sweep", *flags, "--trace", str(trace)]) == 0
    with_field = json.loads(capsys.readouterr().out)
    assert main(["sweep", *flags, "--trace", str(bare), "--block-size", "16"]) == 0
    with_flag = json.loads(capsys.readouterr().out)
    assert with_flag["sim_block_size"] == 16 and with_flag["prompt_grain"] == 16
    keys = ("hit_rate_last_half", "sim_lru", "sim_optimal", "ref_hybrid_lru", "ref_block_lru")
    assert [[p[k] for k in keys] for p in with_flag["points"]] == [[p[k] for k in keys] for p in with_field["points"]]


def test_requests_longer_than_the_device_are_simulated_over_the_served_ones_or_none(tmp_path, capsys):
    # the 0.00003 GiB device holds a few hundred tokens: some prompts fit, the long ones not
    short = synthetic(6, 5, system_prompts=1, system_len=20, turns=(1, 2), user_len=(10, 40), output_len=(5, 10))
    long = synthetic(4, 6, system_prompts=1, system_len=3000, turns=(1, 2), user_len=(10, 40), output_len=(5, 10))
    paths = {}
    for name, reqs in (("some", short + long), ("all", long)):
        paths[name] = tmp_path / f"{name}.jsonl"
        # two draws whose conversation ids overlap: written as independent requests
        write_trace(reqs, paths[name], block_size=16, conversation_ids=False)
    args = [*ARGS[:4], "--host-gib", "0.00005", "--quiet", "--bytes", "none", "--storage", "none://", "--json"]
    assert main(["sweep", *args, "--trace", str(paths["some"])]) == 0
    some = json.loads(capsys.readouterr().out)
    assert 0 < some["rejected_requests"] < len(short) + len(long)
    assert some["points"][0]["sim_status_served"] not in (None, "none_served")   # the simulator ran on the served
    assert main(["sweep", *args, "--trace", str(paths["all"])]) == 0
    every = json.loads(capsys.readouterr().out)
    point = every["points"][0]
    assert every["rejected_requests"] == len(long) and point["hit_rate"] == 0
    assert (point["sim_status_served"], point["sim_lru_served"], point["sim_optimal_served"]) == ("none_served", None, None)
    assert point["sim_lru"] is not None   # the whole trace, which has no device to be too long for
