"""L3Store: keys, verified reads into pool rows, rejections, namespaces, the breaker."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from hicache.config import load_config
from hicache.errors import MisuseError
from hicache.pools import TierPools
from hicache.storage import L3Config, L3Store, open_backend
from hicache.storage.faults import StorageConnectionError, StorageTimeout
from hicache.storage.objects import HEADER_BYTES
from tests.storage.gated import ForwardingBackend

from .conftest import page_hashes, rows

FP = "0123456789abcdef"
PAGE = 4096


def make(url="memory://", fp=FP, salt="", **cfg):
    return L3Store(open_backend(url), fp, salt, L3Config(**cfg))


def raw(store, h, kind="page") -> bytearray:
    buf = bytearray(1 << 20)
    n = store.backend.get_into([store.key(h, kind)], [buf])[0]
    return buf[:n]


def test_put_lookup_get_exact():
    s = make(read_batch=3)
    hs = page_hashes(10)
    src = rows(10, PAGE)
    assert s.put(hs[:7], "page", list(src[:7])) == [True] * 7
    assert s.lookup(hs, "page") == 7
    assert s.lookup(hs, "state") == 0
    dst = np.zeros_like(src)
    r = s.get(hs, "page", list(dst))
    assert (r.hits, r.nbytes, r.stopped) == (7, 7 * PAGE, "missing")
    assert np.array_equal(dst[:7], src[:7])
    c = s.stats().counters
    assert (c["puts"], c["put_ok"], c["put_bytes"], c["get_hits"], c["lookup_hits"]) == (1, 7, 7 * PAGE, 7, 7)
    assert c["get_stopped_missing"] == 1
    assert s.stats().backend["objects"] == 7
    s.close()


def test_get_into_host_pool_rows_page_first(configs_dir):
    layout, cfg = load_config(configs_dir / "tiny-hybrid.yaml")
    host = TierPools(layout, "host", num_pages=8, num_snapshots=4, host_layout="page_first")
    pages = host.object_view("page")
    states = host.object_view("state")
    s = L3Store(open_backend("memory://"), layout.fingerprint, "tiny")
    hs = page_hashes(3)
    src = rows(3, pages.shape[1], seed=3)
    pages[:3] = torch_from(src)
    snap = rows(1, states.shape[1], seed=4)[0]
    states[0] = torch_from(snap)
    assert s.put(hs, "page", [pages[i] for i in range(3)]) == [True] * 3
    assert s.put(hs[2:], "state", [states[0]]) == [True]
    pages[4:7] = 0
    states[1] = 0
    assert s.get(hs, "page", [pages[4 + i] for i in range(3)]).hits == 3
    assert s.get(hs[2:], "state", [states[1]]).hits == 1
    assert np.array_equal(pages[4:7].numpy(), src) and np.array_equal(states[1].numpy(), snap)
    # a state object is not a page object
    assert s.get(hs[2:], "page", [pages[7]]).hits == 1 and s.lookup(hs[:1], "state") == 0


def torch_from(a):
    import torch

    return torch.from_numpy(a)


@pytest.mark.parametrize("damage, reason", [
    ("flip_payload", "corrupt"), ("flip_header", "corrupt"), ("truncate", "truncated"),
    ("foreign", "foreign"), ("other_layout", "foreign"), ("wrong_size", "wrong_size"),
    ("empty", "foreign"),
])
def test_bad_values_end_the_prefix_and_are_counted(damage, reason):
    s = make()
    hs = page_hashes(4)
    src = rows(4, PAGE, seed=5)
    s.put(hs, "page", list(src))
    key = s.key(hs[2], "page")
    value = raw(s, hs[2])
    if damage == "flip_payload":
        value[HEADER_BYTES + 1000] ^= 0x40
    elif damage == "flip_header":
        value[20] ^= 1
    elif damage == "truncate":
        value = value[:HEADER_BYTES + 100]
    elif damage == "foreign":
        value = bytearray(b"somebody else's cache entry" * 200)
    elif damage == "other_layout":
        other = make(fp="ffffffffffffffff")
        other.put([hs[2]], "page", [src[2]])
        value = raw(other, hs[2])
    elif damage == "wrong_size":
        s.put([hs[2]], "page", [rows(1, PAGE * 2)[0]])
        value = raw(s, hs[2])
    elif damage == "empty":
        value = bytearray()
    s.backend.put([key], [bytes(value)])
    dst = np.full((4, PAGE), 0xAB, dtype=np.uint8)
    r = s.get(hs, "page", list(dst))
    assert (r.hits, r.stopped) == (2, reason)
    assert np.array_equal(dst[:2], src[:2])
    if damage not in ("flip_payload",):
        # the header was checked before the payload: a rejected value never touches the row
        assert (dst[2] == 0xAB).all()
    assert s.stats().rejected == {reason: 1}
    # the rejected value was deleted, so lookups stop there and a backup can rewrite it
    assert s.lookup(hs) == 2 and s.stats().counters["repaired_deleted"] == 1
    assert s.put([hs[2]], "page", [src[2]]) == [True]
    r = s.get(hs, "page", list(dst))
    assert (r.hits, r.stopped) == (4, None) and np.array_equal(dst, src)


def test_namespace_isolation_between_layouts_and_salts(configs_dir):
    from hicache.layout import CacheLayout

    hybrid = CacheLayout.from_yaml(configs_dir / "tiny-hybrid.yaml")
    mha = CacheLayout.from_yaml(configs_dir / "tiny-mha.yaml")
    backend = open_backend("memory://")
    a = L3Store(backend, hybrid.fingerprint, "model-a")
    b = L3Store(backend, mha.fingerprint, "model-a")
    c = L3Store(backend, hybrid.fingerprint, "model-c")
    hs = page_hashes(3)
    a.put(hs, "page", list(rows(3, PAGE)))
    assert (a.lookup(hs), b.lookup(hs), c.lookup(hs)) == (3, 0, 0)
    # even a value copied under the other layout's key is refused by its header
    b.backend.put([b.key(hs[0])], [bytes(raw(a, hs[0]))])
    assert b.lookup(hs) == 1 and b.get(hs[:1], "page", [bytearray(PAGE)]).stopped == "foreign"
    assert len({a.namespace, b.namespace, c.namespace}) == 3
    # the same hash under another namespace is another key
    assert a.key(hs[0]) != b.key(hs[0])


def test_misuse_raises():
    s = make()
    with pytest.raises(MisuseError):
        s.get(page_hashes(2), "page", [bytearray(8)])
    with pytest.raises(MisuseError):
        s.put(page_hashes(1), "page", [b"a", b"b"])
    with pytest.raises(MisuseError):
        s.get(page_hashes(1), "page", [b"readonly"])
    with pytest.raises(MisuseError):
        L3Store(open_backend("memory://"), "not a fingerprint!", "")


class FlakyBackend(ForwardingBackend):
    """Wraps a backend; raises the queued faults before delegating."""

    kind = "flaky"
    url = "flaky://"

    def __init__(self, inner):
        super().__init__(inner)
        self.faults: list[Exception] = []
        self.calls = 0

    def _before(self, op, n):
        self.calls += 1
        if self.faults:
            raise self.faults.pop(0)


class Clock:
    t = 0.0

    def __call__(self):
        return self.t


def test_reads_retry_once_writes_never_and_breaker_trips():
    fb = FlakyBackend(open_backend("memory://"))
    clock = Clock()
    s = L3Store(fb, FP, "", L3Config(breaker_threshold=3, breaker_cooldown_s=5), clock=clock)
    hs = page_hashes(2)
    src = rows(2, PAGE)
    # a write fault is not retried
    fb.faults = [StorageConnectionError("x")]
    assert s.put(hs, "page", list(src)) == [False, False]
    assert fb.calls == 1
    assert s.put(hs, "page", list(src)) == [True, True]
    # a read fault is retried once, transparently
    fb.faults = [StorageTimeout("slow")]
    assert s.lookup(hs) == 2
    assert s.stats().counters["lookup_retries"] == 1
    # two read faults in a row: a miss; consecutive faults = 1 (put) reset... now 2 more -> 3 -> open
    fb.faults = [StorageTimeout("a"), StorageTimeout("b")]
    assert s.lookup(hs) == 0
    assert s.breaker.state == "closed"
    fb.faults = [StorageTimeout("c")]
    dst = np.zeros_like(src)
    calls = fb.calls
    r = s.get(hs, "page", list(dst))
    assert r.hits == 0 and r.stopped == "breaker_open" and fb.calls == calls + 1
    assert s.breaker.state == "open"
    # while open: every call is a miss without touching the backend
    calls = fb.calls
    assert s.lookup(hs) == 0 and s.put(hs, "page", list(src)) == [False, False]
    assert s.get(hs, "page", list(dst)).stopped == "breaker_open"
    assert fb.calls == calls
    # after the cooldown one probe goes through and closes the breaker
    clock.t += 5.0
    assert s.lookup(hs) == 2 and s.breaker.state == "closed"
    st = s.stats()
    assert st.faults == {"connection": 1, "timeout": 4, "put.connection": 1, "lookup.timeout": 3,
                         "get.timeout": 1}
    # refused: the get's own retry right after the trip, then lookup, put and get
    assert st.breaker_trips == 1 and st.breaker_refused == 4


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.lists(st.tuples(st.sampled_from(["put", "get", "delete", "corrupt"]),
                          st.integers(0, 7), st.integers(1, 4)), max_size=25))
def test_random_operations_match_a_model(ops):
    """Random puts / gets / deletes / corruptions against a dict model of what is stored."""
    s = make(read_batch=2)
    hs = page_hashes(12)
    data = rows(12, 512, seed=9)
    model: dict[int, str] = {}  # index -> "ok" | "bad"
    for op, start, n in ops:
        idx = list(range(start, min(start + n, 12)))
        if op == "put":
            assert s.put([hs[i] for i in idx], "page", [data[i] for i in idx]) == [True] * len(idx)
            model.update({i: "ok" for i in idx})
        elif op == "delete":
            s.delete([hs[i] for i in idx])
            for i in idx:
                model.pop(i, None)
        elif op == "corrupt":
            for i in idx:
                if i in model:
                    v = raw(s, hs[i])
                    v[-1] = data[i][-1] ^ 0xFF  # the same damage however often applied
                    s.backend.put([s.key(hs[i])], [bytes(v)])
                    model[i] = "bad"
        else:
            dst = np.zeros((len(idx), 512), dtype=np.uint8)
            r = s.get([hs[i] for i in idx], "page", list(dst))
            expect = 0
            for i in idx:
                if model.get(i) != "ok":
                    break
                expect += 1
            assert r.hits == expect
            assert np.array_equal(dst[:expect], data[idx[:expect]])
            if expect < len(idx) and model.get(idx[expect]) == "bad":
                del model[idx[expect]]  # a rejected value is deleted (repair)
            exists = 0
            for i in idx:
                if i not in model:
                    break
                exists += 1
            assert s.lookup([hs[i] for i in idx]) == exists
