"""The shared-budget capacity we give kvcache-simulator: tokens our bytes hold."""

from __future__ import annotations

import pytest

from hicache.engine.kvsim import shared_capacity_tokens
from hicache.errors import ConfigError


def test_shared_capacity_amortises_one_snapshot_over_a_mean_prompt():
    # T = 1024 tokens, 256-token pages: 4 pages (4 x 1000 B) + one 4000-B snapshot per 1024 tokens
    assert shared_capacity_tokens(8000, 1000, 4000, 256, 1024) == 1024
    assert shared_capacity_tokens(8001, 1000, 4000, 256, 1024) == 1024
    assert shared_capacity_tokens(16000, 1000, 4000, 256, 1024) == 2048
    assert shared_capacity_tokens(8000, 1000, 0, 256, 1024) == 2048     # no state: pages only
    with pytest.raises(ConfigError, match="mean_prompt_tokens"):
        shared_capacity_tokens(8000, 1000, 4000, 256, 0)
