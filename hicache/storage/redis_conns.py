"""redis-py's connections, as our data path uses them.

redis-py makes every connection (dial, TLS with certificate and host-name checks, ``AUTH
[user] password``, ``SELECT``) from a ``redis.Redis`` client's pool; this module makes those
clients from our options (:func:`standalone_client`, :func:`socket_tuner`, no retries),
turns redis-py's exceptions into ours (:func:`storage_error`), and lends pooled connections
to the data path (:class:`LentConnections`).

Why lend instead of checking out per operation: a redis-py pool checkout and release costs
about 23 us on this box (a deprecation-argument wrapper, a health probe, metrics hooks, an
event dispatch), a quarter of a 64-key ``EXISTS`` batch (about 105 us). So a connection
taken from redis-py's pool stays with the data path between operations, in a small
free list, and goes back to redis-py's pool when it breaks, when the list is full, or at
close. Before reuse a lent connection is probed without blocking (a zero-timeout
``select``; redis-py's ``can_read`` for TLS): one the server closed -- after a restart --
is re-made by redis-py (``connect``) instead of failing the operation.
"""

from __future__ import annotations

import os
import select
import socket
import ssl
import threading
from typing import Any, Callable, Optional

import redis
from redis.backoff import NoBackoff
from redis.exceptions import (ClusterDownError, NoPermissionError, ReadOnlyError, RedisClusterException,
                              RedisError, ResponseError)
from redis.retry import Retry

from hicache.storage.faults import StorageConnectionError, StorageProtocolError, StorageTimeout
from hicache.storage.redis_opts import Endpoint, RedisOptions
from hicache.storage.resp import UNAVAILABLE_CODES, RespConnection

# What redis-py (and the socket layer under it) raises.
REDIS_FAULTS = (RedisError, RedisClusterException, OSError)


def no_retry() -> Retry:
    """redis-py's policy for our clients: never retry (the store's breaker paces retries)."""
    return Retry(NoBackoff(), 0)


def storage_error(exc: BaseException, where: object) -> Exception:
    """A redis-py (or socket) exception as the matching :class:`StorageError`.

    Timeouts are :class:`StorageTimeout`; refused, broken, unauthenticated or unusable
    connections (and error replies meaning the server cannot serve now) are
    :class:`StorageConnectionError`; anything else is :class:`StorageProtocolError`.
    The message is redis-py's (it names the address, never the password).
    """
    if isinstance(exc, (redis.TimeoutError, socket.timeout)):
        return StorageTimeout(f"{where}: {exc}")
    if isinstance(exc, ResponseError):
        code = str(exc).split(" ", 1)[0]
        unavailable = (code in UNAVAILABLE_CODES
                       or isinstance(exc, (ReadOnlyError, NoPermissionError, ClusterDownError)))
        cls = StorageConnectionError if unavailable else StorageProtocolError
        return cls(f"{where}: {exc}")
    if isinstance(exc, (redis.ConnectionError, RedisClusterException, OSError)):
        return StorageConnectionError(f"{where}: {exc}")
    return StorageProtocolError(f"{where}: {exc}")


def socket_tuner(nbytes: int) -> Optional[Callable[[Any], None]]:
    """A function setting ``SO_RCVBUF``/``SO_SNDBUF`` on a redis-py connection's new socket
    (None when ``nbytes`` is 0: the kernel's defaults)."""
    if not nbytes:
        return None

    def tune(conn) -> None:
        sock = conn._sock
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, nbytes)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, nbytes)

    return tune


def standalone_client(endpoint: Endpoint, opts: RedisOptions) -> "redis.Redis":
    """The redis-py client (and connection pool) of one server. Makes no connection yet."""
    tune = socket_tuner(opts.socket_buffer_bytes)

    def on_connect(conn) -> None:  # redis-py calls this instead of conn.on_connect()
        if tune is not None:
            tune(conn)
        conn.on_connect()          # AUTH, SELECT: redis-py's handshake

    where = {"unix_socket_path": endpoint.path} if endpoint.path else {"host": endpoint.host,
                                                                       "port": endpoint.port}
    # redis-py annotates redis_connect_func as Callable[[], None] but calls it with the connection
    return redis.Redis(**where, db=opts.db, retry=no_retry(),
                       redis_connect_func=on_connect,  # type: ignore[arg-type]
                       **opts.client_kwargs())


def _closed_by_peer(conn) -> bool:
    """True when the server has closed (or written unasked to) a connection at rest."""
    sock = conn._sock
    if sock is None:
        return True
    if isinstance(sock, ssl.SSLSocket):  # no MSG_PEEK through TLS: redis-py's probe
        try:
            return conn.can_read()
        except REDIS_FAULTS:
            return True
    try:  # (recv with MSG_DONTWAIT would still wait: Python polls a socket that has a timeout)
        readable, _, _ = select.select([sock], [], [], 0)
    except (OSError, ValueError):
        return True
    return bool(readable)     # readable at rest: EOF, or bytes nobody asked for


class LentConnections:
    """Connections of one redis-py pool kept by the data path between operations.

    :meth:`take` returns a connection made by redis-py (authenticated, database selected)
    and our RESP stream over its socket; :meth:`give_back` keeps it for the next operation
    or, after a fault, disconnects it and every other kept one (after a server restart
    they are all dead, and finding that out one call at a time costs a timeout each).
    """

    def __init__(self, client: "redis.Redis", where: object, max_idle: int):
        self.pool = client.connection_pool
        self.where = where
        self._max_idle = max_idle
        self._lock = threading.Lock()
        self._idle: list[tuple[Any, RespConnection]] = []
        self._pid = os.getpid()

    def take(self) -> tuple[Any, RespConnection]:
        with self._lock:
            if self._pid != os.getpid():  # a forked child must not share the parent's sockets
                self._idle, self._pid = [], os.getpid()
            item = self._idle.pop() if self._idle else None
        try:
            if item is None:
                conn = self.pool.get_connection()
            else:
                conn = item[0]
                if _closed_by_peer(conn):
                    conn.disconnect()
                    conn.connect()      # redis-py dials and authenticates again
        except REDIS_FAULTS as exc:
            if item is not None:
                self.pool.release(item[0])
            raise storage_error(exc, self.where) from None
        if item is not None and item[1].sock is conn._sock and item[1].idle:
            return conn, item[1]
        # redis-py leaves Connection._sock unannotated (inferred None); here it is connected
        return conn, RespConnection(conn._sock, self.where)  # type: ignore[arg-type]

    def give_back(self, conn, stream: RespConnection, ok: bool) -> None:
        if ok and not stream.broken:
            with self._lock:
                if len(self._idle) < self._max_idle:
                    self._idle.append((conn, stream))
                    return
            self.pool.release(conn)
            return
        conn.disconnect()
        self.pool.release(conn)
        self.release_all(disconnect=True)

    def release_all(self, disconnect: bool = False) -> None:
        """Hand every kept connection back to redis-py's pool (disconnected if asked)."""
        with self._lock:
            idle, self._idle = self._idle, []
        for conn, _ in idle:
            if disconnect:
                conn.disconnect()
            self.pool.release(conn)
