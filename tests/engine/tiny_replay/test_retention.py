"""Selective retention (None / 0 / N) through the tiny loop: the snapshots kept are the
ones the policy promises, and every resume from them is exact.

Request ``a``: a 100-token prompt and a 40-token answer, prefilled two pages (32 tokens) a
chunk, so it offers a snapshot at 32 and 64 (PREFILL), 96 (PROMPT_END) and 128 (FINISH).
Then a sibling sharing its first 70 tokens (it can resume at 64 at most) and ``a``'s next
turn (it can resume at 128).
"""

from __future__ import annotations

import numpy as np
import pytest

from tests.engine.tiny_replay.conftest import assert_exact, request, serve, small_cache, toks

A_PROMPT, A_OUT = toks(21, 100), toks(22, 40)
SIBLING = np.concatenate([A_PROMPT[:70], toks(23, 30)])
NEXT_TURN = np.concatenate([A_PROMPT, A_OUT, toks(24, 12)])


@pytest.mark.parametrize(
    "retention, kept, provisional, dropped, boundaries, sibling_resume",
    [
        (None, 4, 0, 0, [32, 64, 96, 128], 64),   # every offered snapshot
        (0, 2, 2, 2, [96, 128], 0),               # prompt end + finish; 32, 64 replaced in turn
        (64, 3, 1, 1, [64, 96, 128], 64),         # + multiples of 64; 32 replaced by 64
        (32, 4, 0, 0, [32, 64, 96, 128], 64),     # every boundary is a multiple of 32
    ])
def test_retention_keeps_the_promised_snapshots_and_resumes_exactly(
        retention, kept, provisional, dropped, boundaries, sibling_resume):
    cache = small_cache(device_pages=24, device_snapshots=8, host_pages=32, host_snapshots=8,
                        retention=retention)
    first = serve(cache, [request(0, A_PROMPT, A_OUT, conv="a")], chunk_pages=2)
    assert_exact(first, checked=140)
    s = cache.stats()
    assert (s["snapshots_offered"], s["snapshots_kept"], s["snapshots_provisional"],
            s["snapshots_dropped_retention"]) == (4, kept, provisional, dropped)
    held = sorted(cache._tree.depth_pages(node) * 16 for node, _ in cache._tree.snapshots())
    assert held == boundaries

    sibling = serve(cache, [request(1, SIBLING, toks(25, 10), conv="b")], chunk_pages=2)
    assert sibling.records[0].hit_tokens == sibling_resume
    assert_exact(sibling, checked=110 - sibling_resume)

    turn2 = serve(cache, [request(2, NEXT_TURN, toks(26, 9), conv="a", turn=1)], chunk_pages=2)
    assert turn2.records[0].hit_tokens == 128
    assert_exact(turn2, checked=len(NEXT_TURN) + 9 - 128)
    cache.close()
