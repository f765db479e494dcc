"""The object parser under attack, through every backend's read path (memory, file, Redis):
random bytes, truncations, lengths larger than the value, wrong kinds, flipped bytes, with
and without authenticated objects. Whatever a value holds, ``get`` never raises, never
allocates by a length the value claims, and a value that is not exactly a good object is
one counted miss that leaves the caller's row unused (``hits == 0``)."""

from __future__ import annotations

import struct
import tracemalloc
import zlib

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from hicache.storage import L3Store, ObjectKeys, open_backend
from hicache.storage.objects import HEADER, HEADER_BYTES
from tests.redis_server import REDIS_SERVER, SKIP_REASON, RedisServer

PAYLOAD = 512
H = bytes(range(32))
KEY = "f" * 40


@pytest.fixture(scope="module", params=["memory", "file", "redis"])
def backend(request, tmp_path_factory):
    if request.param == "memory":
        yield open_backend("memory://fuzz")
        return
    if request.param == "file":
        yield open_backend(f"file://{tmp_path_factory.mktemp('fuzz')}")
        return
    if REDIS_SERVER is None:
        pytest.skip(SKIP_REASON)
    server = RedisServer()
    b = open_backend(server.url)
    yield b
    b.close()
    server.close()


def good_value(store: L3Store, payload: bytes, kind: str = "page") -> bytes:
    view = [memoryview(payload)]
    return store.codec.header(H, kind, view) + payload


def refix_crc(value: bytearray) -> None:
    """Make the header's own crc right again, so the check goes past it to the fields."""
    if len(value) >= HEADER_BYTES:
        value[60:64] = struct.pack("<I", zlib.crc32(bytes(value[:60])))


def with_field(value: bytes, index: int, new: object) -> bytearray:
    fields = list(HEADER.unpack_from(value))
    fields[index] = new
    out = bytearray(value)
    out[:HEADER_BYTES] = HEADER.pack(*fields)
    refix_crc(out)
    return out


def mutations(store_value: bytes):
    """Values derived from a good one: each must be rejected."""
    n = len(store_value)
    return st.one_of(
        st.binary(max_size=2 * n),                                                # random bytes
        st.integers(0, n - 1).map(lambda k: store_value[:k]),                     # truncated
        st.tuples(st.integers(0, n - 1), st.integers(1, 255)).map(                 # one byte flipped
            lambda t: store_value[:t[0]] + bytes([store_value[t[0]] ^ t[1]]) + store_value[t[0] + 1:]),
        st.integers(PAYLOAD + 1, 2 ** 64 - 1).map(lambda plen: bytes(with_field(store_value, 9, plen))),  # claims more
        st.integers(0, PAYLOAD - 1).map(lambda plen: bytes(with_field(store_value, 9, plen))),  # claims less
        st.integers(0, 2 ** 32 - 1).filter(lambda hb: hb not in (64, 96)).map(     # header length
            lambda hb: bytes(with_field(store_value, 4, hb))),
        st.integers(0, 255).filter(lambda k: k != 1).map(lambda k: bytes(with_field(store_value, 2, k))),  # kind
        st.integers(0, 65535).filter(lambda v: v not in (1, 2)).map(lambda v: bytes(with_field(store_value, 1, v))),
        st.binary(min_size=1, max_size=64).map(lambda extra: store_value + extra),  # trailing bytes
    )


def _fuzz(backend, keys, data, *, examples: int):
    store = L3Store(backend, "fuzzfp", "fuzz", keys=keys)
    payload = np.random.default_rng(1).integers(0, 256, PAYLOAD, dtype=np.uint8).tobytes()
    good = good_value(store, payload)
    key = store.key(H, "page")

    @settings(max_examples=examples, deadline=None, suppress_health_check=list(HealthCheck),
              derandomize=True)
    @given(mutations(good))
    def run(value):
        assert backend.put([key], [value]) == [True]
        dst = np.zeros(PAYLOAD, np.uint8)
        rejected = sum(store.rejected.snapshot().values())
        tracemalloc.start()
        try:
            res = store.get([H], "page", [dst])          # must not raise, whatever the value
            peak = tracemalloc.get_traced_memory()[1]
        finally:
            tracemalloc.stop()
        assert peak < (1 << 20), f"get allocated {peak} bytes for a {len(value)}-byte value"
        if value == good:
            assert res.hits == 1 and dst.tobytes() == payload
            return
        assert res.hits == 0 and res.nbytes == 0 and res.stopped not in (None, "fault", "missing"), res
        assert sum(store.rejected.snapshot().values()) == rejected + 1      # one counted miss

    run()
    # the same values under the state key (a wrong kind): never served either
    assert backend.put([store.key(H, "state")], [good]) == [True]
    res = store.get([H], "state", [np.zeros(PAYLOAD, np.uint8)])
    assert res.hits == 0 and res.stopped == "foreign"
    st_ = store.stats(backend=False)
    assert not st_.faults and st_.breaker_state == "closed"


def test_plain_objects_under_attack(backend):
    _fuzz(backend, None, None, examples=120)


def test_authenticated_objects_under_attack(backend):
    _fuzz(backend, ObjectKeys([KEY.encode()]), None, examples=120)


def test_lookup_and_exists_never_raise_on_foreign_values(backend):
    store = L3Store(backend, "fuzzfp", "fuzz2")
    backend.put([store.key(H, "page")], [b"\x00" * 3])
    assert store.lookup([H], "page") == 1                 # existence only: the read decides
    assert store.get([H], "page", [np.zeros(PAYLOAD, np.uint8)]).hits == 0
