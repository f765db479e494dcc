"""TinyV4Config validation and the layout generated from it."""

from __future__ import annotations

import pytest

from hicache.engine.tiny_model import TinyV4Config, layout_for
from hicache.errors import ConfigError
from hicache.pools import PoolConfig, TierPools, plan_pools


def test_default_layout_has_every_domain_family_with_true_sizes():
    cfg = TinyV4Config()  # ratios 0 0 4 8 4 8, W 8, head_dim 16, index_dim 8, page 16
    lay = layout_for(cfg)
    got = [(f.name, f.kind, f.layer_ids, f.tokens_per_row, f.row_bytes, f.rows_kept)
           for f in lay.families]
    assert got == [
        ("swa_kv", "state", (0, 1, 2, 3, 4, 5), 1, 16 * 8, 7),
        ("c4_kv", "history", (2, 4), 4, 16 * 8, 0),
        ("c4_indexer", "history", (2, 4), 4, 8 * 8, 0),
        ("c8_kv", "history", (3, 5), 8, 16 * 8, 0),
        ("c4_state", "state", (2, 4), 1, 2 * 16 * 8, 4),
        ("c4_indexer_state", "state", (2, 4), 1, 2 * 8 * 8, 4),
        ("c8_state", "state", (3, 5), 1, 2 * 16 * 8, 0),
    ]
    assert lay.page_tokens == 16
    # Per page: c4_kv 2 layers x 4 rows x 128 B, c4_indexer 2 x 4 x 64, c8_kv 2 x 2 x 128.
    assert lay.history_bytes_per_page == 1024 + 512 + 512
    # Per snapshot: swa 6 x 7 x 128, c4_state 2 x 4 x 256, c4_indexer_state 2 x 4 x 128.
    assert lay.state_bytes_per_snapshot == 5376 + 2048 + 1024
    assert lay.has_state


def test_layout_for_several_hca_ratios_and_no_swa_only_layers():
    cfg = TinyV4Config(compress_ratios=(16, 4, 8, 4), page_tokens=32, window=40)
    lay = layout_for(cfg)
    assert [f.name for f in lay.families] == [
        "swa_kv", "c4_kv", "c4_indexer", "c8_kv", "c16_kv",
        "c4_state", "c4_indexer_state", "c8_state", "c16_state"]
    assert lay.family("c16_kv").layer_ids == (0,)
    assert lay.family("swa_kv").rows_kept == 39
    assert lay.family("c16_state").rows_kept == 0


def test_layout_is_deterministic_and_sizes_pools():
    a, b = layout_for(TinyV4Config()), layout_for(TinyV4Config(seed=9))
    assert a.fingerprint == b.fingerprint  # weights differ, geometry does not
    assert a.fingerprint != layout_for(TinyV4Config(window=9)).fingerprint
    plan = plan_pools(a, PoolConfig(device_bytes=1 << 20, host_bytes=1 << 21))
    pools = TierPools(a, "device", num_pages=plan.device_pages, num_snapshots=plan.device_snapshots)
    assert tuple(pools.view("c4_kv").shape) == (2, plan.device_pages, 4 * 128)
    assert tuple(pools.view("c8_state").shape) == (2, plan.device_snapshots, 0)
    pools.check_integrity()


@pytest.mark.parametrize("kwargs, field", [
    ({"compress_ratios": (0, 0)}, "compress_ratios"),
    ({"compress_ratios": ()}, "compress_ratios"),
    ({"compress_ratios": (4, 5)}, "compress_ratios[1]"),
    ({"compress_ratios": (4, -8)}, "compress_ratios[1]"),
    ({"compress_ratios": (4, True)}, "compress_ratios[1]"),
    ({"compress_ratios": "4,8"}, "compress_ratios"),
    ({"window": 1}, "window"),
    ({"rope_dim": 3}, "rope_dim"),
    ({"rope_dim": 18}, "rope_dim"),
    ({"index_rope_dim": 10}, "index_rope_dim"),
    ({"vocab": 1}, "vocab"),
    ({"hidden": 2.5}, "hidden"),
    ({"max_positions": 8}, "max_positions"),
    ({"norm_eps": 0}, "norm_eps"),
])
def test_bad_config_names_the_field(kwargs, field):
    with pytest.raises(ConfigError) as exc:
        TinyV4Config(**kwargs)
    assert exc.value.field == field


def test_ratios_accessors():
    cfg = TinyV4Config(compress_ratios=[0, 4, 8, 4])
    assert cfg.compress_ratios == (0, 4, 8, 4)  # lists are frozen into tuples
    assert cfg.ratios == (4, 8)
    assert cfg.layers_with_ratio(4) == (1, 3)
    assert cfg.is_csa(1) and not cfg.is_csa(2)
    assert hash(cfg) == hash(TinyV4Config(compress_ratios=(0, 4, 8, 4)))
