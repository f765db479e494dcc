"""What redis-py owns under our Redis backends (docs/storage.md, "Who does what"): reading
URLs, making and authenticating connections (ACL users, RESP2 without HELLO), re-making
them after a server restart, the cluster's slot map and what a MOVED redirect does to it.
And without redis-py installed, hicache still imports and a Redis URL is a one-line error.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from hicache.storage import L3Store, open_backend
from hicache.storage.redis_opts import Endpoint

from .conftest import page_hashes, rows

redis = pytest.importorskip("redis")
FP = "0123456789abcdef"


@pytest.mark.parametrize("url", [
    "redis://alice:s3cret@cache.local:6380/2",
    "redis://:pw@10.0.0.7:7000/0",
    "rediss://bob:pa%2Fss@h:6390/5",
    "redis://[::1]:7001/1",
    "unix://carol:pw@/run/redis/redis.sock?db=3",
])
def test_plain_urls_read_as_redis_py_reads_them(url):
    """For URLs urllib can split, our reading is redis-py's own ``parse_url``."""
    from redis.connection import parse_url

    theirs = parse_url(url)
    b = open_backend(url)
    ep, o = b.node.endpoint, b.node.opts
    if "path" in theirs:
        assert ep == Endpoint(path=theirs["path"])
    else:
        assert ep == Endpoint(theirs["host"], theirs["port"])
    assert (o.username, o.password, o.db) == (theirs.get("username"), theirs.get("password"), theirs.get("db", 0))
    assert o.tls == url.startswith("rediss")
    b.close()


def test_odd_password_reaches_redis_py_whole():
    """Our last-``@`` rule (a password with ``/ ? # @``) first, then redis-py's reader."""
    b = open_backend("redis://alice:p/a?s#s@w@h:1/2")
    kw = b.node.client.connection_pool.connection_kwargs
    assert (kw["username"], kw["password"], kw["host"], kw["port"], kw["db"]) == ("alice", "p/a?s#s@w", "h", 1, 2)
    b.close()


def test_clients_are_made_with_our_options_and_no_retries():
    b = open_backend("rediss://u:pw@h:7000/3?timeout=0.25&connect_timeout=0.1&ssl_check_hostname=0")
    pool = b.node.client.connection_pool
    kw = pool.connection_kwargs
    assert issubclass(pool.connection_class, redis.SSLConnection)
    assert (kw["socket_timeout"], kw["socket_connect_timeout"], kw["protocol"]) == (0.25, 0.1, 2)
    assert (kw["ssl_check_hostname"], kw["ssl_cert_reqs"]) == (False, "required")
    assert kw["retry"].get_retries() == 0          # the store's breaker paces retries
    b.close()
    unix = open_backend("unix:///run/r.sock?db=2")
    assert issubclass(unix.node.client.connection_pool.connection_class, redis.UnixDomainSocketConnection)
    unix.close()


@pytest.mark.redis
def test_acl_user_authenticates_and_connections_speak_resp2(redis_server):
    """An ACL user (``AUTH alice pw``, made by redis-py); the default user is switched off,
    so nothing works without it. Our connections are RESP2: redis-py 8 would send
    ``HELLO 3`` by default, and our data path parses RESP2."""
    assert redis_server.cli("ACL", "SETUSER", "alice", "on", ">s3cret", "~hc:*", "+@all") == "OK"
    assert redis_server.cli("ACL", "SETUSER", "default", "off") == "OK"
    url = f"redis://alice:s3cret@127.0.0.1:{redis_server.port}/0?connect_timeout=5"
    b = open_backend(url)
    try:
        assert b.put(["hc:acl:0", "hc:acl:1"], [b"x" * 100_000, b"y" * 10]) == [True, True]
        out = [bytearray(100_000), bytearray(10)]
        assert b.get_into(["hc:acl:0", "hc:acl:1"], out) == [100_000, 10] and out[1] == b"y" * 10
        mine = [c for c in b.node.client.client_list() if c["user"] == "alice"]
        assert mine and all(c["resp"] == "2" for c in mine)
        assert b.stats().objects == 2 and b.delete(["hc:acl:0", "hc:acl:1"]) == 2
    finally:
        b.close()
    wrong = L3Store(open_backend(url.replace("s3cret", "nope")), FP)
    assert wrong.lookup(page_hashes(1)) == 0 and wrong.stats(backend=False).faults["connection"] >= 1
    wrong.close()
    anonymous = L3Store(open_backend(f"redis://127.0.0.1:{redis_server.port}/0"), FP)
    assert anonymous.lookup(page_hashes(1)) == 0 and anonymous.stats(backend=False).faults["connection"] >= 1
    anonymous.close()


@pytest.mark.redis
def test_connections_are_remade_after_a_restart_without_a_fault(redis_server):
    """A kept connection is probed before reuse; one the restarted server closed is re-made
    by redis-py, so the first call after the restart already succeeds."""
    b = open_backend(redis_server.url + "?connections=2")
    big = [np.full(3 << 20, i, dtype=np.uint8) for i in range(2)]      # 6 MiB: split over two slices
    keys = ["hc:restart:0", "hc:restart:1"]
    assert b.put(keys, big) == [True, True]
    # Whether the put's two slices overlapped in time (two connections) or ran one after the
    # other (one, reused) is up to the scheduler; hold two at once so two are kept for sure.
    with b.node.connection(), b.node.connection():
        pass
    kept = [conn for conn, _ in b.node.lent._idle]    # made by redis-py, kept by the data path
    assert len(kept) == 2 and all(isinstance(c, redis.Connection) and c._sock is not None for c in kept)
    redis_server.kill()
    redis_server.start()                              # same port, empty
    assert b.exists(keys) == [False, False]           # no exception: re-connected
    assert b.put(keys, big) == [True, True]
    out = [np.zeros(3 << 20, dtype=np.uint8) for _ in range(2)]
    assert b.get_into(keys, out) == [3 << 20, 3 << 20] and all(np.array_equal(o, s) for o, s in zip(out, big))
    b.close()


@pytest.mark.redis
def test_moved_after_a_slot_migration_patches_redis_py_slot_map(redis_cluster):
    from hicache.storage.cluster import key_slot
    from tests.storage.test_cluster import _move_slot

    s = L3Store(open_backend(redis_cluster.url), FP, "moved-map")
    hs, src = page_hashes(3), rows(3, 30_000)
    assert s.put(hs, "page", list(src)) == [True] * 3
    backend = s.backend
    rc = backend._cluster()
    k = s.key(hs[2])
    slot = key_slot(k)
    owner = redis_cluster.owner(slot)
    target = next(n for n in redis_cluster.nodes if n is not owner)
    assert rc.nodes_manager.get_node_from_slot(slot).port == owner.port
    _move_slot(redis_cluster, slot, owner, target, [k])      # the whole migration: now MOVED
    moved = backend.redirects.get("moved")
    out = np.zeros_like(src)
    assert s.get(hs, "page", list(out)).hits == 3 and np.array_equal(out, src)
    assert backend.redirects.get("moved") == moved + 1
    # redis-py's map was patched by the redirect itself, before any refresh
    assert rc.nodes_manager.get_node_from_slot(slot).port == target.port
    refreshes = backend.redirects.get("map_refresh")
    assert s.lookup(hs) == 3 and backend.redirects.get("map_refresh") == refreshes + 1
    assert rc.nodes_manager.get_node_from_slot(slot).port == target.port   # and the refresh agrees
    s.delete(hs)
    s.close()


def _without_redis_py(code: str) -> subprocess.CompletedProcess:
    """Run ``code`` in a fresh interpreter where ``import redis`` fails (a plain install)."""
    prelude = "import sys; sys.modules['redis'] = None; sys.modules['hiredis'] = None\n"
    return subprocess.run([sys.executable, "-c", prelude + code], capture_output=True, text=True, timeout=120,
                          cwd=Path(__file__).resolve().parents[2])


def test_without_redis_py_hicache_imports_and_a_redis_url_is_one_line():
    r = _without_redis_py(
        "import hicache, hicache.storage\n"
        "from hicache.storage import open_backend\n"
        "from hicache.errors import ConfigError\n"
        "assert open_backend('memory://').put(['k'], [b'v']) == [True]\n"
        "try:\n"
        "    open_backend('redis://u:pw-sekret@h:1/0')\n"
        "except ConfigError as e:\n"
        "    print(e)\n"
        "try:\n"
        "    open_backend('redis://h:0/0')\n"   # a bad URL is still named as such
        "except ConfigError as e:\n"
        "    print(e)\n")
    assert r.returncode == 0, r.stderr
    first, second = r.stdout.splitlines()
    assert "hicache[redis]" in first and "pw-sekret" not in first
    assert "1..65535" in second
    cli = _without_redis_py("from hicache.cli.main import main\n"
                            "sys.exit(main(['l3', 'stats', '--url', 'redis://u:pw-sekret@127.0.0.1:1/0']))")
    assert cli.returncode == 2 and cli.stdout == ""
    assert cli.stderr.count("\n") == 1 and "hicache[redis]" in cli.stderr and "pw-sekret" not in cli.stderr
