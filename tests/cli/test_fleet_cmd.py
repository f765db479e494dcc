"""``hicache fleet``: JSON per engine, fleet totals and baselines; bad flags are one line."""

from __future__ import annotations

import json

import pytest

from hicache.cli.main import main

TINY = ["fleet", "--config", "tiny-hybrid", "--conversations", "4", "--l3-admit-min-tokens", "32",
        "--write-policy", "write_back", "--prefetch-policy", "timeout", "--quiet"]


def test_fleet_reports_each_engine_the_total_and_the_baselines(capsys):
    assert main([*TINY, "--engines", "2", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    fleet = out["fleet"]
    assert len(fleet["per_engine"]) == 2 and out["single"]["engines"] == 1
    total = fleet["total"]
    assert total["requests"] == sum(e["requests"] for e in fleet["per_engine"]) > 0
    assert total["hit_tokens"] == total["device_hit_tokens"] + total["host_hit_tokens"] + total["l3_hit_tokens"]
    assert total["l3_hit_tokens"] > 0 and total["mismatched_pages"] == 0
    assert out["fleet_no_l3"]["total"]["l3_hit_tokens"] == 0
    # the summed budgets (the plan rounds each to whole pages and snapshots)
    assert out["single"]["device_bytes"] == pytest.approx(2 * fleet["device_bytes"], rel=0.01)


def test_fleet_table(capsys):
    assert main([*TINY, "--engines", "2", "--routing", "conversation", "--no-baselines"]) == 0
    text = capsys.readouterr().out
    assert "fleet of 2" in text and "#1" in text and "without L3" not in text


@pytest.mark.parametrize("flags, named", [(["--engines", "0"], "--engines"), (["--engines", "2", "--l3-admit-gbps", "-1"],
                                                                               "l3_admit_gbps")])
def test_bad_fleet_flags_are_one_line(capsys, flags, named):
    assert main([*TINY, *flags]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("hicache fleet: error:") and named in err[0], err


def test_an_unnamed_memory_store_is_named_for_the_fleet_with_its_options():
    from hicache.storage import memory_store_name, with_memory_store_name

    assert [memory_store_name(u) for u in ("memory://", "MEMORY://", "memory:///", "memory://?capacity=4GiB",
                                           "memory://x", "file:///t")] == ["", "", "", "", "x", None]
    assert with_memory_store_name("memory://?capacity=4GiB", "fleet") == "memory://fleet?capacity=4GiB"
