"""Synthetic page contents: full and sampled fills agree, and a sampled check still catches
wrong rows, stale rows, truncated copies and other seeds."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from hicache.engine import contents
from hicache.errors import ConfigError
from hicache.layout import CacheLayout, FamilySpec
from hicache.pools.tier import TierPools

P = 4


@pytest.fixture
def tier() -> TierPools:
    layout = CacheLayout((
        FamilySpec("kv", "history", (0, 1, 2), 1, 8),          # 32-byte rows: words
        FamilySpec("odd", "history", (1, 2), 4, 12),           # 12-byte rows: bytes
        FamilySpec("st", "state", (0, 1), 1, 8, rows_kept=3),
    ), P)
    t = TierPools(layout, "device", num_pages=16, num_snapshots=4)
    for name in ("kv", "odd", "st"):
        t.view(name).zero_()
    return t


SEEDS = [contents.seed_of(bytes([i]) * 8) for i in range(1, 9)]


def test_sample_and_full_agree_where_they_overlap(tier):
    ids = list(range(8))
    contents.fill(tier, "page", ids, SEEDS, "full")
    assert contents.check(tier, "page", ids, SEEDS, "full").all()
    assert contents.check(tier, "page", ids, SEEDS, "sample").all()
    assert not contents.check(tier, "page", ids, SEEDS[1:] + SEEDS[:1], "sample").any()
    written = {name: tier.view(name)[:, :8].clone() for name in ("kv", "odd")}
    for name in ("kv", "odd"):
        tier.view(name).zero_()
    contents.fill(tier, "page", ids, SEEDS, "sample")
    assert contents.check(tier, "page", ids, SEEDS, "sample").all()
    # issue 26: the contents do not depend on the mode (a sample writer's L3 objects read
    # back clean in a full reader): every byte, not only the sampled words
    assert contents.check(tier, "page", ids, SEEDS, "full").all()
    for name in ("kv", "odd"):
        assert torch.equal(tier.view(name)[:, :8], written[name]), name
    assert contents.check(tier, "page", ids, SEEDS, "off").all()


def test_sampled_check_catches_wrong_row_stale_row_and_cut_copies(tier):
    ids = list(range(8))
    contents.fill(tier, "page", ids, SEEDS, "sample")
    # a page read from the neighbouring row
    assert not contents.check(tier, "page", [1], [SEEDS[0]], "sample").any()
    # a copy that stopped one byte short, or started one byte late, on any layer
    for name, cut in (("kv", -1), ("odd", -1), ("kv", 0), ("odd", 0)):
        saved = tier.view(name)[:, 3].clone()
        tier.view(name)[1, 3, cut] ^= 0x5A
        assert list(contents.check(tier, "page", ids, SEEDS, "sample")) == [i != 3 for i in ids], name
        tier.view(name)[:, 3] = saved
    # a stale row: the destination kept an older page
    contents.fill(tier, "page", [9], [SEEDS[5]], "sample")
    contents.fill(tier, "page", [10], [SEEDS[5] + 1], "sample")
    assert not contents.check(tier, "page", [9], [SEEDS[5] + 1], "sample").any()
    assert contents.check(tier, "page", [10], [SEEDS[5] + 1], "sample").all()


def test_sampled_positions_move_with_the_seed_and_cover_the_row(tier):
    covered = np.zeros(tier.view("kv").view(torch.int64).shape[2], bool)
    for s in range(200):
        tier.view("kv").zero_()
        contents.fill(tier, "page", [0], [s * 7919 + 1], "sample")
        covered |= (tier.view("kv").view(torch.int64)[:, 0] != 0).any(dim=0).numpy()
    assert covered.all()


def test_snapshots_and_unknown_mode(tier):
    contents.fill(tier, "state", [1], [SEEDS[2]], "sample")
    assert contents.check(tier, "state", [1], [SEEDS[2]], "sample").all()
    assert not contents.check(tier, "state", [1], [SEEDS[3]], "sample").any()
    with pytest.raises(ConfigError, match="verify"):
        contents.check_mode("most")
