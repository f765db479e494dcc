"""``HiCacheConnector`` on vLLM's hybrid manager, without vLLM: the window each snapshot
holds (:mod:`hicache.integrations.vllm.windows`, against vLLM's skipped-token rule restated here;
``vllm_engine/test_windows_rule.py`` checks it against vLLM's own code)
and a bridge with a full-attention group (history) and a sliding-window group (state)
driven by hand the way vLLM drives it. (Inside a real engine:
``tests/integrations/vllm_engine/test_connector_swa.py``.)"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from hicache.cache import HiCache
from hicache.errors import ConfigError
from hicache.integrations.vllm.blocks import BlockCopier
from hicache.integrations.vllm.bridge import Bridge
from hicache.integrations.vllm.config import GroupGeometry, connector_config, family_names, layout_for
from hicache.integrations.vllm.windows import window_plan, window_slots, window_span

from .vllm_worker import worker_step

B, H, D, BLOCKS, W = 16, 2, 8, 64, 40       # W: 39 tokens before the next one -> 3 blocks
FULL = tuple(f"model.layers.{i}.self_attn.attn" for i in (1, 3))
SWA = tuple(f"model.layers.{i}.self_attn.attn" for i in (0, 2))
BLOCK_BYTES = H * B * 2 * D * 2
GROUPS = [GroupGeometry("full", FULL, B, BLOCK_BYTES, 0, (1, 3)),
          GroupGeometry("sliding", SWA, B, BLOCK_BYTES, W, (0, 2))]


def vllm_real_blocks(r: int, window: int, block: int) -> tuple[int, int]:
    """vLLM's rule, restated: ``max(0, r - W + 1)`` tokens are skipped, whole blocks of them
    are null; the table runs to ``r / B``."""
    return max(0, r - window + 1) // block, r // block


@pytest.mark.parametrize("window,block", [(160, 128), (40, 16), (16, 16), (17, 16), (33, 16), (129, 128), (1, 16)])
def test_the_window_is_the_blocks_vllm_keeps_and_fits_the_snapshot(window, block):
    k = window_slots(window, block)
    for r in range(0, 20 * block + 1, block):
        first, last = window_span(r, window, block)
        assert (first, last) == vllm_real_blocks(r, window, block)
        assert last - first <= k                      # never more than the snapshot holds
        if r >= window - 1:                           # a whole window: ceil((W - 1) / B) blocks
            assert last - first == -(-(window - 1) // block)


def test_window_plan_ids_and_order():
    ids = [0, 0, 7, 9, 11]                            # vLLM's table at r = 512: two nulls, then the window
    assert window_slots(160, 128) == 2
    assert window_plan(5, 512, 160, 128, ids) == ((10, 11), (7, 9))
    assert window_plan(5, 512, 160, 128, ids, from_block=3) == ((11,), (9,))      # block 2 was vLLM's hit
    assert window_plan(0, 256, 160, 128, [4, 6, 8]) == ((0, 1), (4, 6))            # r - W + 1 = 97: nothing skipped
    assert window_plan(3, 128, 160, 128, [4, 6]) == ((7,), (4,))                   # r < W: one block, the last slot
    assert window_plan(2, 64, 40, 16, list(range(20, 30))) == ((6, 7, 8), (21, 22, 23))
    assert window_plan(2, 32, 40, 16, list(range(20, 30))) == ((7, 8), (20, 21))   # short: right-aligned
    with pytest.raises(ConfigError, match="resume_tokens"):
        window_span(100, 160, 128)
    with pytest.raises(ConfigError, match="block_ids"):
        window_plan(0, 512, 160, 128, [1, 2])


def test_layout_history_for_full_groups_state_for_sliding_ones():
    layout = layout_for(GROUPS, model="tiny")
    assert family_names(GROUPS) == ("kv", "swa1")
    kv, swa = layout.families
    assert (kv.kind, kv.layer_ids, kv.tokens_per_row, kv.row_bytes) == ("history", (1, 3), B, BLOCK_BYTES)
    assert (swa.kind, swa.layer_ids, swa.rows_kept, swa.row_bytes) == ("state", (0, 2), 3, BLOCK_BYTES)
    assert layout.state_bytes_per_snapshot == 2 * 3 * BLOCK_BYTES and layout.has_state
    with pytest.raises(ConfigError, match="ChunkedLocal"):
        layout_for([GROUPS[0], GroupGeometry("ChunkedLocalAttentionSpec", SWA, B, BLOCK_BYTES)])


def hybrid_engine():
    cfg, opts = connector_config({"storage_url": "memory://", "device_bytes": "256KiB", "host_bytes": "1MiB",
                                  "host_reserve_bytes": "2MiB", "write_policy": "write_through",
                                  "prefetch_policy": "wait_complete"}, model="tiny")
    bridge = Bridge(HiCache(layout_for(GROUPS, model="tiny"), cfg), B, windows=(0, W), **opts)
    kv = {n: torch.zeros(BLOCKS, H, B, 2 * D, dtype=torch.bfloat16) for n in FULL + SWA}
    view = bridge.cache.pools.device.view
    copiers = [BlockCopier(kv, FULL, view("kv")), BlockCopier(kv, SWA, view("swa1"), window_slots(W, B))]
    return bridge, kv, copiers


def forward(bridge, copiers, plan, kv, fill=None):
    """One step: per group and layer, load, (attention writes ``fill[g]``), save."""
    def write(g, layer):
        name = (FULL, SWA)[g][layer]
        for block, value in ((fill or [{}, {}])[g]).items():
            kv[name][block] = value + 10 * layer + 100 * g

    worker_step(bridge, plan, [(g, c, GROUPS[g].layer_ids) for g, c in enumerate(copiers)], write)


@pytest.mark.parametrize("pages", [6, 2])
def test_a_resumed_request_gets_the_pages_and_the_window_from_a_snapshot(pages):
    """``pages`` = 6: the window is 3 whole blocks; 2: shorter than the window (r < W - 1)."""
    bridge, kv, copiers = hybrid_engine()
    tokens = list(range(100, 100 + pages * B + 3))
    r = pages * B
    first, _ = window_span(r, W, B)
    full_a = list(range(1, pages + 2))
    swa_a = list(range(20, 20 + pages + 1))        # a fresh prefill: vLLM has nulled nothing yet
    assert bridge.lookup(tokens, 0, "a") == 0
    bridge.open("a", tokens, 0, 0, [full_a, swa_a])
    plan = bridge.plan([("a", tokens, len(tokens), [full_a, swa_a])])
    (save,) = plan.saves
    assert save.blocks == (tuple(full_a[:pages]), tuple(swa_a[first:pages]))
    forward(bridge, copiers, plan, kv, [{b: float(b) for b in full_a}, {b: float(b) for b in swa_a}])
    bridge.finish("a")
    assert bridge.counters["published_snapshots"] == 1 and bridge.counters["published_pages"] == pages

    # Same prompt again: vLLM has nothing; its SWA table has nulls below the window.
    assert bridge.lookup(tokens, 0, "b") == r
    full_b = list(range(40, 40 + pages + 1))
    swa_b = [0] * first + list(range(50 + first, 50 + pages + 1))
    bridge.open("b", tokens, 0, r, [full_b, swa_b])
    plan = bridge.plan([("b", tokens, len(tokens), [full_b, swa_b])])
    (load,) = plan.loads
    assert load.blocks == (tuple(full_b[:pages]), tuple(swa_b[first:pages])) and not plan.failed
    forward(bridge, copiers, plan, kv)
    for name in FULL:
        for i in range(pages):
            assert torch.equal(kv[name][full_b[i]], kv[name][full_a[i]]), (name, i)
    for name in SWA:
        for i in range(first, pages):
            assert torch.equal(kv[name][swa_b[i]], kv[name][swa_a[i]]), (name, i)
            assert kv[name][swa_b[i]].abs().sum() > 0
    assert bridge.counters["loaded_snapshots"] == 1
    bridge.finish("b")
    bridge.cache.check_integrity()
    bridge.close()


def test_a_lookup_holds_its_lease_until_open_or_finish():
    """On a hybrid layout the lookup leases (vLLM cannot take per-block failures back with
    several groups): asked again it re-leases, aborted unscheduled it releases."""
    bridge, kv, copiers = hybrid_engine()
    tokens = list(range(7, 7 + 4 * B + 1))
    _prefill(bridge, kv, copiers, "a", tokens)
    assert bridge.lookup(tokens, 0, "b") == 4 * B
    hits = bridge.cache.counters.hit_tokens
    for _ in range(4):                                      # not scheduled: asked again each step
        assert bridge.lookup(tokens, 0, "b") == 4 * B
    assert bridge.cache.stats()["running_requests"] == 1
    snap = bridge.cache._tree.walk(np.asarray(tokens, np.int32), 4).segments[-1][0].snapshot
    assert bridge.cache.counters.hit_tokens == hits and snap.resumed == 1   # the one lease answers
    assert bridge.lookup(tokens, 4 * B, "b") == 0           # vLLM's own hit covers it: nothing more
    bridge.finish("b")                                      # aborted while waiting
    assert bridge.cache.stats()["running_requests"] == 0
    bridge.cache.check_integrity()
    bridge.close()


def test_a_failed_host_copy_at_lookup_promises_nothing(monkeypatch):
    """With several groups vLLM cannot recompute per failed block, so the lookup waits for
    the lease's host -> pool copy: one that fails promises 0 tokens and holds no lease."""
    from hicache.cache import Lease

    bridge, kv, copiers = hybrid_engine()
    tokens = list(range(500, 500 + 4 * B + 1))
    _prefill(bridge, kv, copiers, "a", tokens)
    with monkeypatch.context() as m:
        m.setattr(Lease, "wait", lambda self, *a, **k: False)
        assert bridge.lookup(tokens, 0, "b") == 0
    assert bridge.cache.stats()["running_requests"] == 0 and bridge.counters["load_failed_tokens"] == 4 * B
    assert bridge.lookup(tokens, 0, "b") == 4 * B            # the copy works again: promised
    bridge.finish("b")
    bridge.cache.check_integrity()
    bridge.close()


def test_a_load_short_of_the_snapshot_loads_nothing_and_fails_the_blocks():
    """The snapshot is the window at the resume point only: a load vLLM asked to stop
    earlier (fewer external tokens than promised) cannot use it."""
    bridge, kv, copiers = hybrid_engine()
    tokens = list(range(300, 300 + 4 * B + 1))
    _prefill(bridge, kv, copiers, "a", tokens)
    assert bridge.lookup(tokens, 0, "b") == 4 * B
    bridge.open("b", tokens, 0, 3 * B, [[40, 41, 42, 43, 44], [0, 51, 52, 53, 54]])
    plan = bridge.plan([])
    assert not plan.loads and plan.failed == (40, 41, 42, 51, 52)
    assert bridge.counters["load_failed_tokens"] == 3 * B
    bridge.finish("b")
    bridge.cache.check_integrity()
    bridge.close()


def _prefill(bridge, kv, copiers, req, tokens, fill=1.0):
    """One request prefilled in one step from nothing (blocks 1.. and 20..), finished; its plan."""
    n = len(tokens) // B + 1
    full, swa = list(range(1, n + 1)), list(range(20, 20 + n))
    assert bridge.lookup(tokens, 0, req) == 0
    bridge.open(req, tokens, 0, 0, [full, swa])
    plan = bridge.plan([(req, tokens, len(tokens), [full, swa])])
    forward(bridge, copiers, plan, kv, [{b: fill + b for b in full}, {b: fill + 2 * b for b in swa}])
    bridge.finish(req)
    return plan


def test_a_prompt_of_whole_pages_also_gets_the_snapshot_its_repeat_resumes_at():
    bridge, kv, copiers = hybrid_engine()
    tokens = list(range(500, 500 + 4 * B))       # a repeat resumes at 3 pages, the step reaches 4
    (save,) = _prefill(bridge, kv, copiers, "a", tokens).saves
    assert save.blocks[1] == (20, 21, 22) + (21, 22, 23)    # window at 3 pages, then at 4
    assert bridge.counters["published_snapshots"] == 2
    assert bridge.lookup(tokens, 0, "b") == 3 * B
    bridge.finish("b")
    bridge.cache.check_integrity()
    bridge.close()


def test_a_step_passing_the_point_a_prompt_leaves_the_cache_snapshots_it_for_siblings():
    """Two prompts share 3 pages; the first's only snapshot is at its end. The second
    passes the fork in one step: a BRANCH snapshot there lets a third sibling resume at
    the fork, its window loaded from that snapshot."""
    bridge, kv, copiers = hybrid_engine()
    shared = list(range(1000, 1000 + 3 * B))
    a = shared + list(range(5000, 5000 + 2 * B + 1))
    b = shared + list(range(6000, 6000 + 3 * B + 1))
    c = shared + list(range(7000, 7000 + B + 1))
    _prefill(bridge, kv, copiers, "a", a)
    assert bridge.lookup(c, 0, "probe") == 0        # history to the fork, no snapshot there
    bridge.finish("probe")
    (save,) = _prefill(bridge, kv, copiers, "b", b, fill=50.0).saves
    assert len(save.pages[1]) == 3 + 3                    # windows at the fork (3 pages) and at 6
    assert bridge.lookup(c, 0, "c") == 3 * B
    full, swa = list(range(40, 45)), list(range(51, 56))  # r = 48: nothing below the window to skip
    bridge.open("c", c, 0, 3 * B, [full, swa])
    plan = bridge.plan([])
    (load,) = plan.loads
    assert load.blocks[1] == (51, 52, 53)                  # window at 3 pages: blocks 0, 1, 2
    forward(bridge, copiers, plan, kv)
    for name in SWA:                                       # b's blocks 20, 21, 22 (b filled them)
        for mine, bs in zip((51, 52, 53), (20, 21, 22)):
            assert torch.equal(kv[name][mine], kv[name][bs]) and kv[name][mine].abs().sum() > 0
    bridge.finish("c")
    bridge.cache.check_integrity()
    bridge.close()


def test_a_window_with_a_freed_block_publishes_pages_without_a_snapshot():
    bridge, kv, copiers = hybrid_engine()
    tokens = list(range(40, 40 + 4 * B + 1))
    full, swa = list(range(1, 6)), [0, 0, 0, 23, 24]       # window at 4 pages is blocks 1..3: two freed
    bridge.open("a", tokens, 0, 0, [full, swa])
    plan = bridge.plan([("a", tokens, len(tokens), [full, swa])])
    (save,) = plan.saves
    assert save.pages[1] == () and save.blocks[0] == (1, 2, 3, 4)
    forward(bridge, copiers, plan, kv)
    bridge.finish("a")
    assert bridge.counters["published_pages"] == 4 and bridge.counters["published_snapshots"] == 0
    assert bridge.lookup(tokens, 0, "b") == 0
    bridge.finish("b")
    bridge.cache.check_integrity()
    bridge.close()
