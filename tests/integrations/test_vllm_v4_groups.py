"""``HiCacheConnector`` on KV cache groups of several block sizes and block widths, as vLLM
0.32 makes them for DeepSeek-V4, without vLLM: the layout (a family per group and width,
a page per 256-token block, window slots in each group's own block size), the copy plan's
exact ids, and a bridge that saves one request's pages and windows and loads them into
another's blocks byte for byte. (vLLM's real V4 groups and caches:
``tests/integrations/vllm_engine/test_v4_connector.py``.)"""

from __future__ import annotations

import pytest
import torch

from hicache.cache import HiCache
from hicache.errors import ConfigError
from hicache.integrations.vllm.blocks import BlockCopier, block_rows
from hicache.integrations.vllm.bridge import Bridge
from hicache.integrations.vllm.config import GroupGeometry, connector_config, group_families, layout_for
from hicache.integrations.vllm.windows import group_copies, window_slots

from .vllm_worker import worker_step

# What vLLM 0.32 reports for the tiny V4 of vllm_engine/test_v4_cpu.py (layers: 0 window
# only, 1 compressed 4x with the indexer, 2 compressed 128x) with a connector: three window-KV
# groups, compressed KV + indexer keys, and two compressor-state groups; block widths are
# the bytes a block holds (vLLM pads pages beyond them).
V4 = [GroupGeometry("sliding", ("model.layers.0.attn.swa_cache",), 64, 37376, 128, (0,)),
      GroupGeometry("sliding", ("model.layers.1.attn.swa_cache",), 64, 37376, 128, (1,)),
      GroupGeometry("sliding", ("model.layers.2.attn.swa_cache",), 64, 37376, 128, (2,)),
      GroupGeometry("full", ("model.layers.1.attn.indexer.k_cache", "model.layers.1.attn", "model.layers.2.attn"),
                    256, 8448, 0, (1, 1, 2), (8448, 37376, 1168)),
      GroupGeometry("sliding", ("model.layers.1.attn.indexer.compressor.state_cache",
                                "model.layers.1.attn.compressor.state_cache"), 4, 8192, 8, (1, 1), (8192, 32768)),
      GroupGeometry("sliding", ("model.layers.2.attn.compressor.state_cache",), 8, 32768, 128, (2,))]


def test_v4_groups_become_a_family_per_group_and_width():
    layout = layout_for(V4, model="tiny-v4")
    assert layout.page_tokens == 256
    got = [(f.name, f.kind, f.layer_ids, f.tokens_per_row, f.row_bytes, f.rows_kept) for f in layout.families]
    assert got == [("swa0", "state", (0,), 64, 37376, 2), ("swa1", "state", (1,), 64, 37376, 2),
                   ("swa2", "state", (2,), 64, 37376, 2),
                   ("kv", "history", (1,), 256, 8448, 0), ("kv_1", "history", (1,), 256, 37376, 0),
                   ("kv_2", "history", (2,), 256, 1168, 0),
                   ("swa4", "state", (1,), 4, 8192, 2), ("swa4_1", "state", (1,), 4, 32768, 2),
                   ("swa5", "state", (2,), 8, 32768, 16)]
    assert layout.history_bytes_per_page == 8448 + 37376 + 1168
    assert layout.state_bytes_per_snapshot == 3 * 2 * 37376 + 2 * (8192 + 32768) + 16 * 32768
    assert group_families(V4)[3] == (("kv", (0,)), ("kv_1", (1,)), ("kv_2", (2,)))


def test_two_caches_of_one_layer_in_one_family_are_numbered_in_group_order():
    """Equal widths put both of a layer's caches in one family, where a layer id must be
    unique: the family's layers are then numbered in group order, after earlier groups'."""
    twin = GroupGeometry("sliding", ("l1.a.state", "l1.b.state"), 4, 512, 8, (1, 1))
    layout = layout_for([V4[3], twin])
    assert [(f.name, f.layer_ids) for f in layout.families] == [("kv", (1,)), ("kv_1", (1,)), ("kv_2", (2,)),
                                                                ("swa1", (3, 4))]


def test_groups_that_do_not_fit_a_page_are_refused_in_one_line():
    with pytest.raises(ConfigError, match=r"kv_cache_groups\[1\]\.block_size=96.*does not divide"):
        layout_for([V4[3], GroupGeometry("sliding", ("w",), 96, 960, 128)])
    with pytest.raises(ConfigError, match=r"kv_cache_groups\[1\]\.block_size=128.*first full-attention"):
        layout_for([V4[3], GroupGeometry("full", ("f",), 128, 1280)])
    with pytest.raises(ConfigError, match="at least one full-attention group"):
        layout_for([V4[0]])


def test_copy_plan_ids_in_each_groups_own_block_size():
    """Pages [1, 2) of a request at 2 pages (512 tokens) with its snapshot row 3: the
    history group copies page 1 (block index 1); each window group the blocks of its
    window at token 512, right-aligned in the row's slots."""
    groups = [(0, 256), (128, 64), (8, 4), (128, 8)]
    tables = [[100, 101, 102], list(range(200, 209)), list(range(300, 430)), list(range(500, 565))]
    pages, blocks = group_copies(groups, 256, [7, 9, 11], 1, 2, [(3, 2)], tables)
    assert pages[0] == (9,) and blocks[0] == (101,)
    assert pages[1] == (6, 7) and blocks[1] == (206, 207)          # W 128 / B 64: blocks 6, 7 (2 slots)
    assert pages[2] == (6, 7) and blocks[2] == (426, 427)          # W 8 / B 4: tokens 505..511
    assert pages[3] == tuple(range(48, 64)) and blocks[3] == tuple(range(548, 564))   # 16 slots of row 3
    # a load from page 1 on: window blocks below 256 tokens are vLLM's own (none here) ...
    assert group_copies(groups, 256, [7, 9], 1, 2, [(3, 2)], tables, from_page=1) == (pages, blocks)
    # ... but W = 300 reaches block 3 (tokens 192..255): left out, counted in 64-token blocks
    wide = group_copies([(0, 256), (300, 64)], 256, [7, 9], 1, 2, [(3, 2)], tables[:2], from_page=1)
    assert wide == (((9,), (16, 17, 18, 19)), ((101,), (204, 205, 206, 207)))
    assert group_copies([(0, 256), (300, 64)], 256, [7, 9], 0, 2, [(3, 2)], tables[:2])[1][1] == (203, 204, 205,
                                                                                                  206, 207)


def test_strided_caches_copy_only_their_own_bytes():
    """V4 packs several layers' blocks into one stride (each layer a view at its offset):
    a block copied out of one layer and back into another block leaves the other layer's
    bytes in both blocks as they were."""
    buf = torch.randint(0, 255, (10, 48), dtype=torch.uint8)
    a, b = buf[:, :16].view(10, 4, 4), buf[:, 16:40].view(torch.int16).view(10, 12)
    before = buf.clone()
    pool_a, pool_b = torch.zeros(1, 3, 16, dtype=torch.uint8), torch.zeros(1, 3, 24, dtype=torch.uint8)
    ca = BlockCopier({"a": a}, ["a"], pool_a)
    cb = BlockCopier({"b": b}, ["b"], pool_b)
    ca.save(0, [2], [5])
    cb.save(0, [1], [5])
    ca.load(0, [2], [7])
    cb.load(0, [1], [8])
    assert torch.equal(buf[7, :16], before[5, :16]) and torch.equal(buf[8, 16:40], before[5, 16:40])
    changed = (buf != before).nonzero()[:, 0].unique().tolist()
    assert changed == [7, 8]
    assert torch.equal(buf[7, 16:], before[7, 16:]) and torch.equal(buf[8, :16], before[8, :16])
    assert torch.equal(buf[8, 40:], before[8, 40:])
    with pytest.raises(ConfigError, match="kv_cache.layout"):
        block_rows(buf[:, :16].view(10, 4, 4).transpose(1, 2))


# A small V4-shaped model: page 16 tokens; a history group with two widths (compressed
# blocks need not be a whole number of bytes per token); window groups of 4-, 2- and
# 8-token blocks.
P = 16
MINI = [GroupGeometry("sliding", ("l0.swa",), 4, 40, 12, (0,)),
        GroupGeometry("full", ("l1.idx", "l1.attn"), P, 24, 0, (1, 1), (24, 36)),
        GroupGeometry("sliding", ("l1.state",), 2, 16, 4, (1,)),
        GroupGeometry("sliding", ("l1.swa",), 8, 64, 16, (1,))]
NBLOCKS = 1000


def mini_engine():
    cfg, opts = connector_config({"storage_url": "memory://", "device_bytes": "256KiB", "host_bytes": "1MiB",
                                  "host_reserve_bytes": "2MiB", "write_policy": "write_through",
                                  "prefetch_policy": "wait_complete"}, model="mini-v4")
    layout = layout_for(MINI, model="mini-v4")
    bridge = Bridge(HiCache(layout, cfg), P, windows=[g.window for g in MINI],
                    group_blocks=[g.block_tokens for g in MINI], **opts)
    kv = {name: torch.zeros(NBLOCKS, w, dtype=torch.uint8)
          for g in MINI for name, w in zip(g.layers, g.widths())}
    copiers = []   # (group, copier, the family's layer ids)
    for g, (geom, fams) in enumerate(zip(MINI, group_families(MINI))):
        slots = window_slots(geom.window, geom.block_tokens) if geom.window else 1
        for name, idx in fams:
            names = [geom.layers[i] for i in idx]
            copiers.append((g, BlockCopier(kv, names, bridge.cache.pools.device.view(name), slots),
                            bridge.cache.layout.family(name).layer_ids))
    return bridge, kv, copiers


def tables(base: int, tokens: int, skip: int = 0) -> list[list[int]]:
    """A request's block table per group (ids from ``base + 200 * g``); in each window group
    the blocks vLLM skipped below ``skip`` tokens are its null block 0."""
    out = []
    for g, geom in enumerate(MINI):
        n = -(-tokens // geom.block_tokens)
        nulls = max(0, skip - geom.window + 1) // geom.block_tokens if geom.window else 0
        out.append([0] * nulls + [base + 200 * g + i for i in range(nulls, n)])
    return out


@pytest.mark.parametrize("pages", [5, 1])
def test_a_request_resumes_with_every_group_loaded_byte_for_byte(pages):
    """``pages`` = 5: every window whole; 1: shorter than the 16-token window."""
    bridge, kv, copiers = mini_engine()
    tokens = list(range(10, 10 + pages * P + 3))
    a = tables(1, len(tokens))
    gen = torch.Generator().manual_seed(pages)
    for t in kv.values():
        t.copy_(torch.randint(1, 255, t.shape, dtype=torch.uint8, generator=gen))
    assert bridge.lookup(tokens, 0, "a") == 0
    bridge.open("a", tokens, 0, 0, a)
    plan = bridge.plan([("a", tokens, len(tokens), a)])
    worker_step(bridge, plan, copiers)
    bridge.finish("a")
    assert bridge.counters["published_snapshots"] >= 1 and bridge.counters["published_pages"] == pages

    r = pages * P
    assert bridge.lookup(tokens, 0, "b") == r
    b = tables(100, len(tokens), skip=r)
    bridge.open("b", tokens, 0, r, b)
    plan = bridge.plan([])
    (load,) = plan.loads
    assert not plan.failed and load.blocks[1] == tuple(b[1][:pages])
    worker_step(bridge, plan, copiers)
    for g, geom in enumerate(MINI):
        B = geom.block_tokens
        lo = max(0, r - geom.window + 1) // B if geom.window else 0
        assert len(load.blocks[g]) == r // B - lo
        for name in geom.layers:
            for i in range(lo, r // B):               # the window at r (history: every page)
                assert torch.equal(kv[name][b[g][i]], kv[name][a[g][i]]), (name, i)
    bridge.finish("b")
    bridge.cache.check_integrity()
    bridge.close()
