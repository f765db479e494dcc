"""Budgets -> counts, the host-memory guard, and the cache config parser."""

from __future__ import annotations

import pytest

from hicache.config import HiCacheConfig, cache_config_from_mapping, load_config
from hicache.errors import ConfigError
from hicache.layout import CacheLayout
from hicache.pools import PoolConfig, build_pools, plan_pools

GiB = 1024**3
MiB = 1024**2


def flash(configs_dir) -> CacheLayout:
    return CacheLayout.from_yaml(configs_dir / "deepseek-v4-flash.yaml")


def test_plan_splits_budget_by_state_share(configs_dir):
    lay = flash(configs_dir)
    plan = plan_pools(lay, PoolConfig(device_bytes=GiB, host_ratio=2, state_share=0.25),
                      available_bytes=100 * GiB)
    assert plan.page_bytes == lay.history_bytes_per_page == 985664
    assert plan.snapshot_bytes == lay.state_bytes_per_snapshot
    assert plan.device_pages == int(GiB * 0.75) // 985664
    assert plan.device_snapshots == int(GiB * 0.25) // lay.state_bytes_per_snapshot
    assert plan.host_pages == int(2 * GiB * 0.75) // 985664
    assert plan.device_bytes <= GiB and plan.host_bytes <= 2 * GiB


def test_plan_without_state_puts_everything_in_pages():
    lay = CacheLayout.from_hf_config({"num_hidden_layers": 2, "num_attention_heads": 2, "hidden_size": 32},
                                     page_tokens=16)
    plan = plan_pools(lay, PoolConfig(device_bytes=MiB, host_bytes=4 * MiB), available_bytes=100 * GiB)
    assert plan.device_snapshots == 0 and plan.device_pages == MiB // lay.history_bytes_per_page
    assert plan.host_pages == 4 * MiB // lay.history_bytes_per_page


def test_host_budget_over_available_memory_is_refused(configs_dir):
    cfg = PoolConfig(device_bytes=GiB, host_bytes=64 * GiB, host_reserve_bytes=2 * GiB)
    with pytest.raises(ConfigError, match="only 14.00 GiB is available") as exc:
        plan_pools(flash(configs_dir), cfg, available_bytes=16 * GiB)
    assert exc.value.field == "host_bytes"
    with pytest.raises(ConfigError) as exc:
        plan_pools(flash(configs_dir), PoolConfig(device="cpu", device_bytes=GiB, host_ratio=8),
                   available_bytes=8 * GiB)
    assert exc.value.field in ("host_ratio", "device_bytes")


def test_huge_id_counts_are_refused_even_when_ids_hold_no_bytes():
    lay = CacheLayout.from_hf_config({"num_hidden_layers": 2, "num_attention_heads": 4, "hidden_size": 64})
    assert lay.object_bytes("state") == 0    # snapshots cost nothing but their allocator's arrays
    with pytest.raises(ConfigError, match="for their allocators") as exc:
        plan_pools(lay, PoolConfig(device_bytes=MiB, device_snapshots=10**12), available_bytes=16 * GiB)
    assert exc.value.field == "device_snapshots"


def test_budget_too_small_for_one_page(configs_dir):
    with pytest.raises(ConfigError, match="smaller than one history page") as exc:
        plan_pools(flash(configs_dir), PoolConfig(device_bytes=1000), available_bytes=100 * GiB)
    assert exc.value.field == "device_bytes"


@pytest.mark.parametrize("kwargs, field", [
    (dict(device_bytes=0), "device_bytes"), (dict(device_bytes=-5), "device_bytes"),
    (dict(host_ratio=0), "host_ratio"), (dict(state_share=1.0), "state_share"),
    (dict(host_layout="page_last"), "host_layout"), (dict(device="tpu"), "device"),
    (dict(device_pages=-1), "device_pages"), (dict(host_bytes=0), "host_bytes"),
    (dict(host_ratio=float("nan")), "host_ratio"), (dict(host_ratio=float("inf")), "host_ratio"),
    (dict(host_bytes=True), "host_bytes"), (dict(device="cuda:x"), "device"),
])
def test_pool_config_bad_input(kwargs, field):
    with pytest.raises(ConfigError) as exc:
        PoolConfig(**kwargs)
    assert exc.value.field == field


def test_build_pools_from_tiny_config(configs_dir):
    layout, cfg = load_config(configs_dir / "tiny-hybrid.yaml")
    pools = build_pools(layout, cfg.pools)
    assert pools.device.device.type == "cpu" and pools.host.host_layout == "page_first"
    assert pools.plan.host_bytes <= 1 * MiB and pools.plan.device_bytes <= 256 * 1024
    ids = pools.host.alloc("page", 3).ids
    assert pools.device.alloc("state", 1).ok
    pools.host.free("page", ids)
    pools.check_integrity()


def test_cache_config_parsing_and_errors():
    cfg = cache_config_from_mapping({"device_bytes": "2GiB", "host_ratio": 4, "retention_interval": 0,
                                     "storage_url": "redis://127.0.0.1:6379/0"}, model="m")
    assert isinstance(cfg, HiCacheConfig)
    assert cfg.pools.device_bytes == 2 * GiB and cfg.tree.retention_interval == 0
    assert cfg.storage.salt == "m"
    for bad, field in [({"device_byte": 1}, "cache.device_byte"),
                       ({"device_bytes": "lots"}, "cache.device_bytes"),
                       ({"write_policy": "sometimes"}, "cache.write_policy"),
                       ({"eviction": "random"}, "cache.eviction"),
                       ({"retention_interval": -1}, "cache.retention_interval"),
                       ({"adaptive_margin_hits": -0.1}, "cache.adaptive_margin_hits"),
                       ({"adaptive_margin_hits": 2}, "cache.adaptive_margin_hits"),
                       ({"adaptive_floor": "yes"}, "cache.adaptive_floor"),
                       ({"adaptive_record": 0}, "cache.adaptive_record"),
                       ({"adaptive_z": -1}, "cache.adaptive_z"),
                       ({"adaptive_z": "high"}, "cache.adaptive_z"),
                       ({"adaptive_trial": -1}, "cache.adaptive_trial"),
                       ({"adaptive_trial": 2.5}, "cache.adaptive_trial"),
                       ({"adaptive_dead_outputs": -1}, "cache.adaptive_dead_outputs"),
                       ({"adaptive_dead_outputs": "many"}, "cache.adaptive_dead_outputs"),
                       ({"storage_url": "localhost"}, "cache.storage_url"),
                       ({"prefetch_policy": "eager"}, "cache.prefetch_policy"),
                       ({"write_through_threshold": 0}, "cache.write_through_threshold")]:
        with pytest.raises(ConfigError) as exc:
            cache_config_from_mapping(bad)
        assert exc.value.field == field, bad


def test_load_config_with_hf_override(configs_dir, fixtures_dir):
    layout, _ = load_config(configs_dir / "deepseek-v4-flash.yaml",
                            hf_config=str(fixtures_dir / "deepseek-v4-flash.config.json"))
    assert layout.fingerprint == CacheLayout.from_yaml(configs_dir / "deepseek-v4-flash.yaml").fingerprint


@pytest.mark.parametrize("text", ["inf", float("inf"), float("nan"), "9" * 400 + "GiB", 1e400])
def test_byte_sizes_must_be_finite(text):
    from hicache.units import parse_bytes

    with pytest.raises(ConfigError, match="finite|byte size") as exc:
        parse_bytes(text, "cache.host_bytes")
    assert exc.value.field == "cache.host_bytes"


@pytest.mark.parametrize("value", [1, 0, "yes", "true", None, 1.0])
def test_switches_take_only_true_or_false(value):
    from hicache.units import check_bool

    assert check_bool("cache.adaptive_floor", True) is True and check_bool("f", False) is False
    with pytest.raises(ConfigError) as exc:
        check_bool("cache.adaptive_floor", value)
    assert exc.value.field == "cache.adaptive_floor" and "true or false" in str(exc.value)


@pytest.mark.parametrize("section", [[1, 2], "fast", 3])
def test_cache_section_must_be_a_mapping(section):
    with pytest.raises(ConfigError) as exc:
        cache_config_from_mapping(section, source="c.yaml")
    assert exc.value.field == "cache" and "c.yaml" in str(exc.value)


def test_resolve_device_refuses_unknown_names():
    from hicache.pools.config import resolve_device

    with pytest.raises(ConfigError) as exc:
        resolve_device("nope")
    assert exc.value.field == "device"


def test_shared_plan_is_one_arena_per_tier(configs_dir):
    lay = flash(configs_dir)
    page, snap = lay.object_bytes("page"), lay.object_bytes("state")
    plan = plan_pools(lay, PoolConfig(device_bytes=GiB, host_bytes=2 * GiB, budget="shared"),
                      available_bytes=100 * GiB)
    assert plan.budget == "shared" and (plan.device_arena, plan.host_arena) == (GiB, 2 * GiB)
    assert (plan.device_bytes, plan.host_bytes) == (GiB, 2 * GiB)
    assert plan.device_pages == GiB // page and plan.device_snapshots == GiB // snap
    assert plan.device_state_cap is None and plan.host_state_cap is None
    capped = plan_pools(lay, PoolConfig(device_bytes=GiB, host_bytes=2 * GiB, budget="shared", state_share=0.25),
                        available_bytes=100 * GiB)
    assert capped.device_state_cap == GiB // 4 and capped.device_snapshots == (GiB // 4) // snap
    assert capped.device_pages == GiB // page       # a cap, not a split: pages may use it all


def test_shared_host_plan_splits_the_device_and_makes_the_host_one_arena(configs_dir):
    lay = flash(configs_dir)
    page, snap = lay.object_bytes("page"), lay.object_bytes("state")
    plan = plan_pools(lay, PoolConfig(device_bytes=GiB, host_bytes=2 * GiB, budget="shared_host", state_share=0.25),
                      available_bytes=100 * GiB)
    assert plan.budget == "shared_host" and (plan.device_arena, plan.host_arena) == (None, 2 * GiB)
    assert (plan.device_pages, plan.device_snapshots) == (int(GiB * 0.75) // page, int(GiB * 0.25) // snap)
    assert (plan.host_pages, plan.host_snapshots) == (2 * GiB // page, 2 * GiB // snap)   # no cap on the host
    assert plan.host_state_cap is None and plan.host_bytes == 2 * GiB
    layout, cfg = load_config(configs_dir / "tiny-hybrid.yaml", budget="shared_host")
    pools = build_pools(layout, cfg.pools)
    assert (pools.device.budget, pools.host.budget) == ("split", "shared")
    assert pools.device.arena is None and pools.host.nbytes == cfg.pools.host_bytes
    counted = plan_pools(lay, PoolConfig(device_bytes=GiB, budget="shared_host", host_pages=10, host_snapshots=2),
                         available_bytes=100 * GiB)
    assert counted.host_arena == 10 * page + 2 * snap   # a multiple of the alignment already
    assert counted.host_pages == counted.host_arena // page


def test_shared_pools_size_their_arenas(configs_dir):
    layout, cfg = load_config(configs_dir / "tiny-hybrid.yaml", budget="shared")
    assert cfg.pools.budget == "shared" and cfg.pools.state_share == 0.3
    pools = build_pools(layout, cfg.pools)
    assert pools.device.budget == pools.host.budget == "shared"
    assert pools.device.nbytes == cfg.pools.device_bytes and pools.host.nbytes == cfg.pools.host_bytes
    assert pools.device.arena.state_cap_bytes == int(cfg.pools.device_bytes * 0.3)


def test_split_default_share_is_unchanged(configs_dir):
    lay = flash(configs_dir)
    a = plan_pools(lay, PoolConfig(device_bytes=GiB, host_ratio=2), available_bytes=100 * GiB)
    b = plan_pools(lay, PoolConfig(device_bytes=GiB, host_ratio=2, state_share=0.2), available_bytes=100 * GiB)
    assert a == b


@pytest.mark.parametrize("kwargs, field", [
    (dict(budget="both"), "budget"), (dict(budget="shared", device_pages=4), "device_pages"),
    (dict(budget="shared", host_layout="layer_first"), "host_layout"), (dict(state_share=True), "state_share"),
])
def test_budget_bad_input(kwargs, field):
    with pytest.raises(ConfigError) as exc:
        PoolConfig(**kwargs)
    assert exc.value.field == field
    assert "\n" not in str(exc.value)


@pytest.mark.parametrize("kwargs, field, value", [
    (dict(host_pages=4), "host_pages", 4),                      # smaller than one snapshot
    (dict(host_snapshots=3), "host_snapshots", 3),              # a snapshot count alone
    (dict(host_pages=10**8), "host_pages", 10**8),              # over the machine's memory
])
def test_shared_host_counts_bad_input_names_the_count(configs_dir, kwargs, field, value):
    with pytest.raises(ConfigError) as exc:
        plan_pools(flash(configs_dir), PoolConfig(budget="shared_host", **kwargs), available_bytes=100 * GiB)
    assert (exc.value.field, exc.value.value) == (field, value)
    assert "\n" not in str(exc.value)


def test_an_arena_budget_is_aligned_so_snapshot_objects_are(configs_dir):
    lay = flash(configs_dir)
    odd = 32212254                                   # --device-gib 0.03: not a multiple of 8
    plan = plan_pools(lay, PoolConfig(device_bytes=odd, host_bytes=odd, budget="shared"), available_bytes=100 * GiB)
    assert plan.device_arena == plan.host_arena == odd - odd % 8
    host = plan_pools(lay, PoolConfig(device_bytes=GiB, host_bytes=odd, budget="shared_host"),
                      available_bytes=100 * GiB)
    assert host.host_arena == odd - odd % 8
