"""``HiCacheConnector``'s vLLM-free parts: its config, the scheduler protocol (``Bridge``)
and the worker's block copies, driven by hand the way vLLM drives them, on tensors shaped
like vLLM's CPU KV cache. (The connector inside a real vLLM engine:
``tests/integrations/vllm_engine/test_connector_engine.py``.)"""

from __future__ import annotations

import time

import pytest
import torch

from hicache.cache import HiCache
from hicache.errors import ConfigError
from hicache.integrations.vllm.blocks import BlockCopier
from hicache.integrations.vllm.bridge import Bridge
from hicache.integrations.vllm.config import GroupGeometry, connector_config, layout_for

B, H, D, LAYERS, BLOCKS = 16, 2, 8, 3, 64     # block tokens, kv heads, head size
NAMES = tuple(f"model.layers.{i}.self_attn.attn" for i in range(LAYERS))
GEOM = GroupGeometry("full", NAMES, B, H * B * 2 * D * 2)


def engine(url: str = "memory://", **extra):
    """A bridge plus a vLLM-like KV cache (bf16 [blocks, heads, block, 2*head]) wired by a copier."""
    cfg, opts = connector_config({"storage_url": url, "device_bytes": "64KiB", "host_bytes": "256KiB",
                                  "host_reserve_bytes": "1MiB", "write_policy": "write_through",
                                  "prefetch_policy": "wait_complete", "prefetch_threshold_tokens": B, **extra},
                                 model="tiny")
    bridge = Bridge(HiCache(layout_for([GEOM], model="tiny"), cfg), B, **opts)
    kv = {n: torch.zeros(BLOCKS, H, B, 2 * D, dtype=torch.bfloat16) for n in NAMES}
    copier = BlockCopier(kv, NAMES, bridge.cache.pools.device.view("kv"))
    return bridge, kv, copier


def forward(bridge, copier, plan, kv, fill=None) -> None:
    """What the worker does in one step: per layer, load, (attention writes ``fill``), save."""
    for layer, name in enumerate(NAMES):
        for op in plan.loads:
            assert bridge.wait_load(op.req, layer)
            copier.load(layer, op.pages[0], op.blocks[0])
        for block, value in (fill or {}).items():
            kv[name][block] = value + layer
        for op in plan.saves:
            copier.save(layer, op.pages[0], op.blocks[0])
    bridge.report_saves([(op.key, True) for op in plan.saves])


def test_a_prefix_saved_by_one_request_is_loaded_into_another_requests_blocks():
    bridge, kv, copier = engine()
    tokens = list(range(100, 100 + 5 * B + 3))               # 5 whole blocks and a tail
    assert bridge.lookup(tokens, 0) == 0
    bridge.open("a", tokens, 0, 0, [list(range(6))])
    fill = {b: float(b + 1) for b in range(6)}
    forward(bridge, copier, bridge.plan([("a", tokens, len(tokens), [list(range(6))])]), kv, fill)
    bridge.finish("a")
    assert bridge.counters["published_pages"] == 5

    # A second request, vLLM holding its first 2 blocks itself: hicache adds blocks 2..4.
    assert bridge.lookup(tokens, 2 * B) == 3 * B
    new_blocks = [0, 1, 40, 41, 42, 43]
    bridge.open("b", tokens, 2 * B, 3 * B, [new_blocks])
    plan = bridge.plan([("b", tokens, len(tokens), [new_blocks])])
    assert [op.blocks for op in plan.loads] == [((40, 41, 42),)] and not plan.failed
    forward(bridge, copier, plan, kv)
    for layer, name in enumerate(NAMES):
        for src, dst in zip((2, 3, 4), (40, 41, 42)):
            assert torch.equal(kv[name][dst], kv[name][src]), (layer, src, dst)
    bridge.finish("b")
    bridge.cache.check_integrity()
    bridge.close()


def test_a_failed_save_publishes_nothing_and_a_short_lease_fails_the_promised_blocks():
    bridge, kv, copier = engine()
    tokens = list(range(7, 7 + 4 * B + 1))
    bridge.open("a", tokens, 0, 0, [list(range(5))])
    plan = bridge.plan([("a", tokens, len(tokens), [list(range(5))])])
    bridge.report_saves([(op.key, False) for op in plan.saves])   # a layer was never copied
    bridge.finish("a")
    assert bridge.counters["published_pages"] == 0 and bridge.counters["save_failures"] == 1
    assert bridge.lookup(tokens, 0) == 0
    # vLLM was promised 2 blocks hicache no longer has: they come back as load errors.
    bridge.open("b", tokens, 0, 2 * B, [[9, 10, 11, 12, 13]])
    assert bridge.plan([]).failed == (9, 10)
    bridge.finish("b")
    bridge.close()


def test_config_inline_keys_file_and_refusals(tmp_path):
    cfg, opts = connector_config({"storage_url": "file:///tmp/x", "host_bytes": "8GiB"}, model="m")
    assert opts == {"async_lookup": False}
    assert cfg.storage.url == "file:///tmp/x" and cfg.pools.host_layout == "page_first" and cfg.storage.salt == "m"
    f = tmp_path / "c.yaml"
    f.write_text("model: prod\ncache:\n  host_bytes: 1GiB\n  eviction: lfu\n")
    cfg, opts = connector_config({"config": str(f), "eviction": "lru", "async_lookup": True}, model="m")
    assert opts == {"async_lookup": True}
    assert cfg.pools.host_bytes == 1 << 30 and cfg.tree.eviction == "lru" and cfg.storage.salt == "prod"
    with pytest.raises(ConfigError, match="storage_ur") as e:
        connector_config({"storage_ur": "redis://u:secret@h/0"}, model="m")
    assert "secret" not in str(e.value) and "\n" not in str(e.value)
    with pytest.raises(ConfigError, match="async_lookup"):
        connector_config({"async_lookup": "yes"}, model="m")
    with pytest.raises(ConfigError, match="full-attention"):
        layout_for([GroupGeometry("sliding", NAMES, B, GEOM.block_bytes, window=40)])
    with pytest.raises(ConfigError, match="MambaSpec"):
        layout_for([GEOM, GroupGeometry("MambaSpec", NAMES, B, GEOM.block_bytes)])
    with pytest.raises(ConfigError, match="blocks first"):
        BlockCopier({n: torch.zeros(2, BLOCKS, 4).transpose(0, 1) for n in NAMES}, NAMES,
                    torch.zeros(LAYERS, 4, 16, dtype=torch.uint8))


def test_a_preempted_request_rescheduled_before_its_last_save_was_acked():
    """The late ack belongs to the first incarnation's lease, not the new one's."""
    bridge, kv, copier = engine()
    tokens = list(range(50, 50 + 3 * B + 1))
    bridge.open("a", tokens, 0, 0, [[0, 1, 2, 3]])
    plan = bridge.plan([("a", tokens, len(tokens), [[0, 1, 2, 3]])])
    bridge.open("a", tokens, 0, 0, [[5, 6, 7, 8]])          # preempted, scheduled again
    forward(bridge, copier, plan, kv, {b: 1.0 for b in range(4)})
    bridge.poll()
    assert bridge.counters["published_pages"] == 3
    bridge.finish("a")
    bridge.cache.check_integrity()
    assert bridge.lookup(tokens, 0) == 3 * B
    bridge.close()


@pytest.mark.parametrize("async_lookup", [True, False])
def test_a_prefix_only_l3_holds_is_found_by_a_fresh_cache(async_lookup):
    """One cache writes through to L3; a fresh one on the same store finds the prefix: with
    ``async_lookup`` the lookup answers None (ask again) until the L3 round trip is back,
    never a wrong count; without it, at once."""
    import uuid

    url = f"memory://vllm-parts-{uuid.uuid4().hex[:8]}"
    bridge, kv, tokens = _stored_prefix(url)
    bridge2, kv2, copier2 = engine(url, async_lookup=async_lookup)
    answers = [bridge2.lookup(tokens, 0, "b")]
    deadline = time.monotonic() + 30          # by time, not calls: a loaded machine is slower
    while answers[-1] is None and time.monotonic() < deadline:
        time.sleep(0.001)
        answers.append(bridge2.lookup(tokens, 0, "b"))
    assert answers[-1] == 4 * B and (async_lookup or answers == [4 * B]), answers
    assert all(a is None for a in answers[:-1])
    assert bridge2.counters["lookups_deferred"] == len(answers) - 1
    bridge2.open("b", tokens, 0, 4 * B, [[10, 11, 12, 13, 14]])
    forward(bridge2, copier2, bridge2.plan([("b", tokens, len(tokens), [[10, 11, 12, 13, 14]])]), kv2)
    for name in NAMES:
        assert torch.equal(kv2[name][10:14], kv[name][0:4])
    bridge2.finish("b")
    bridge.close()
    bridge2.close()


def _stored_prefix(url):
    """A cache that wrote a 4-page prefix through to ``url``; the prompt's tokens."""
    bridge, kv, copier = engine(url)
    tokens = list(range(900, 900 + 4 * B + 5))
    bridge.open("a", tokens, 0, 0, [list(range(5))])
    forward(bridge, copier, bridge.plan([("a", tokens, len(tokens), [list(range(5))])]), kv, {b: 2.0 for b in range(5)})
    bridge.finish("a")
    bridge.cache.drain()
    return bridge, kv, tokens


def test_async_lookup_never_waits_for_the_fetch_and_an_abort_gives_its_rows_back(monkeypatch):
    """With ``async_lookup`` the scheduler does not wait for the L3 fetch either: while the
    bytes are on their way the answer is None; once they landed, the prefix. A request
    aborted mid-fetch gives its host rows back once the fetch settles."""
    import threading
    import uuid

    from hicache.storage.memory import MemoryBackend

    gate = threading.Event()
    get_into = MemoryBackend.get_into

    def slow_get_into(self, *args, **kwargs):
        gate.wait(30)                       # the fetch is held here until the test opens the gate
        return get_into(self, *args, **kwargs)

    url = f"memory://vllm-parts-{uuid.uuid4().hex[:8]}"
    first, kv, tokens = _stored_prefix(url)
    monkeypatch.setattr(MemoryBackend, "get_into", slow_get_into)
    for rid in ("aborted", "served"):
        bridge, _, _ = engine(url, async_lookup=True)
        host = bridge.cache.pools.host
        gate.clear()
        # the L3 lookup runs in the background, then the fetch takes its host rows and is
        # held at the gate: until then, and while it is held, every answer is None (polled
        # with a deadline, not a count of calls, so a loaded machine does not fail it)
        deadline = time.monotonic() + 30
        while host.num_used("page") < 4 and time.monotonic() < deadline:
            assert bridge.lookup(tokens, 0, rid) is None
            time.sleep(0.001)
        assert host.num_used("page") >= 4                  # the fetch's rows are taken
        assert [bridge.lookup(tokens, 0, rid) for _ in range(50)] == [None] * 50
        if rid == "aborted":
            bridge.finish(rid)                             # vLLM aborted the request
            gate.set()
            bridge.cache.drain()
            assert host.num_used("page") == 0 and host.num_used("state") == 0
        else:
            gate.set()
            deadline = time.monotonic() + 30
            while (got := bridge.lookup(tokens, 0, rid)) is None and time.monotonic() < deadline:
                time.sleep(0.001)
            assert got == 4 * B
        bridge.cache.check_integrity()
        bridge.close()
    first.close()


def test_stats_deltas_are_reported_once_whichever_connector_asks():
    # vLLM's scheduler-side and worker-side connectors share one bridge and vLLM sums what
    # both report: each change must come out of exactly one of them.
    bridge, kv, copier = engine()
    tokens = list(range(300, 300 + 2 * B + 3))
    assert bridge.lookup(tokens, 0) == 0
    scheduler_side = bridge.take_stats_delta()
    worker_side = bridge.take_stats_delta()
    assert scheduler_side["lookups"] == 1 and worker_side["lookups"] == 0
    bridge.lookup(tokens, 0)
    bridge.lookup(tokens, 0)
    assert bridge.take_stats_delta()["lookups"] == 2 and bridge.take_stats_delta()["lookups"] == 0
    assert all(isinstance(v, int) for v in bridge.take_stats_delta().values())
    bridge.close()
