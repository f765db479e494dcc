"""Item 5 of the issue against a real redis-server: absent, killed, restarted, paused, full,
foreign or corrupt values, keys evicted between lookup and read. In each case the store
answers misses instead of raising, counts the fault, keeps what the caller holds intact,
and uses Redis again once it is back."""

from __future__ import annotations

import os
import signal
import time

import numpy as np
import pytest

from hicache.storage import L3Config, L3Store, open_backend
from tests.redis_server import free_port

from .conftest import page_hashes, rows

pytestmark = pytest.mark.redis

FP = "0123456789abcdef"
OPTS = "?connect_timeout=0.2&timeout=0.3"


def store_for(url, **cfg):
    base = dict(breaker_threshold=2, breaker_cooldown_s=0.2, breaker_max_cooldown_s=0.4)
    base.update(cfg)
    return L3Store(open_backend(url + OPTS), FP, "faults", L3Config(**base))


def wait_until(pred, timeout=10.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if pred():
            return True
        time.sleep(0.05)
    return False


def test_absent_at_start_then_started(redis_server_factory):
    port = free_port()
    s = store_for(f"redis://127.0.0.1:{port}/0")
    hs, src = page_hashes(4), rows(4, 50_000)
    dst = np.full_like(src, 7)
    assert s.lookup(hs) == 0
    assert s.put(hs, "page", list(src)) == [False] * 4
    assert s.get(hs, "page", list(dst)).hits == 0
    st = s.stats(backend=False)
    assert st.breaker_state == "open" and st.faults["connection"] >= 2
    assert (dst == 7).all()
    # while open, calls never reach the network (a long cooldown keeps it open here)
    idle = store_for(f"redis://127.0.0.1:{port}/0", breaker_cooldown_s=60, breaker_max_cooldown_s=60)
    assert idle.lookup(hs) == 0 and idle.lookup(hs) == 0
    faults = idle.stats(backend=False).faults
    for _ in range(200):
        assert idle.lookup(hs) == 0
    st = idle.stats(backend=False)
    assert st.faults == faults and st.counters["lookup_short_circuited"] == 201
    idle.close()
    redis_server_factory(port=port)
    assert wait_until(lambda: s.put(hs, "page", list(src)) == [True] * 4)
    assert s.breaker.state == "closed"
    assert s.get(hs, "page", list(dst)).hits == 4 and np.array_equal(dst, src)
    s.close()


def test_killed_mid_run_then_restarted(redis_server):
    s = store_for(redis_server.url)
    hs, src = page_hashes(6), rows(6, 100_000)
    assert s.put(hs[:3], "page", list(src[:3])) == [True] * 3
    held = np.zeros_like(src)
    assert s.get(hs[:3], "page", list(held[:3])).hits == 3      # what the cache holds now
    snapshot = held.copy()
    redis_server.kill()
    ticket = s.put_async(hs[3:], "page", list(src[3:]))         # a backup in flight at the crash
    assert ticket.wait(10) and not ticket.ok and not ticket.dropped
    assert s.lookup(hs) == 0
    r = s.get(hs[:3], "page", list(held[3:6]))
    assert r.hits == 0 and r.stopped in ("fault", "breaker_open")
    assert np.array_equal(held[:3], snapshot[:3])              # nothing the caller held changed
    st = s.stats(backend=False)
    assert st.breaker_state == "open" and st.breaker_trips >= 1
    assert st.faults.get("connection", 0) >= 1
    redis_server.start()                                        # same port, empty (no persistence)
    assert wait_until(lambda: s.put(hs, "page", list(src)) == [True] * 6)
    assert s.lookup(hs) == 6
    out = np.zeros_like(src)
    assert s.get(hs, "page", list(out)).hits == 6 and np.array_equal(out, src)
    s.close()


def test_paused_server_times_out_and_recovers(redis_server):
    s = store_for(redis_server.url)
    hs, src = page_hashes(2), rows(2, 10_000)
    s.put(hs, "page", list(src))
    os.kill(redis_server.proc.pid, signal.SIGSTOP)
    try:
        assert s.lookup(hs) == 0
        assert s.lookup(hs) == 0
        st = s.stats(backend=False)
        assert st.faults["timeout"] >= 2 and st.breaker_state == "open"
    finally:
        os.kill(redis_server.proc.pid, signal.SIGCONT)
    assert wait_until(lambda: s.lookup(hs) == 2)
    s.close()


def test_full_server_refuses_puts_and_keeps_serving(redis_server_factory):
    server = redis_server_factory("--maxmemory", "3mb", "--maxmemory-policy", "noeviction")
    s = store_for(server.url)
    hs, src = page_hashes(40), rows(40, 200_000)
    stored = s.put(hs, "page", list(src))
    refused = stored.count(False)
    assert 0 < refused < 40     # which ones depends on the server's memory at each SET
    assert s.breaker.state == "closed"                      # a full server is reachable
    assert s.stats().backend["errors"]["full"] == refused
    assert s.stats(backend=False).counters["put_failed"] == refused
    for i in (i for i, ok in enumerate(stored) if ok):
        out = np.zeros(200_000, dtype=np.uint8)
        assert s.get([hs[i]], "page", [out]).hits == 1 and np.array_equal(out, src[i])
    s.close()


def test_lru_server_evicts_and_lookups_shorten(redis_server_factory):
    server = redis_server_factory("--maxmemory", "4mb", "--maxmemory-policy", "allkeys-lru")
    s = store_for(server.url)
    hs, src = page_hashes(60), rows(60, 200_000)
    assert all(s.put(hs, "page", list(src)))
    assert s.lookup(hs) < 60   # the oldest pages were evicted
    assert s.stats().backend["evictions"] > 0
    s.close()


def test_foreign_corrupt_and_wrongtype_values_are_rejected(redis_server):
    s = store_for(redis_server.url)
    hs, src = page_hashes(5), rows(5, 4096)
    s.put(hs, "page", list(src))
    assert redis_server.cli("SET", s.key(hs[1]), "hello from another program") == "OK"
    dst = np.full_like(src, 0x5A)
    r = s.get(hs, "page", list(dst))
    assert (r.hits, r.stopped) == (1, "foreign") and (dst[1] == 0x5A).all()
    # a bit flipped in the payload
    s.put(hs[1:2], "page", [src[1]])
    good = bytearray(4096 + 64)
    s.backend.get_into([s.key(hs[2])], [good])
    good[64 + 17] ^= 1
    s.backend.put([s.key(hs[2])], [bytes(good)])
    r = s.get(hs, "page", list(dst))
    assert (r.hits, r.stopped) == (2, "corrupt")
    # another data type under our key
    redis_server.cli("DEL", s.key(hs[2]))
    redis_server.cli("RPUSH", s.key(hs[2]), "a", "b")
    r = s.get(hs, "page", list(dst))
    assert (r.hits, r.stopped) == (2, "foreign")
    st = s.stats()
    assert st.rejected == {"foreign": 2, "corrupt": 1} and st.backend["errors"] == {"wrongtype": 1}
    assert st.breaker_state == "closed"
    s.close()


def test_key_evicted_between_lookup_and_read(redis_server):
    s = store_for(redis_server.url)
    hs, src = page_hashes(5), rows(5, 8192)
    s.put(hs, "page", list(src))
    assert s.lookup(hs) == 5
    redis_server.cli("DEL", s.key(hs[3]))
    dst = np.zeros_like(src)
    r = s.get(hs, "page", list(dst))
    assert (r.hits, r.stopped) == (3, "missing") and np.array_equal(dst[:3], src[:3])
    assert s.stats(backend=False).faults == {}
    s.close()


def test_wrong_password_is_a_counted_fault_not_a_crash(redis_server_factory):
    server = redis_server_factory("--requirepass", "right")
    s = L3Store(open_backend(f"redis://:wrong@127.0.0.1:{server.port}/0"), FP)
    assert s.lookup(page_hashes(2)) == 0
    assert s.stats(backend=False).faults["connection"] >= 1
    ok = L3Store(open_backend(f"redis://:right@127.0.0.1:{server.port}/0"), FP)
    assert ok.put(page_hashes(1), "page", [b"x" * 10]) == [True]
    s.close()
    ok.close()
