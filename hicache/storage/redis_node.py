"""``redis://``, ``rediss://`` and ``unix://``: one Redis server, connections by redis-py.

redis-py owns the connections: a ``redis.Redis`` client's pool dials, wraps TLS (verifying
the certificate and, by default, the host name), authenticates (``AUTH [user] password``),
selects the database, notices a connection the server closed (after a restart) and makes a
new one. Control commands (``INFO``, ``SCAN``, ``STRLEN``) are redis-py calls. The bulk
data path -- pipelined ``GET``/``SET`` straight between the socket and pool memory, and the
``EXISTS``/``DEL`` pipelines -- checks a connection out of that same pool and runs our
:class:`~hicache.storage.resp.RespConnection` on its socket (see ``resp.py`` for why).

A batch is split into up to ``connections`` contiguous slices of about equal bytes, each
pipelined on its own connection from its own thread (the socket calls release the GIL), so
a big prefetch overlaps the server's send with our receive. Small batches stay on the
calling thread. Per-key refusals are values: ``-OOM`` (``maxmemory`` reached with a
no-eviction policy) makes that ``put`` False and is counted as ``full``; a ``-WRONGTYPE``
key (someone else's data under our name) reads as a zero-length value, which the object
check rejects as foreign. Replies meaning the server cannot serve now (``-LOADING``,
``-NOAUTH``, ...) raise :class:`StorageConnectionError` like a dead socket.

redis-py never retries here (``Retry(NoBackoff(), 0)``): a dead server costs one connect
timeout per call, and the store's breaker decides when to try again. Connections and
errors: ``hicache/storage/redis_conns.py``.
"""

from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from typing import Any, Callable, Iterator, Optional, Sequence

import redis

from hicache.storage.backend import STORAGE_PROTOCOL_VERSION, Accept, BackendStats, exists_prefix_batched
from hicache.storage.buffers import Value, send_pieces, value_views
from hicache.storage.faults import FaultCounter, StorageConnectionError
from hicache.storage.objects import check_key
from hicache.storage.redis_conns import REDIS_FAULTS, LentConnections, standalone_client, storage_error
from hicache.storage.redis_opts import Endpoint, RedisOptions
from hicache.storage.resp import ASKING, UNAVAILABLE_CODES, RespConnection, RespError, encode_command

_FANOUT_MIN_BYTES = 4 << 20
_EXISTS_BATCH = 64


def raise_if_unavailable(reply, endpoint) -> None:
    if isinstance(reply, RespError) and reply.code in UNAVAILABLE_CODES:
        raise StorageConnectionError(f"{endpoint}: {reply.message}")


class RedisNode:
    """One server: redis-py's client for control commands and connections, our pipelined
    data path on checked-out connections. Raw results may hold :class:`RespError`."""

    def __init__(self, endpoint: Endpoint, opts: RedisOptions, client: Optional["redis.Redis"] = None):
        """``client``: a redis-py client owned by someone else (a cluster's node); by
        default the node makes and owns one."""
        self.endpoint = endpoint
        self.opts = opts
        self._owns_client = client is None
        self.client = client if client is not None else standalone_client(endpoint, opts)
        self.lent = LentConnections(self.client, endpoint, max_idle=max(4, 2 * opts.connections))
        self._exec: Optional[ThreadPoolExecutor] = None
        self._exec_lock = threading.Lock()

    @contextmanager
    def connection(self) -> Iterator[RespConnection]:
        """A connection redis-py made (see :class:`LentConnections`) as our RESP stream."""
        conn, stream = self.lent.take()
        ok = False
        try:
            yield stream
            ok = True
        finally:
            self.lent.give_back(conn, stream, ok)

    def command(self, fn: Callable[["redis.Redis"], Any]) -> Any:
        """Run a redis-py call on this node's client; its exceptions become StorageErrors."""
        try:
            return fn(self.client)
        except REDIS_FAULTS as exc:
            raise storage_error(exc, self.endpoint) from None

    def _slices(self, sizes: Sequence[int]) -> list[tuple[int, int]]:
        n, total = len(sizes), sum(sizes)
        k = min(self.opts.connections, n)
        if k <= 1 or total < _FANOUT_MIN_BYTES:
            return [(0, n)]
        out: list[tuple[int, int]] = []
        start, acc, target = 0, 0, total / k
        for i, s in enumerate(sizes):
            acc += s
            if acc >= target * (len(out) + 1) and len(out) < k - 1 and i + 1 < n:
                out.append((start, i + 1))
                start = i + 1
        out.append((start, n))
        return out

    def _fanout(self, sizes: Sequence[int], fn: Callable[[int, int], list]) -> list:
        slices = self._slices(sizes)
        if len(slices) == 1:
            return fn(0, len(sizes))
        with self._exec_lock:
            if self._exec is None:
                self._exec = ThreadPoolExecutor(max_workers=self.opts.connections,
                                                thread_name_prefix=f"hicache-redis-{self.endpoint}")
        futures = [self._exec.submit(fn, a, b) for a, b in slices[1:]]
        first_exc = None
        out = []
        try:
            out = fn(*slices[0])
        except BaseException as exc:  # still wait for the others: they write into our buffers
            first_exc = exc
        for f in futures:
            try:
                out.extend(f.result())
            except BaseException as exc:
                first_exc = first_exc or exc
        if first_exc is not None:
            raise first_exc
        return out

    def exists_raw(self, keys: Sequence[str], asking: bool = False) -> list:
        with self.connection() as c:
            if not asking:
                return c.pipeline([encode_command("EXISTS", k) for k in keys])
            c.send([b"".join(ASKING + encode_command("EXISTS", k) for k in keys)])
            replies = []
            for _ in keys:
                c.read_reply()  # ASKING's +OK
                replies.append(c.read_reply())
            return replies

    def get_raw(self, keys: Sequence[str], dests: Sequence[list[memoryview]], asking: bool = False,
                accept: Optional[Accept] = None) -> list:
        sizes = [sum(v.nbytes for v in d) for d in dests]

        def run(a: int, b: int) -> list:
            check = None if accept is None else (lambda i, n, head: accept(a + i, n, head))
            with self.connection() as c:
                return c.get_many(keys[a:b], dests[a:b], self.opts.pipeline, asking=asking, accept=check)

        return self._fanout(sizes, run)

    def set_raw(self, keys: Sequence[str], values: Sequence[list[memoryview]], asking: bool = False) -> list:
        sizes = [sum(v.nbytes for v in d) for d in values]

        def run(a: int, b: int) -> list:
            # Everything is sent before the first reply is read: replies are 5 bytes each
            # and TCP flow control bounds what is in flight, so the server never waits for
            # us between values (reading replies per window left a bubble per window).
            with self.connection() as c:
                return c.set_many(keys[a:b], values[a:b], asking=asking)

        return self._fanout(sizes, run)

    def del_raw(self, keys: Sequence[str], asking: bool = False) -> list:
        with self.connection() as c:
            if not asking:
                return c.pipeline([encode_command("DEL", k) for k in keys])
            replies = c.pipeline([ASKING + encode_command("DEL", k) for k in keys])
            return [c.read_reply() for _ in keys] if all(r == "OK" for r in replies) else replies

    def info(self) -> dict[str, Any]:
        """``INFO``, parsed by redis-py (numbers as ints, ``db0`` as a dict)."""
        return self.command(lambda r: r.info())

    def close(self) -> None:
        if self._exec is not None:
            self._exec.shutdown(wait=True)
            self._exec = None
        self.lent.release_all()
        if self._owns_client:
            self.client.close()


def map_get(results: list, counter: FaultCounter, endpoint) -> list[Optional[int]]:
    out: list[Optional[int]] = []
    for r in results:
        if isinstance(r, RespError):
            raise_if_unavailable(r, endpoint)
            counter.add("wrongtype" if r.code == "WRONGTYPE" else "server_error")
            out.append(0)  # not a value we can read: rejected as foreign by the object check
        else:
            out.append(r)
    return out


def put_pieces(keys: Sequence[str], values: Sequence[Value]) -> list[list]:
    """Check a put's keys; its values as send pieces (Deferred left for the sender)."""
    assert len(keys) == len(values), "one value per key"
    for k in keys:
        check_key(k)
    return [send_pieces(v) for v in values]


def map_put(results: list, counter: FaultCounter, endpoint) -> list[bool]:
    out = []
    for r in results:
        if isinstance(r, RespError):
            raise_if_unavailable(r, endpoint)
            counter.add("full" if r.code == "OOM" else "server_error")
            out.append(False)
        else:
            out.append(r == "OK")
    return out


def map_exists(results: list, endpoint) -> list[bool]:
    out = []
    for r in results:
        raise_if_unavailable(r, endpoint)
        out.append(isinstance(r, int) and r > 0)
    return out


class RedisBackend:
    """One Redis server (TCP, TLS or unix socket); see module doc."""

    protocol_version = STORAGE_PROTOCOL_VERSION
    accepts_deferred = True  # put() resolves Deferred pieces itself (buffers.value_views / send_pieces)
    kind = "redis"

    def __init__(self, endpoint: Endpoint, opts: RedisOptions, url: str):
        self.url = url
        self.node = RedisNode(endpoint, opts)
        self._errors = FaultCounter()

    def exists(self, keys: Sequence[str]) -> list[bool]:
        if not keys:
            return []
        return map_exists(self.node.exists_raw(keys), self.node.endpoint)

    def exists_prefix(self, keys: Sequence[str]) -> int:
        return exists_prefix_batched(self.exists, keys, _EXISTS_BATCH)

    def get_into(self, keys: Sequence[str], values: Sequence[Value],
                 accept: Optional[Accept] = None) -> list[Optional[int]]:
        assert len(keys) == len(values), "one destination per key"
        if not keys:
            return []
        dests = [value_views(v, writable=True) for v in values]
        return map_get(self.node.get_raw(keys, dests, accept=accept), self._errors, self.node.endpoint)

    def put(self, keys: Sequence[str], values: Sequence[Value]) -> list[bool]:
        if not keys:
            return []
        views = put_pieces(keys, values)
        return map_put(self.node.set_raw(keys, views), self._errors, self.node.endpoint)

    def delete(self, keys: Sequence[str]) -> int:
        if not keys:
            return 0
        replies = self.node.del_raw(keys)
        return sum(r for r in replies if isinstance(r, int))

    def scan(self, prefix: str = "", batch: int = 1000) -> Iterator[list[tuple[str, Optional[int]]]]:
        return scan_node(self.node, prefix, batch)

    def stats(self) -> BackendStats:
        info = self.node.info()
        return redis_stats(self.kind, self.url, [info], self._errors.snapshot(), self.node.opts.db)

    def close(self) -> None:
        self.node.close()


def _glob_escape(text: str) -> str:
    return "".join("\\" + ch if ch in "*?[]\\" else ch for ch in text)


def scan_node(node: RedisNode, prefix: str, batch: int) -> Iterator[list[tuple[str, Optional[int]]]]:
    """``SCAN cursor MATCH prefix* COUNT batch`` over one server (never ``KEYS``: it blocks
    the server for the whole keyspace), then the values' lengths with a pipeline of
    ``STRLEN`` (``None`` where the key holds another type); both through redis-py."""
    pattern = _glob_escape(prefix) + "*"
    cursor = 0
    while True:
        cursor, raw = node.command(lambda r: r.scan(cursor, match=pattern, count=batch))
        keys = [k.decode(errors="replace") if isinstance(k, bytes) else str(k) for k in raw]
        if keys:
            def strlen(r: "redis.Redis") -> list:
                pipe = r.pipeline(transaction=False)
                for k in keys:
                    pipe.strlen(k)
                return pipe.execute(raise_on_error=False)

            lengths = node.command(strlen)
            for n in lengths:  # WRONGTYPE: another type's key (no length); others are faults
                if isinstance(n, Exception) and not str(n).startswith("WRONGTYPE"):
                    raise storage_error(n, node.endpoint)
            yield [(k, n if isinstance(n, int) else None) for k, n in zip(keys, lengths)]
        if not cursor:
            return


def redis_stats(kind: str, url: str, infos: list[dict[str, Any]], errors: dict, db: int) -> BackendStats:
    """Backend stats from redis-py's parsed ``INFO`` of each node (summed over nodes)."""
    def num(info: dict, key: str) -> int:
        value = info.get(key, 0)
        return value if isinstance(value, int) else 0

    objects = 0
    for info in infos:
        ks = info.get(f"db{db}")
        if isinstance(ks, dict):
            objects += int(ks.get("keys", 0))
    maxmem = sum(num(i, "maxmemory") for i in infos)
    return BackendStats(kind, url, objects=objects, used_bytes=sum(num(i, "used_memory") for i in infos),
                        capacity_bytes=maxmem or None,
                        evictions=sum(num(i, "evicted_keys") for i in infos), errors=errors,
                        extra={"nodes": len(infos),
                               "maxmemory_policy": infos[0].get("maxmemory_policy") if infos else None})
