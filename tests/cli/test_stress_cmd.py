"""``hicache stress``: every sweep knob reaches the cache; ``--seeds`` runs many and sums up."""

from __future__ import annotations

import json

from hicache.cli.main import build_parser, main
from hicache.cli.stress_cmd import build_cache
from hicache.engine import stress
from tests.conftest import CONFIGS

TINY = str(CONFIGS / "tiny-hybrid.yaml")
BASE = ["stress", "--config", TINY, "--device-pages", "8", "--host-pages", "12", "--max-running", "2"]


def test_every_flag_reaches_the_cache():
    args = build_parser().parse_args(BASE + [
        "--write-policy", "write_back", "--host-tier", "exclusive", "--eviction", "lfu", "--retention", "none",
        "--device-snapshots", "3", "--host-snapshots", "5", "--max-queued-ops", "1", "--adaptive-window", "5",
        "--adaptive-floor", "off", "--adaptive-record", "2"])
    cache = build_cache(args)
    try:
        cfg = cache.config
        assert (cfg.write.write_policy, cfg.write.host_tier, cfg.tree.eviction, cfg.tree.retention_interval) == (
            "write_back", "exclusive", "lfu", None)
        assert (cfg.tree.adaptive_window, cfg.tree.adaptive_floor, cfg.tree.adaptive_record) == (5, False, 2)
        assert (cfg.pools.device_pages, cfg.pools.host_pages, cfg.pools.device_snapshots,
                cfg.pools.host_snapshots) == (8, 12, 3, 5)
        assert cache._copies._ctl.cfg.max_queued_ops == 1
        assert cache.stats()["device_states_total"] == 3 and cache.stats()["host_states_total"] == 5
    finally:
        cache.close()
    args = build_parser().parse_args(BASE + ["--retention", "32"])
    cache = build_cache(args)
    try:   # defaults: the config's policies, 8 / 16 snapshots for a layout with state, 4096 queued ops
        assert cache.config.tree.retention_interval == 32 and cache.config.tree.eviction == "lru"
        assert (cache.config.pools.device_snapshots, cache.config.pools.host_snapshots) == (8, 16)
        assert cache._copies._ctl.cfg.max_queued_ops == 4096
        assert (cache.config.tree.adaptive_floor, cache.config.tree.adaptive_record) == (True, 4)
    finally:
        cache.close()


def test_write_policy_and_host_tier_flags_override_a_config_with_an_exclusive_host_tier():
    """The V4 configs ship write_back + exclusive; asking for write_through + inclusive must
    replace the pair together (one at a time, write_through met exclusive and was refused:
    the reliability sweep's draws of it all failed)."""
    for policy in ("write_through", "write_through_selective"):
        args = build_parser().parse_args(["stress", "--config", "deepseek-v4-flash", "--device-pages", "8",
                                          "--host-pages", "12", "--write-policy", policy, "--host-tier", "inclusive"])
        cache = build_cache(args)
        try:
            assert (cache.config.write.write_policy, cache.config.write.host_tier) == (policy, "inclusive")
        finally:
            cache.close()


def run_json(capsys, *flags) -> tuple[int, dict, str]:
    rc = main([*BASE, "--json", *flags])
    out = capsys.readouterr()
    return rc, json.loads(out.out), out.err


def test_single_seed_reports_injected_faults(capsys):
    # How many layers a run copies varies with its threads' timing (L3 fetches, acks); at a
    # 5% rate a 300-op run sometimes drew no fault at all, so the rate is high enough here
    # that every run draws several.
    rc, out, _ = run_json(capsys, "--ops", "300", "--seed", "2", "--fault-rate", "0.3")
    assert rc == 0 and out["seed"] == 2 and out["injected_faults"] > 0 and out["crashes"] == 0
    assert out["copy_failures"] > 0 and out["verified_pages"] > 0


def test_seeds_run_each_seed_and_sum_up(capsys):
    rc, out, err = run_json(capsys, "--ops", "150", "--seeds", "3-5", "--fault-rate", "0.3",
                            "--write-policy", "write_back", "--eviction", "lfu")
    assert rc == 0 and out["seeds"] == "3-5" and out["seeds_run"] == 3
    assert out["failed_seeds"] == 0 and out["first_failing_seed"] is None and out["first_error"] is None
    assert out["ops"] == 450 and out["verified_pages"] > 0 and out["injected_faults"] > 0
    assert out["integrity_errors"] == out["mismatched_pages"] == out["crashes"] == 0
    assert "stress seeds: 3/3" in err                     # progress across seeds


def test_first_failing_seed_and_its_error(capsys, monkeypatch):
    real_step = stress.StressRunner.step

    def step(self):
        if self.cfg.seed == 6 and self.report.ops == 7:
            raise RuntimeError("planted")
        real_step(self)

    monkeypatch.setattr(stress.StressRunner, "step", step)
    rc, out, _ = run_json(capsys, "--ops", "40", "--seeds", "5-7")
    assert rc == 1 and out["seeds_run"] == 3 and out["failed_seeds"] == 1 and out["crashes"] == 1
    assert out["first_failing_seed"] == 6 and out["failing_seeds"] == [6]
    assert out["first_error"].startswith("op 7: RuntimeError: planted at ")
    assert out["ops"] == 40 + 7 + 40                      # the sweep went on after seed 6
    main([*BASE, "--ops", "40", "--seeds", "5-7"])       # the table names the seed and how to rerun it
    text = capsys.readouterr().out
    assert "first failing seed 6: op 7: RuntimeError: planted" in text and "--seed 6" in text


def test_integrity_errors_fail_the_sweep(capsys, monkeypatch):
    from hicache.cache import HiCache

    def broken(self):
        raise AssertionError("planted invariant")

    monkeypatch.setattr(HiCache, "check_integrity", broken)
    rc, out, _ = run_json(capsys, "--ops", "5", "--seeds", "0-1")
    assert rc == 1 and out["failed_seeds"] == 2 and out["first_failing_seed"] == 0
    assert out["integrity_errors"] == 2 * (5 + 1)        # after every op and once at the end
    assert out["first_error"] == "op 0: planted invariant"


def test_shared_budget_runs_clean_over_seeds(capsys):
    args = build_parser().parse_args(BASE + ["--budget", "shared", "--device-snapshots", "2", "--host-snapshots", "3"])
    cache = build_cache(args)
    try:   # the same bytes as 8 pages + 2 snapshots, as one arena
        lay = cache.layout
        assert cache.config.pools.budget == "shared" and cache.pools.device.budget == "shared"
        assert cache.pools.device.nbytes == 8 * lay.object_bytes("page") + 2 * lay.object_bytes("state")
    finally:
        cache.close()
    rc, out, _ = run_json(capsys, "--budget", "shared", "--device-snapshots", "2", "--host-snapshots", "3",
                          "--ops", "300", "--seeds", "0-2", "--fault-rate", "0.05", "--write-policy", "write_back",
                          "--host-tier", "exclusive")
    assert rc == 0 and out["seeds_run"] == 3 and out["failed_seeds"] == 0
    assert out["integrity_errors"] == out["mismatched_pages"] == out["crashes"] == 0
    assert out["verified_pages"] > 0
