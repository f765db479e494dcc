"""The backend protocol, the same checks for every backend (Redis ones start their own server)."""

from __future__ import annotations

import shutil

import numpy as np
import pytest
import torch

from hicache.errors import MisuseError
from hicache.storage import STORAGE_PROTOCOL_VERSION, StorageBackend, open_backend
from tests.redis_server import REDIS_SERVER, SKIP_REASON, RedisServer

from .conftest import rows

BACKENDS = ["memory", "file", "redis", "redis-unix", "redis-acl", "redis-tls", "cluster"]


@pytest.fixture(params=BACKENDS)
def backend(request, tmp_path):
    kind = request.param
    if kind == "memory":
        b = open_backend("memory://")
        yield b
        b.close()
        return
    if kind == "file":
        b = open_backend(f"file://{tmp_path}/l3")
        yield b
        b.close()
        return
    if REDIS_SERVER is None:
        pytest.skip(SKIP_REASON)
    request.applymarker(pytest.mark.redis)
    if kind == "cluster":
        cluster = request.getfixturevalue("redis_cluster")
        b = open_backend(cluster.url)
        yield b
        for node in cluster.nodes:
            node.cli("FLUSHALL")
        b.close()
        return
    if kind == "redis-tls" and shutil.which("openssl") is None:
        pytest.skip("openssl is needed to make a test certificate")
    server = RedisServer(unix=kind == "redis-unix", tls=kind == "redis-tls")
    try:
        if kind == "redis-unix":
            url = f"unix://{server.unix_path}"
        elif kind == "redis-acl":
            assert server.cli("ACL", "SETUSER", "alice", "on", ">s3cret", "~*", "+@all") == "OK"
            server.cli("ACL", "SETUSER", "default", "off")
            url = f"redis://alice:s3cret@127.0.0.1:{server.port}/2"
        elif kind == "redis-tls":
            url = f"rediss://localhost:{server.port}/0?ssl_ca_certs={server.cert}"
        else:
            url = server.url + "?connections=3&pipeline=2"
        b = open_backend(url)
        yield b
        b.close()
    finally:
        server.close()


def test_round_trip(backend):
    assert isinstance(backend, StorageBackend)
    assert backend.protocol_version == STORAGE_PROTOCOL_VERSION
    data = rows(12, 300_001, seed=1)  # odd size; > 4 MiB in all, so Redis fans out
    keys = [f"t:k{i}" for i in range(12)]
    assert backend.exists_prefix(keys) == 0
    assert backend.put(keys[:7], list(data[:7])) == [True] * 7
    assert backend.exists(keys[5:9]) == [True, True, False, False]
    assert backend.exists_prefix(keys) == 7
    assert backend.exists_prefix([keys[0], "t:none", keys[1]]) == 1
    out = np.zeros_like(data)
    lengths = backend.get_into(keys[:8], list(out[:8]))
    assert lengths == [300_001] * 7 + [None]
    assert np.array_equal(out[:7], data[:7])
    assert not out[7].any()  # a miss writes nothing
    assert backend.delete(keys[:2] + ["t:none"]) == 2
    assert backend.exists_prefix(keys) == 0 and backend.exists(keys[2:3]) == [True]
    st = backend.stats()
    assert st.kind == backend.kind and st.objects is not None and st.objects >= 5
    d = st.to_dict()
    assert d["kind"] == backend.kind and "s3cret" not in d["url"]


def test_scatter_gather_and_short_long_values(backend):
    head, body = b"H" * 64, rows(1, 70_000, seed=2)[0]
    assert backend.put(["t:sg"], [[head, body]]) == [True]
    h2, b2 = bytearray(64), np.zeros(70_000, dtype=np.uint8)
    assert backend.get_into(["t:sg"], [[h2, b2]]) == [70_064]
    assert bytes(h2) == head and np.array_equal(b2, body)
    # buffers smaller than the value: the result is the full length, the rest is dropped
    small = bytearray(100)
    assert backend.get_into(["t:sg", "t:sg"], [small, bytearray(10)]) == [70_064, 70_064]
    assert bytes(small) == head + bytes(body[:36])
    # buffers larger than the value: the tail is untouched
    big = bytearray(b"\xee" * 70_100)
    assert backend.get_into(["t:sg"], [big]) == [70_064]
    assert big[70_064:] == b"\xee" * 36
    # torch tensors and empty lists
    t = torch.arange(1000, dtype=torch.int32)
    assert backend.put(["t:torch"], [t]) == [True]
    u = torch.zeros(1000, dtype=torch.int32)
    assert backend.get_into(["t:torch"], [u]) == [4000]
    assert torch.equal(t, u)
    assert backend.get_into([], []) == [] and backend.put([], []) == [] and backend.exists([]) == []


def test_accept_hook_drops_the_rest_of_a_value(backend):
    backend.put(["t:a", "t:b"], [b"GOOD" + b"x" * 20000, b"EVIL" + b"y" * 20000])
    heads = [bytearray(4), bytearray(4)]
    bodies = [bytearray(b"\0" * 20000), bytearray(b"\0" * 20000)]
    seen = []

    def accept(i, length, head):
        seen.append((i, length, bytes(head)))
        return bytes(head) == b"GOOD"

    lengths = backend.get_into(["t:a", "t:b"], [[heads[0], bodies[0]], [heads[1], bodies[1]]], accept)
    assert lengths == [20004, 20004]
    assert sorted(seen) == [(0, 20004, b"GOOD"), (1, 20004, b"EVIL")]
    assert bodies[0] == b"x" * 20000
    assert bodies[1] == b"\0" * 20000  # the refused value never reached its destination


def test_readonly_and_strided_buffers_are_misuse(backend):
    backend.put(["t:r"], [b"abc"])
    with pytest.raises(MisuseError):
        backend.get_into(["t:r"], [b"xyz"])
    with pytest.raises(MisuseError):
        backend.put(["t:s"], [np.zeros((4, 4), dtype=np.uint8)[:, 1]])
    with pytest.raises(MisuseError):
        backend.put(["bad key with spaces"], [b"x"])


def test_scan_lists_exactly_the_prefix_in_batches(backend):
    """Key enumeration (protocol 2): every key under the prefix once, with its length; keys
    outside the prefix never; a cluster is scanned on every primary."""
    ours = {f"scan:a:{i:03d}": 100 + i for i in range(37)}
    other = {f"scan:b:{i}": 7 for i in range(5)}
    data = {**ours, **other}
    assert all(backend.put(list(data), [np.full(n, 1, np.uint8) for n in data.values()]))
    batches = list(backend.scan("scan:a:", batch=10))
    found = [kv for b in batches for kv in b]
    assert dict(found) == ours
    assert len(found) == len(ours)  # no key twice (no resize happens in this test)
    if backend.kind in ("memory", "file"):
        assert [len(b) for b in batches] == [10, 10, 10, 7]
    assert dict(kv for b in backend.scan("scan:", batch=1000) for kv in b) == data
    assert list(backend.scan("scan:none:")) == []
    assert backend.delete(list(data)) == len(data)
    assert not any(b for b in backend.scan("scan:"))
