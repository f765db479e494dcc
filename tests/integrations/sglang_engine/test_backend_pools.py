"""``HiCacheStorageBackend`` against host pools built here: the v2 hit rule (checked against
SGLang's own ``HiCacheFile`` on the same writes), DeepSeek-V4-shaped pools (logical KV
anchor, compressed history, trailing state), MLA ranks, metrics, faults, threads.

The pools mimic SGLang's host pool interface (``get_data_page``, ``get_dummy_flat_data_page``,
``set_from_flat_data_page``); ``copy=True`` makes one that only hands out copies, like the
Mamba state pool, so the staging path is covered too.
"""

from __future__ import annotations

import hashlib
import tempfile
import threading

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from sglang.srt.mem_cache.hicache_storage import (HiCacheFile, HiCacheStorageConfig, PoolHitPolicy, PoolName,
                                                  PoolTransfer)
from sglang.srt.observability.metrics_collector import StorageMetrics

from hicache.errors import ConfigError
from hicache.integrations.sglang import HiCacheStorageBackend
from tests.integrations.sglang_engine.conftest import HICACHE_BACKEND

PS = 4  # tokens per page
ALL, TRAILING, GROUPS = PoolHitPolicy.ALL_PAGES, PoolHitPolicy.TRAILING_PAGES, PoolHitPolicy.BLOCK_GROUPS


class FakePool:
    """A host pool of ``pages`` pages: K/V x layers x rows, page_first or layer_first."""

    def __init__(self, pages: int = 16, layers: int = 3, row: int = 8, layout: str = "page_first",
                 copy: bool = False, seed: int = 0):
        self.page_size, self.layout, self.layer_num, self.dtype, self._copy = PS, layout, layers, torch.bfloat16, copy
        size = pages * PS
        dims = (2, size, layers, row) if layout == "page_first" else (2, layers, size, row)
        g = torch.Generator().manual_seed(seed)
        self.kv_buffer = torch.randn(dims, generator=g).to(self.dtype)
        self._shape = (2, PS, layers, row) if layout == "page_first" else (2, layers, PS, row)

    def _page(self, index):
        return self.kv_buffer[:, index:index + PS] if self.layout == "page_first" \
            else self.kv_buffer[:, :, index:index + PS]

    def get_data_page(self, index, flat=True):
        page = self._page(index)
        if self._copy:
            page = page.clone()
        return page.flatten() if flat else page

    def get_dummy_flat_data_page(self):
        return torch.zeros(self._shape, dtype=self.dtype).flatten()

    def set_from_flat_data_page(self, index, data_page):
        self._page(index)[...] = data_page.reshape(self._shape)

    def rows(self, pages: list[int]) -> torch.Tensor:
        return torch.tensor([p * PS + t for p in pages for t in range(PS)], dtype=torch.int64)

    def page_bytes(self, page: int) -> bytes:
        return self._page(page * PS).contiguous().view(torch.uint8).numpy().tobytes()


class LogicalAnchor:
    """DeepSeek-V4's KV anchor: indices, no bytes."""

    page_size, layout, kv_buffer = PS, "page_first", None


def storage_config(extra: dict, *, tp=(0, 1), mla=False, metrics=True) -> HiCacheStorageConfig:
    return HiCacheStorageConfig(tp_rank=tp[0], tp_size=tp[1], pp_rank=0, pp_size=1, attn_cp_rank=0,
                                attn_cp_size=1, is_mla_model=mla, enable_storage_metrics=metrics,
                                is_page_first_layout=True, model_name="test/model", extra_config=extra)


def backend(url: str, pools: dict, **kw) -> HiCacheStorageBackend:
    extra = kw.pop("extra", {})
    b = HiCacheStorageBackend(storage_config({**HICACHE_BACKEND, "url": url, **extra}, **kw), {})
    anchor = pools.get("kv")
    b.register_mem_pool_host(anchor)
    for name, pool in pools.items():
        b.register_mem_host_pool_v2(pool, PoolName(name))
    return b


def keys(n: int, tag: str = "k") -> list[str]:
    return [hashlib.sha256(f"{tag}{i}".encode()).hexdigest() for i in range(n)]


_N = st.integers(1, 10)


@st.composite
def presence(draw):
    """Which pages of an n-page chain each pool holds: KV and the history pool mostly whole
    prefixes, the trailing pool any subset (windows with holes)."""
    n = draw(_N)
    return {"n": n, "kv": list(range(draw(st.integers(0, n)))),
            "deepseek_v4_c4": list(range(draw(st.integers(0, n)))),
            "swa": [i for i in range(n) if draw(st.booleans())],
            "window": draw(st.integers(1, 3)), "swa_first": draw(st.booleans())}


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(p=presence())
def test_v2_hit_rule_matches_sglang_file_backend(p):
    """Presence patterns written to both; batch_exists_v2 must give the same usable prefix,
    per-pool verdicts and restorable stop points as SGLang's own HiCacheFile."""
    n = p["n"]
    tag = hashlib.sha256(repr(p).encode()).hexdigest()[:12]
    ks = keys(n, tag)
    pools = {"kv": FakePool(), "swa": FakePool(seed=1), "deepseek_v4_c4": FakePool(seed=2)}
    with tempfile.TemporaryDirectory() as ref_dir:
        ours = backend(f"memory://hit-rule-{tag}", pools)
        ref = HiCacheFile(storage_config({"file_storage_path": ref_dir}))
        ref.register_mem_pool_host(pools["kv"])
        for name, pool in pools.items():
            ref.register_mem_host_pool_v2(pool, PoolName(name))
        kv_pages = p["kv"]
        for b in (ours, ref):
            assert b.batch_set([ks[i] for i in kv_pages], [pools["kv"].get_data_page(i * PS) for i in kv_pages])
        policy = {"swa": TRAILING, "deepseek_v4_c4": ALL}
        for name in ("swa", "deepseek_v4_c4"):
            pages = p[name]
            t = PoolTransfer(name=PoolName(name), keys=[ks[i] for i in pages],
                             host_indices=pools[name].rows(pages), hit_policy=policy[name])
            for b in (ours, ref):
                assert all(b.batch_set_v2([t])[PoolName(name)])
        query = [PoolTransfer(name=PoolName.SWA, keys=ks[:p["window"]], hit_policy=TRAILING),
                 PoolTransfer(name=PoolName.DEEPSEEK_V4_C4, keys=ks, hit_policy=ALL)]
        if not p["swa_first"]:
            query.reverse()
        got, want = ours.batch_exists_v2(ks, query), ref.batch_exists_v2(ks, query)
        ours.close()
    assert (got.kv_hit_pages, dict(got.extra_pool_hit_pages), got.restorable_prefix_pages) == \
        (want.kv_hit_pages, dict(want.extra_pool_hit_pages), want.restorable_prefix_pages)


def test_v2_hit_rule_example_with_holes():
    """One pattern worked by hand: 8 pages of KV and history, the SWA window (2 pages)
    present at pages 2-3 and 6-7: the restorable stop points are 4 and 8."""
    pools = {"kv": FakePool(), "swa": FakePool(seed=1), "deepseek_v4_c4": FakePool(seed=2)}
    ks = keys(8, "holes")
    b = backend("memory://holes", pools)
    b.batch_set(ks, [pools["kv"].get_data_page(i * PS) for i in range(8)])
    for name, pages, policy in (("deepseek_v4_c4", range(7), ALL), ("swa", [2, 3, 6, 7], TRAILING)):
        b.batch_set_v2([PoolTransfer(name=PoolName(name), keys=[ks[i] for i in pages],
                                     host_indices=pools[name].rows(pages), hit_policy=policy)])
    swa = PoolTransfer(name=PoolName.SWA, keys=ks[:2], hit_policy=TRAILING)
    res = b.batch_exists_v2(ks, [swa])
    assert (res.kv_hit_pages, res.restorable_prefix_pages) == (8, [4, 8])
    assert dict(res.extra_pool_hit_pages) == {PoolName.KV: 8, PoolName.SWA: 8}
    hist = PoolTransfer(name=PoolName.DEEPSEEK_V4_C4, keys=ks, hit_policy=ALL)
    res = b.batch_exists_v2(ks, [swa, hist])   # history stops after page 7: only 4 is left
    assert (res.kv_hit_pages, res.restorable_prefix_pages) == (4, [4])
    assert dict(res.extra_pool_hit_pages) == {PoolName.KV: 8, PoolName.SWA: 8, PoolName.DEEPSEEK_V4_C4: 7}
    b.close()


def test_deepseek_v4_shaped_pools_round_trip():
    """Logical KV anchor, compressed history (ALL_PAGES, layer_first: many pieces), a
    trailing state pool that only hands out copies (staging path); a fresh backend reads
    every byte back into zeroed pools."""
    src = {"kv": LogicalAnchor(), "deepseek_v4_c4": FakePool(layout="layer_first", seed=3),
           "deepseek_v4_c4_state": FakePool(copy=True, seed=4)}
    ks = keys(6, "dsv4")
    w = backend("memory://dsv4", src)
    hist = PoolTransfer(name=PoolName.DEEPSEEK_V4_C4, keys=ks, host_indices=src["deepseek_v4_c4"].rows(range(6)),
                        hit_policy=ALL)
    state = PoolTransfer(name=PoolName.DEEPSEEK_V4_C4_STATE, keys=ks[4:6],
                         host_indices=src["deepseek_v4_c4_state"].rows([4, 5]), hit_policy=TRAILING)
    assert w.batch_set_v2([hist, state]) == {PoolName.DEEPSEEK_V4_C4: [True] * 6,
                                            PoolName.DEEPSEEK_V4_C4_STATE: [True] * 2}
    assert w.batch_set_v1(ks, torch.arange(6 * PS)) == [True] * 6   # logical: nothing to store
    assert w._slot("deepseek_v4_c4").zero_copy and not w._slot("deepseek_v4_c4_state").zero_copy

    dst = {"kv": LogicalAnchor(), "deepseek_v4_c4": FakePool(layout="layer_first", seed=9),
           "deepseek_v4_c4_state": FakePool(copy=True, seed=9)}
    r = backend("memory://dsv4", dst)
    q = [PoolTransfer(name=PoolName.DEEPSEEK_V4_C4, keys=ks, hit_policy=ALL),
         PoolTransfer(name=PoolName.DEEPSEEK_V4_C4_STATE, keys=ks[:2], hit_policy=TRAILING)]
    hit = r.batch_exists_v2(ks, q)
    # history for all 6 pages, state only for the window ending at page 6
    assert (hit.kv_hit_pages, hit.restorable_prefix_pages) == (6, [6])
    assert dict(hit.extra_pool_hit_pages) == {PoolName.KV: 6, PoolName.DEEPSEEK_V4_C4: 6,
                                              PoolName.DEEPSEEK_V4_C4_STATE: 6}
    hist_dst = PoolTransfer(name=PoolName.DEEPSEEK_V4_C4, keys=ks,
                            host_indices=dst["deepseek_v4_c4"].rows([5, 4, 3, 2, 1, 0]), hit_policy=ALL)
    state_dst = PoolTransfer(name=PoolName.DEEPSEEK_V4_C4_STATE, keys=ks[4:6],
                             host_indices=dst["deepseek_v4_c4_state"].rows([7, 8]), hit_policy=TRAILING)
    assert r.batch_get_v2([hist_dst, state_dst]) == {PoolName.DEEPSEEK_V4_C4: [True] * 6,
                                                    PoolName.DEEPSEEK_V4_C4_STATE: [True] * 2}
    for i in range(6):
        assert dst["deepseek_v4_c4"].page_bytes(5 - i) == src["deepseek_v4_c4"].page_bytes(i)
    assert dst["deepseek_v4_c4_state"].page_bytes(7) == src["deepseek_v4_c4_state"].page_bytes(4)
    assert dst["deepseek_v4_c4_state"].page_bytes(8) == src["deepseek_v4_c4_state"].page_bytes(5)
    # a state window that is missing shortens nothing else but the stop points
    assert r.batch_exists_v2(ks[:5], q).kv_hit_pages == 0
    w.close()
    r.close()


def test_block_groups_report_whole_groups_and_never_gate():
    pools = {"kv": FakePool(), "deepseek_v4_c128": FakePool(seed=5)}
    ks = keys(7, "groups")
    b = backend("memory://groups", pools)
    b.batch_set(ks, [pools["kv"].get_data_page(i * PS) for i in range(7)])
    b.batch_set_v2([PoolTransfer(name=PoolName.DEEPSEEK_V4_C128, keys=ks[:5],
                                 host_indices=pools["deepseek_v4_c128"].rows(range(5)), hit_policy=GROUPS)])
    res = b.batch_exists_v2(ks, [PoolTransfer(name=PoolName.DEEPSEEK_V4_C128, keys=ks, hit_policy=GROUPS,
                                              block_pages=2, group_pages=2)])
    assert res.kv_hit_pages == 7 and res.extra_pool_hit_pages[PoolName.DEEPSEEK_V4_C128] == 4
    b.close()


def test_mla_one_copy_written_by_the_storage_writer():
    """Replicated KV: one namespace for every TP rank; only rank 0 writes; every rank reads
    it. Mamba state stays per rank even for MLA models."""
    r0 = backend("memory://mla", {"kv": FakePool(seed=1), "mamba": FakePool(seed=2)}, tp=(0, 2), mla=True)
    r1 = backend("memory://mla", {"kv": FakePool(seed=3), "mamba": FakePool(seed=4)}, tp=(1, 2), mla=True)
    assert r0.namespaces()["kv"] == r1.namespaces()["kv"]
    assert r0.namespaces()["mamba"] != r1.namespaces()["mamba"]
    ks = keys(3, "mla")
    assert r1.batch_set_v1(ks, torch.arange(3 * PS)) == [True] * 3       # not the writer: nothing sent
    assert r1.hicache_stats()["kv"]["counters"].get("puts", 0) == 0 and r1.batch_exists(ks) == 0
    assert r0.batch_set_v1(ks, torch.arange(3 * PS)) == [True] * 3
    assert r1.batch_get_v1(ks, torch.arange(4 * PS, 7 * PS)) == [True] * 3
    pool0, pool1 = r0._slot("kv").pool, r1._slot("kv").pool
    assert all(pool1.page_bytes(4 + i) == pool0.page_bytes(i) for i in range(3))
    mha = [backend("memory://mha", {"kv": FakePool()}, tp=(t, 2)) for t in (0, 1)]
    assert mha[0].namespaces()["kv"] != mha[1].namespaces()["kv"]
    for b in (r0, r1, *mha):
        b.close()


def test_skips_stored_keys_and_reports_storage_metrics():
    pool = FakePool()
    b = backend("memory://metrics", {"kv": pool})
    ks = keys(4, "m")
    assert b.batch_set_v1(ks, pool.rows(range(4))) == [True] * 4
    assert b.batch_set_v1(ks, pool.rows(range(4))) == [True] * 4          # already stored: skipped
    c = b.hicache_stats()["kv"]["counters"]
    assert (c["puts"], c["put_objects"]) == (1, 4)
    assert b.batch_get_v1(ks[:3], pool.rows([8, 9, 10])) == [True] * 3
    m = b.get_stats()
    assert isinstance(m, StorageMetrics)
    assert (m.backup_pgs, m.prefetch_pgs) == ([4], [3])
    assert len(m.backup_bandwidth) == 1 and len(m.prefetch_bandwidth) == 1 and m.prefetch_bandwidth[0] > 0
    assert b.get_stats() == StorageMetrics()                              # drained
    quiet = backend("memory://metrics", {"kv": FakePool()}, metrics=False)
    quiet.batch_get_v1(ks, pool.rows(range(4)))
    assert quiet.get_stats() == StorageMetrics()
    b.close()
    quiet.close()


def test_unreachable_store_is_a_miss_never_an_exception():
    pool = FakePool()
    b = backend("redis://127.0.0.1:1/0", {"kv": pool, "swa": FakePool()},
                extra={"connect_timeout": 0.2, "breaker_threshold": 1, "breaker_cooldown_s": 30})
    ks = keys(3, "down")
    before = pool.kv_buffer.clone()
    assert b.batch_exists(ks) == 0 and not b.exists(ks[0])
    assert b.batch_set_v1(ks, pool.rows(range(3))) == [False] * 3
    assert b.batch_get_v1(ks, pool.rows(range(3))) == [False] * 3
    assert b.batch_get(ks) == [None] * 3 and b.batch_set(ks, [pool.get_data_page(0)] * 3) is False
    res = b.batch_exists_v2(ks, [PoolTransfer(name=PoolName.SWA, keys=ks[:1], hit_policy=TRAILING)])
    assert (res.kv_hit_pages, res.restorable_prefix_pages) == (0, [])
    assert b.batch_get_v2([PoolTransfer(name=PoolName.SWA, keys=ks, host_indices=pool.rows(range(3)),
                                        hit_policy=TRAILING)]) == {PoolName.SWA: [False] * 3}
    assert torch.equal(pool.kv_buffer, before)
    st = b.hicache_stats()
    assert st["kv"]["breaker"]["state"] == "open" and st["kv"]["faults"]["connection"] >= 1
    b.close()


def test_concurrent_threads_each_read_back_their_own_pages():
    """SGLang calls one backend from its prefetch, IO and backup threads at once: six
    threads, each with its own pool in one shared backend, write, check and read back."""
    b = backend("memory://threads", {"kv": FakePool()})
    src = {f"t{t}": FakePool(pages=8, seed=t) for t in range(6)}
    dst = {f"t{t}": FakePool(pages=8, seed=100 + t) for t in range(6)}
    for name, pool in src.items():
        b.register_mem_host_pool_v2(pool, name)
    errors: list = []

    def work(name: str) -> None:
        try:
            ks = keys(8, name)
            put = PoolTransfer(name=name, keys=ks, host_indices=src[name].rows(range(8)), hit_policy=ALL)
            get = PoolTransfer(name=name, keys=ks, host_indices=src[name].rows(range(8)), hit_policy=ALL)
            for _ in range(5):
                assert b.batch_set_v2([put]) == {name: [True] * 8}
                assert b.batch_exists_v2(ks, [get]).extra_pool_hit_pages == {}  # no KV pages stored
                b._slot(name).pool = dst[name]  # only this thread touches its slot
                assert b.batch_get_v2([get]) == {name: [True] * 8}
                assert all(dst[name].page_bytes(p) == src[name].page_bytes(p) for p in range(8))
                b._slot(name).pool = src[name]
        except BaseException as exc:  # reported below
            errors.append(exc)

    threads = [threading.Thread(target=work, args=(name,)) for name in src]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    assert not errors
    c = b.hicache_stats()
    assert all(c[name]["counters"]["put_objects"] == 8 and c[name]["counters"]["get_hits"] == 40 for name in src)
    b.close()


def test_bad_extra_config_fails_at_launch_with_one_line():
    with pytest.raises(ConfigError, match="extra_config.tiemout"):
        HiCacheStorageBackend(storage_config({**HICACHE_BACKEND, "url": "memory://", "tiemout": 1}), {})
    with pytest.raises(ConfigError, match="extra_config.url"):
        HiCacheStorageBackend(storage_config(dict(HICACHE_BACKEND)), {})
    with pytest.raises(ConfigError, match="storage_url"):
        HiCacheStorageBackend(storage_config({**HICACHE_BACKEND, "url": "s3://bucket"}), {})
