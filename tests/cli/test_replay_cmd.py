"""``hicache replay`` on the synthetic model: JSON keys, policy flags, bad flags."""

from __future__ import annotations

import json

import pytest
import torch

from hicache.cli.main import main
from hicache.cli.replay_report import policy_rows
from hicache.config import TreeConfig

SMALL = ["--config", "deepseek-v4-flash", "--conversations", "4", "--device-pages", "24", "--host-pages", "16",
         "--device-snapshots", "6", "--host-snapshots", "6", "--storage", "memory://", "--quiet", "--json"]


def replay(capsys, *flags):
    rc = main(["replay", *SMALL, *flags])
    return rc, json.loads(capsys.readouterr().out)


@pytest.mark.parametrize("flags", [
    [],
    ["--write-policy", "write_back", "--host-tier", "exclusive"],
    ["--write-policy", "write_back", "--host-tier", "exclusive", "--admission", "greedy", "--max-running", "4"],
    ["--prefetch-policy", "wait_complete", "--state-share", "0.1", "--retention", "0"],
])
def test_policies_replay_with_every_byte_checked(capsys, flags):
    rc, out = replay(capsys, *flags)
    assert rc == 0 and out["mismatched_pages"] == 0 and out["verified_pages"] > 0
    for k in ("requests", "prompt_tokens", "hit_tokens", "hit_rate", "device_hit_tokens", "host_hit_tokens",
              "l3_hit_tokens", "l3_errors", "prompt_tokens_last_half", "hit_tokens_last_half",
              "readmission_recomputed_tokens", "host_released_pages"):
        assert k in out, k
    assert out["hit_tokens"] == out["device_hit_tokens"] + out["host_hit_tokens"] + out["l3_hit_tokens"]
    if "--admission" not in flags:
        # Reserve admission never preempts. (Under write_back it did, once in four to six
        # runs, while a victim's snapshot backup left in flight pinned its parent: 0 in 55
        # runs since that backup is synchronous.)
        assert out["preemptions"] == 0 and out["readmission_recomputed_tokens"] == 0
    if "exclusive" in flags and out["host_hit_tokens"]:
        assert out["host_released_pages"] > 0


def test_device_flag_places_the_pools_and_every_byte_checks(capsys, device):
    rc, out = replay(capsys, "--device", device.type, "--verify", "full")
    assert rc == 0 and out["device"] == device.type
    assert out["mismatched_pages"] == 0 and out["verified_pages"] > 0 and out["hit_tokens"] > 0


@pytest.mark.parametrize("bad, says", [("tpu", "must be 'cpu', 'cuda', 'cuda:N' or 'auto'"),
                                       pytest.param("cuda", "no CUDA device is available", marks=pytest.mark.skipif(
                                           torch.cuda.is_available(), reason="CUDA is available here"))])
def test_a_bad_device_is_one_line(capsys, bad, says):
    rc = main(["replay", *SMALL, "--device", bad])
    out, err = capsys.readouterr()
    assert rc == 2 and out == ""
    assert len(err.splitlines()) == 1 and err.startswith("hicache replay: error:") and says in err, err


@pytest.mark.parametrize("flags, named", [
    (["--host-tier", "exclusive", "--write-policy", "write_through"], "write_back"),
    (["--state-share", "1.5"], "state_share"),
])
def test_bad_policy_flags_are_one_line(capsys, flags, named):
    assert main(["replay", *SMALL, *flags]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("hicache replay: error:") and named in err[0], err


def test_trace_replay_counts_skips_and_writes_one_line_per_replayed_record(capsys, tmp_path):
    lines = ['{"hash_ids": [1, 2], "input_length": 600, "block_size": 256, "output_length": 20}',
             '{"hash_ids": [], "input_length": 90, "block_size": 256}',        # skipped, as the simulator does
             "not json",
             '{"hash_ids": [1, 2, 3], "input_length": 700, "timestamp": 900, "unknown": [1]}']
    trace = tmp_path / "t.jsonl"
    trace.write_text("\n".join(lines) + "\n")
    out_path = tmp_path / "req.jsonl"
    rc, out = replay(capsys, "--trace", str(trace), "--requests-out", str(out_path))
    assert rc == 0 and out["requests"] == 2
    assert (out["skipped_records"], out["parse_errors"]) == (1, 1)
    assert out["first_parse_error"].startswith("t.jsonl:3:")
    rows = [json.loads(x) for x in out_path.read_text().splitlines()]
    assert [r["trace_line"] for r in rows] == [1, 4] and [r["prompt_tokens"] for r in rows] == [600, 700]
    for r in rows:
        assert r["ttft_s"] >= r["queue_s"] >= 0 and r["ttft_uncached_s"] > 0


def test_main_job_serves_hits_from_every_tier_and_shows_the_ceiling(capsys):
    assert main(["replay", "--quiet", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["device_hit_tokens"] > 0 and out["host_hit_tokens"] > 0 and out["l3_hit_tokens"] > 0
    assert out["hit_rate"] < out["ceiling"] <= 1 and out["mismatched_pages"] == 0
    assert out["verify"] == "sample" and out["ttft_p50_s"] is not None


@pytest.mark.parametrize("budget, landing", [("split", "wallclock"), ("shared_host", "step"), ("shared", "step")])
def test_budget_and_copy_landing_flags_reach_the_run(capsys, budget, landing):
    flags = ["--budget", budget, "--copy-landing", landing]
    if budget == "shared":   # counts size split tiers only: give the arenas bytes
        flags = ["--config", "deepseek-v4-flash", "--conversations", "4", "--device-gib", "0.03", "--host-gib",
                 "0.02", "--storage", "memory://", "--quiet", "--json", *flags]
        rc = main(["replay", *flags])
        out = json.loads(capsys.readouterr().out)
    else:
        rc, out = replay(capsys, *flags)
    assert rc == 0 and out["mismatched_pages"] == 0 and out["verified_pages"] > 0
    assert (out["budget"], out["copy_landing"]) == (budget, landing)


@pytest.mark.parametrize("names, expect", [("lru,reuse-prompt", ["lru", "reuse-prompt"]), ("reuse", ["reuse"])])
def test_candidates_flag_reaches_the_run(capsys, names, expect):
    rc, out = replay(capsys, "--eviction", "adaptive", "--candidates", names, "--adaptive-window", "20")
    assert rc == 0 and out["adaptive_candidates"] == expect and out["mismatched_pages"] == 0
    assert out["policy_followed"] in expect
    # one candidate runs no ghosts; several report each one's ghost hits
    assert sorted(out["ghost_hit_pages"]) == (sorted(expect) if len(expect) > 1 else [])


@pytest.mark.parametrize("floor, expect", [(None, True), ("off", False), ("on", True)])
def test_adaptive_floor_flag_reaches_the_run(capsys, floor, expect):
    flags = ["--adaptive-floor", floor] if floor else []
    rc, out = replay(capsys, "--eviction", "adaptive", "--adaptive-window", "20", *flags)
    assert rc == 0 and out["adaptive_floor"] is expect and out["mismatched_pages"] == 0


@pytest.mark.parametrize("z, expect", [(None, 2.0), ("0", 0.0), ("3.5", 3.5)])
def test_adaptive_z_flag_reaches_the_run(capsys, z, expect):
    flags = ["--adaptive-z", z] if z else []
    rc, out = replay(capsys, "--eviction", "adaptive", "--adaptive-window", "20", *flags)
    assert rc == 0 and out["adaptive_z"] == expect and out["mismatched_pages"] == 0


@pytest.mark.parametrize("trial, expect", [(None, TreeConfig().adaptive_trial), ("0", 0), ("7", 7)])
def test_adaptive_trial_flag_reaches_the_run(capsys, trial, expect):
    flags = ["--adaptive-trial", trial] if trial else []
    rc, out = replay(capsys, "--eviction", "adaptive", "--adaptive-window", "20", *flags)
    assert rc == 0 and out["adaptive_trial"] == expect and out["mismatched_pages"] == 0
    if not expect:
        assert out["policy_trials"] == 0


@pytest.mark.parametrize("n, expect", [(None, TreeConfig().adaptive_dead_outputs), ("0", 0), ("5", 5)])
def test_adaptive_dead_outputs_flag_reaches_the_run(capsys, n, expect):
    flags = ["--adaptive-dead-outputs", n] if n else []
    rc, out = replay(capsys, "--eviction", "adaptive", "--adaptive-window", "20", *flags)
    assert rc == 0 and out["adaptive_dead_outputs"] == expect and out["mismatched_pages"] == 0


@pytest.mark.parametrize("record, expect", [(None, 4), ("1", 1), ("9", 9)])
def test_adaptive_record_flag_reaches_the_run(capsys, record, expect):
    flags = ["--adaptive-record", record] if record else []
    rc, out = replay(capsys, "--eviction", "adaptive", "--adaptive-window", "20", *flags)
    assert rc == 0 and out["adaptive_record"] == expect and out["mismatched_pages"] == 0


@pytest.mark.parametrize("flag, bad", [("--candidates", "lru,nope"), ("--candidates", "lru,lru"),
                                       ("--candidates", ""), ("--adaptive-window", "0"),
                                       ("--adaptive-record", "0"), ("--adaptive-z", "-1"),
                                       ("--adaptive-z", "nan"), ("--adaptive-trial", "-1"),
                                       ("--adaptive-dead-outputs", "-1")])
def test_a_bad_adaptive_flag_is_one_line(capsys, flag, bad):
    assert main(["replay", "--quiet", f"{flag}={bad}"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and flag in err[0]


def test_an_old_config_key_names_what_replaced_it(capsys, tmp_path):
    cfg = tmp_path / "old.yaml"
    text = open("configs/deepseek-v4-flash.yaml").read().replace("cache:\n", "cache:\n  depth_weights: [0, 10]\n", 1)
    cfg.write_text(text)
    assert main(["replay", "--quiet", "--config", str(cfg)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "depth_weights" in err[0] and "adaptive" in err[0]


def test_bytes_none_replays_the_byte_replays_records_policy_only(capsys, tmp_path):
    runs = {}
    for mode in ("real", "none"):
        path = tmp_path / f"{mode}.jsonl"
        rc, out = replay(capsys, "--storage", "none://", "--write-policy", "write_back", "--host-tier", "exclusive",
                         "--bytes", mode, "--requests-out", str(path))
        assert rc == 0 and out["bytes"] == mode
        runs[mode] = out, [json.loads(x) for x in path.read_text().splitlines()]
    (real, real_rows), (none, none_rows) = runs["real"], runs["none"]
    assert real["verified_pages"] > 0 and real["verify"] == "sample"
    assert none["verified_pages"] == 0 and none["verify"] == "off" and none["mismatched_pages"] == 0
    for row in real_rows + none_rows:
        row.pop("verified_pages")
    assert none_rows == real_rows
    for key in ("hit_tokens", "device_hit_tokens", "host_hit_tokens", "d2h_bytes", "h2d_bytes", "virtual_s",
                "device_demoted_pages", "host_released_pages", "ttft_p90_s"):
        assert none[key] == real[key], key


def test_bytes_none_table_says_policy_only(capsys):
    flags = [f for f in SMALL if f != "--json"]
    assert main(["replay", *flags, "--storage", "none://", "--bytes", "none"]) == 0
    table = capsys.readouterr().out
    assert "policy-only (--bytes none)" in table and "policy-only run, --bytes none" in table
    assert "nominal: no bytes moved" in table


@pytest.mark.parametrize("flags, named, says", [
    (["--bytes", "none", "--storage", "none://", "--verify", "sample"], "--verify", "needs the pools' bytes"),
    (["--bytes", "none"], "--storage", "add --storage none://"),                       # SMALL's memory://
    (["--bytes", "none", "--storage", "file:///tmp/x"], "--storage", "add --storage none://"),
])
def test_bytes_none_with_what_needs_bytes_is_one_line(capsys, flags, named, says):
    assert main(["replay", *SMALL, *flags]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and named in err[0] and says in err[0], err


def test_bytes_none_names_the_configs_l3_and_the_tiny_model(capsys):
    assert main(["replay", "--quiet", "--bytes", "none"]) == 2   # the main job's config has memory://
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "--storage" in err[0] and "deepseek-v4-flash.yaml" in err[0], err
    assert main(["replay", "--model", "tiny", "--bytes", "none"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "--bytes" in err[0], err
    with pytest.raises(SystemExit) as exc:
        main(["replay", "--bytes", "some"])
    err = capsys.readouterr().err.strip().splitlines()
    assert exc.value.code == 2 and len(err) == 1 and "--bytes" in err[0], err


def test_a_store_written_with_sampled_checks_reads_back_clean_in_full(capsys, tmp_path):
    """Issue 26 part 4: engines sharing a store agree on what a page holds whatever their
    --verify: a file:// store filled by a ``sample`` replay is read by a ``full`` one with
    0 mismatched pages (sample used to write only the sampled words of each row)."""
    url = f"file://{tmp_path}/l3"
    flags = ["--storage", url, "--conversations", "6"]
    rc, first = replay(capsys, *flags, "--verify", "sample")
    assert rc == 0 and first["l3_put_objects"] > 0
    rc, second = replay(capsys, *flags, "--verify", "full")
    assert second["l3_hit_tokens"] > 0 and second["verified_pages"] > 0
    assert rc == 0 and second["mismatched_pages"] == 0


@pytest.mark.parametrize("config, grain_flag, grain, b_hit", [
    ("deepseek-v4-flash", [], 512, 512),                       # auto: the trace's block_size
    ("deepseek-v4-flash", ["--prompt-grain", "0"], 0, 0),      # page boundaries only: 768 is past the share
    ("llama-3.1-8b", [], 0, 512),                              # no state: any page boundary resumes
])
def test_a_traces_block_size_puts_a_snapshot_where_later_prompts_share(capsys, tmp_path, config, grain_flag,
                                                                        grain, b_hit):
    # A's prompt: a whole block and a partial one (900 tokens); B shares A's first block
    # only, so it can resume at 512 -- where A's snapshot sits only on A's block grain
    lines = ['{"hash_ids": [1, 2], "input_length": 900, "block_size": 512, "output_length": 4}',
             '{"hash_ids": [1, 3, 4], "input_length": 1500, "block_size": 512, "output_length": 4, '
             '"timestamp": 100000}']
    trace = tmp_path / "t.jsonl"
    trace.write_text("\n".join(lines) + "\n")
    out_path = tmp_path / "req.jsonl"
    flags = ["--config", config, "--trace", str(trace), "--device-gib", "8.5" if "llama" in config else "0.25",
             "--host-gib", "1", "--storage", "none://", "--bytes", "none", "--quiet", "--json",
             "--requests-out", str(out_path), *grain_flag]
    assert main(["replay", *flags]) == 0
    out = json.loads(capsys.readouterr().out)
    rows = [json.loads(x) for x in out_path.read_text().splitlines()]
    assert out["prompt_grain"] == grain
    assert [r["hit_tokens"] for r in rows] == [0, b_hit]


@pytest.mark.parametrize("bad", ["-1", "half", "1.5"])
def test_a_bad_prompt_grain_is_one_line(capsys, bad):
    assert main(["replay", *SMALL, f"--prompt-grain={bad}"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "--prompt-grain" in err[0]


def test_a_trace_without_block_size_takes_the_flags_as_the_simulator_does(capsys, tmp_path):
    # Mooncake's public traces name no block_size (512 tokens per hash id)
    lines = ['{"hash_ids": [1, 2], "input_length": 900, "output_length": 4}',
             '{"hash_ids": [1, 3, 4], "input_length": 1500, "output_length": 4, "timestamp": 100000}']
    trace = tmp_path / "t.jsonl"
    trace.write_text("\n".join(lines) + "\n")
    flags = ["--config", "deepseek-v4-flash", "--trace", str(trace), "--device-gib", "0.25", "--host-gib", "1",
             "--storage", "none://", "--bytes", "none", "--quiet", "--json"]
    assert main(["replay", *flags]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "block_size" in err[0] and "--block-size" in err[0]
    out_path = tmp_path / "req.jsonl"
    assert main(["replay", *flags, "--block-size", "512", "--requests-out", str(out_path)]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["trace_block_size"] == 512 and out["prompt_grain"] == 512
    assert [json.loads(x)["hit_tokens"] for x in out_path.read_text().splitlines()] == [0, 512]


@pytest.mark.parametrize("flags, says", [
    (["--block-size", "512"], "--trace only"),
    (["--trace", "t.jsonl", "--block-size", "0"], "--block-size"),
])
def test_a_misplaced_or_bad_block_size_is_one_line(capsys, tmp_path, monkeypatch, flags, says):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "t.jsonl").write_text('{"hash_ids": [1], "input_length": 9}\n')
    assert main(["replay", "--config", "deepseek-v4-flash", "--quiet", *flags]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "--block-size" in err[0] and says in err[0]


def test_the_table_names_the_followed_order_its_switches_and_trials():
    s = {"eviction": "adaptive", "policy_followed": "value", "policy_switches": 2, "policy_trials": 3,
         "policy_looked_up_pages": 1000, "policy_regret_pages": 25, "ghost_hit_pages": {"lru": 800, "value": 850},
         "hit_tokens": 1000, "policy_ghost_hit_tokens": 990}
    assert policy_rows(s) == [
        ["eviction adaptive: following / switches / trials", "value / 2 / 3"],
        ["  regret (best candidate's ghost hits - followed)", "2.50% of looked-up pages"],
        ["  ghost hit rate: lru", "80.0%"], ["  ghost hit rate: value", "85.0%"],
        ["  followed ghosts' hits / the cache's hits", "0.990"]]
    assert policy_rows({"eviction": "lru"}) == [["eviction", "lru"]]
