"""Authenticated L3 objects through the facade: a well-formed object planted by a writer
without the deployment key is never served -- counted, zero bytes mismatched, deleted and
rewritten -- and the engine keeps serving; on file://, one Redis and a 3-node cluster."""

from __future__ import annotations

import numpy as np
import pytest

from hicache.storage import L3Store, open_backend
from tests.cache.conftest import Engine, make_cache, toks
from tests.redis_server import REDIS_SERVER, SKIP_REASON, RedisCluster, RedisServer

KEY_ENV = "HICACHE_TEST_L3_KEYS"
KEY = "k" * 16 + "0123456789abcdef0123456789abcdef"


@pytest.fixture(params=["file", "redis", "cluster"])
def l3_url(request, tmp_path):
    if request.param == "file":
        yield f"file://{tmp_path}/l3"
        return
    if REDIS_SERVER is None:
        pytest.skip(SKIP_REASON)
    server = RedisServer() if request.param == "redis" else RedisCluster(3)
    try:
        yield server.url
    finally:
        server.close()


def push_out(eng, start=50, n=12):
    for v in range(start, start + n):
        eng.run(toks(v, v + 100, extra=1))
    eng.cache.drain()


def plant(url, cache, hashes, kinds):
    """A writer with store access but not the key: well-formed objects (right key, header,
    layout, checksum) with bytes of its own, under the engine's real keys."""
    layout = cache.layout
    attacker = L3Store(open_backend(url), layout.fingerprint, "t")
    rng = np.random.default_rng(7)
    for h, kind in zip(hashes, kinds):
        payload = rng.integers(0, 256, layout.object_bytes(kind), dtype=np.uint8)
        assert attacker.put([h], kind, [payload]) == [True]
    attacker.close()


@pytest.mark.redis
def test_a_planted_object_without_the_key_is_never_served(l3_url, monkeypatch):
    monkeypatch.setenv(KEY_ENV, KEY)
    eng = Engine(make_cache(storage=l3_url, device_pages=4, host_pages=10, device_snaps=2, host_snaps=4,
                            auth_key=f"env:{KEY_ENV}"))
    cache = eng.cache
    a = toks(1, 2, 3, extra=1)
    eng.run(a)
    cache.drain()
    hashes = cache.page_hashes(a)
    plant(l3_url, cache, hashes + hashes[-1:], ["page"] * 3 + ["state"])
    push_out(eng)
    m = cache.match(a)
    assert m.resume_tokens == 0
    assert cache.finish_prefetch(cache.prefetch(m)) == 0          # nothing planted is inserted
    l3 = cache.l3_stats()
    assert l3["rejected"].get("unauthenticated", 0) >= 1
    assert cache.counters.l3_hit_tokens == 0
    # The engine keeps serving: it recomputes a (its bytes are checked on every resume:
    # zero mismatched) and serves other traffic.
    eng.run(a)
    eng.run(toks(9, 8, extra=1))
    cache.drain()
    # Each planted object a read rejects is deleted and rewritten with the MAC by the next
    # backup of its page (a read stops at the first bad object, so one per round): within
    # a few rounds a prefetch gets the engine's own bytes back, verified.
    for rnd in range(6):
        push_out(eng, start=70 + 20 * rnd)
        got = cache.finish_prefetch(cache.prefetch(cache.match(a)))
        if got == 12:
            break
        eng.run(a)
        cache.drain()
    assert got == 12 and rnd <= 4
    _, lease = eng.start(a)
    assert lease.l3_tokens == 12
    cache.release(lease)
    assert cache.l3_stats()["counters"].get("repaired_deleted", 0) >= 1
    cache.check_integrity()
    cache.close()


def test_an_engine_with_the_key_reads_what_another_with_the_key_wrote(tmp_path, monkeypatch):
    monkeypatch.setenv(KEY_ENV, KEY)
    url = f"file://{tmp_path}/l3"
    writer = Engine(make_cache(storage=url, auth_key=f"env:{KEY_ENV}"))
    a = toks(1, 2, 3, extra=1)
    writer.run(a)
    writer.cache.drain()
    writer.cache.close()
    reader = Engine(make_cache(storage=url, auth_key=f"env:{KEY_ENV}"))
    assert reader.cache.finish_prefetch(reader.cache.prefetch(reader.cache.match(a))) == 12
    keyless = Engine(make_cache(storage=url))                     # another format: left alone
    assert keyless.cache.finish_prefetch(keyless.cache.prefetch(keyless.cache.match(a))) == 0
    assert keyless.cache.l3_stats()["rejected"] == {"version": 1}
    for e in (reader, keyless):
        e.cache.check_integrity()
        e.cache.close()
