"""Fixtures for the storage tests: private redis-server processes on free loopback ports."""

from __future__ import annotations

import hashlib

import numpy as np
import pytest

from tests.redis_server import REDIS_SERVER, SKIP_REASON, RedisCluster, RedisServer

needs_redis = pytest.mark.skipif(REDIS_SERVER is None, reason=SKIP_REASON)


@pytest.fixture
def redis_server():
    """A fresh redis-server for one test (stopped by PID afterwards)."""
    if REDIS_SERVER is None:
        pytest.skip(SKIP_REASON)
    server = RedisServer()
    yield server
    server.close()


@pytest.fixture(scope="module")
def shared_redis():
    """One redis-server for a whole module (tests flush what they use)."""
    if REDIS_SERVER is None:
        pytest.skip(SKIP_REASON)
    server = RedisServer(unix=True)
    yield server
    server.close()


@pytest.fixture(scope="module")
def redis_cluster():
    if REDIS_SERVER is None:
        pytest.skip(SKIP_REASON)
    cluster = RedisCluster(3)
    yield cluster
    cluster.close()


def page_hashes(n: int, seed: str = "chain") -> list[bytes]:
    """A chained SHA-256 hash list, like the tree produces."""
    out, prev = [], b""
    for i in range(n):
        prev = hashlib.sha256(prev + f"{seed}:{i}".encode()).digest()
        out.append(prev)
    return out


def rows(n: int, nbytes: int, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, 256, size=(n, nbytes), dtype=np.uint8)


@pytest.fixture
def redis_server_factory():
    """Start redis-servers with extra arguments (``port=`` to pick one); all stopped after."""
    if REDIS_SERVER is None:
        pytest.skip(SKIP_REASON)
    servers = []

    def start(*args, port=None):
        s = RedisServer(*args, port=port)
        servers.append(s)
        return s

    yield start
    for s in servers:
        s.close()
