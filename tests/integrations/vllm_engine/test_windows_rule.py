"""hicache's window span (``hicache.integrations.vllm.windows``) against vLLM's own code:
the blocks a snapshot must hold at a resume point are the ones vLLM's
``SlidingWindowManager`` does not skip there (vLLM venv only)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from hicache.integrations.vllm.windows import window_slots, window_span

pytestmark = pytest.mark.filterwarnings("ignore")


@pytest.mark.parametrize("window, extra, block", [(160, 0, 128), (128, 0, 128), (129, 0, 128), (4096, 0, 16),
                                                  (8, 0, 64), (160, 3, 128), (300, 0, 128)])
def test_the_window_span_is_what_vllm_keeps(window, extra, block):
    from vllm.v1.core.single_type_kv_cache_manager import SlidingWindowManager

    mgr = SimpleNamespace(sliding_window=window, extra_retained_tokens=extra)
    for r in range(0, 24 * block + 1, block):
        skipped = SlidingWindowManager.get_num_skipped_tokens(mgr, r)
        first, last = window_span(r, window + extra, block)
        assert (first, last) == (skipped // block, r // block), (r, skipped)
        assert last - first <= window_slots(window + extra, block)
