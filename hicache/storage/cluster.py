"""``redis+cluster://h1:p1,h2:p2,...``: Redis Cluster, topology by redis-py, data by our path.

URL form (``rediss+cluster://`` for TLS)::

    redis+cluster://[user:password@]host1:port1,host2:port2,host3:port3[?options]

The hosts are seeds for redis-py's ``RedisCluster``, which owns the topology: it asks the
seeds for ``CLUSTER SLOTS``, keeps the slot map and one client (connection pool) per node,
and computes each key's slot (``redis.crc.key_slot``: CRC16 of the key, or of its
``{hash tag}``, mod 16384). Our keys carry no braces, so pages spread over every node.

A batch is grouped by the node redis-py's map names for each key, and each group runs our
pipelined data path on a connection from that node's redis-py pool. redis-py's own
redirect loop works one command at a time (or copies values in its cluster pipeline), so
the per-key loop over a pipelined batch is ours; what a redirect *means* is redis-py's:

* ``-MOVED slot host:port``: read as redis-py's ``MovedError`` and applied to its slot map
  (``NodesManager.move_slot``); the key is re-sent to the new owner, and the whole map is
  refreshed (``NodesManager.initialize``) before the next batch, since a reshard moves
  many slots at once;
* ``-ASK slot host:port``: read as ``AskError``; the key is re-sent to that node preceded
  by ``ASKING``, the map unchanged.

At most :data:`MAX_REDIRECTS` rounds per batch. A node that cannot be reached raises
:class:`StorageConnectionError` and marks the map stale (a failover may have promoted a
replica). Opening touches no network: the ``RedisCluster`` (whose constructor reads the
slot map) is made on first use, and a failure then is a counted fault like any other.
"""

from __future__ import annotations

import threading
from typing import Callable, Iterator, Optional, Sequence

from redis.cluster import ClusterNode, RedisCluster
from redis.crc import key_slot as _redis_key_slot
from redis.exceptions import AskError, MovedError

from hicache.storage.backend import STORAGE_PROTOCOL_VERSION, Accept, BackendStats, exists_prefix_batched
from hicache.storage.buffers import Value, value_views
from hicache.storage.faults import FaultCounter, StorageConnectionError, StorageProtocolError
from hicache.storage.redis_conns import REDIS_FAULTS, no_retry, socket_tuner, storage_error
from hicache.storage.redis_node import RedisNode, map_exists, map_get, map_put, put_pieces, redis_stats, scan_node
from hicache.storage.redis_opts import Endpoint, RedisOptions
from hicache.storage.resp import RespError

MAX_REDIRECTS = 5


def key_slot(key: "str | bytes") -> int:
    """The cluster slot of a key (redis-py's ``key_slot``, ``{hash tags}`` honoured)."""
    return _redis_key_slot(key.encode() if isinstance(key, str) else bytes(key))


def _redirect(reply: RespError, replied: ClusterNode) -> AskError:
    """A ``-MOVED``/``-ASK`` reply as redis-py's exception (a server that announces no
    host, ``-MOVED 3999 :6381``, means its own)."""
    _, slot, addr = reply.message.split(" ", 2)
    host, _, port = addr.rpartition(":")
    cls = MovedError if reply.code == "MOVED" else AskError
    return cls(f"{slot} {host or replied.host}:{port}")


class RedisClusterBackend:
    """A Redis Cluster (see module doc)."""

    protocol_version = STORAGE_PROTOCOL_VERSION
    accepts_deferred = True  # put() resolves Deferred pieces itself (buffers.value_views / send_pieces)
    kind = "redis-cluster"

    def __init__(self, seeds: Sequence[Endpoint], opts: RedisOptions, url: str):
        assert seeds, "a cluster URL needs at least one node"
        self.url = url
        self.seeds = list(seeds)
        self.opts = opts
        self._lock = threading.Lock()
        self._rc: Optional[RedisCluster] = None
        self._nodes: dict[str, RedisNode] = {}        # by redis-py node name ("host:port")
        self._strays: dict[str, ClusterNode] = {}     # ASK targets not in redis-py's map
        self._stale = False
        self._errors = FaultCounter()
        self.redirects = FaultCounter()

    # -- topology (redis-py's) ----------------------------------------------------------
    def _cluster(self) -> RedisCluster:
        """redis-py's cluster client; made (and the slot map read) on first use."""
        rc = self._rc
        if rc is not None:
            return rc
        with self._lock:
            if self._rc is None:
                try:
                    self._rc = RedisCluster(
                        startup_nodes=[ClusterNode(ep.host, ep.port) for ep in self.seeds],
                        retry=no_retry(), require_full_coverage=False,
                        redis_connect_func=socket_tuner(self.opts.socket_buffer_bytes),
                        **self.opts.client_kwargs())
                except REDIS_FAULTS as exc:
                    raise storage_error(exc, "cluster") from None
                self._stale = False
                self.redirects.add("map_refresh")
            return self._rc

    def refresh(self) -> None:
        """Re-read the slot map (redis-py's ``NodesManager.initialize``: ``CLUSTER SLOTS``
        from the first known node that answers)."""
        rc = self._rc
        if rc is None:
            self._cluster()
            return
        try:
            rc.nodes_manager.initialize()
        except REDIS_FAULTS as exc:
            raise storage_error(exc, "cluster") from None
        self._stale = False
        self.redirects.add("map_refresh")

    def _ready(self) -> RedisCluster:
        rc = self._cluster()
        if self._stale:
            self.refresh()
        return rc

    def _owner(self, rc: RedisCluster, key: str) -> ClusterNode:
        try:
            return rc.nodes_manager.get_node_from_slot(key_slot(key))
        except REDIS_FAULTS as exc:  # SlotNotCoveredError: cluster down?
            self._stale = True
            raise storage_error(exc, "cluster") from None

    def _node(self, rc: RedisCluster, cn: ClusterNode) -> RedisNode:
        """Our data path over the redis-py client of one cluster node."""
        try:
            client = rc.get_redis_connection(cn)
        except REDIS_FAULTS as exc:
            raise storage_error(exc, cn.name) from None
        with self._lock:
            node = self._nodes.get(cn.name)
            if node is None or node.client is not client:
                if node is not None:
                    node.close()
                node = self._nodes[cn.name] = RedisNode(Endpoint(cn.host, cn.port), self.opts, client)
            return node

    def _ask_target(self, rc: RedisCluster, err: AskError) -> ClusterNode:
        cn = rc.get_node(host=err.host, port=err.port)
        if cn is None:
            with self._lock:
                cn = self._strays.setdefault(f"{err.host}:{err.port}", ClusterNode(err.host, err.port))
        return cn

    def _moved(self, rc: RedisCluster, err: MovedError) -> None:
        nm = rc.nodes_manager
        try:
            if hasattr(nm, "move_slot"):
                nm.move_slot(err)                 # newer redis-py: patch the slot now
            else:
                # older redis-py (no move_slot): patched at the next lookup; the installed
                # redis-py no longer declares it (older ones do: hence unused-ignore too)
                nm.update_moved_exception(err)  # type: ignore[attr-defined,unused-ignore]
        except KeyError:  # a slot the map did not cover: the refresh below finds its owner
            pass
        self._stale = True

    # -- routing ------------------------------------------------------------------------
    def _run(self, keys: Sequence[str], op: Callable[[RedisNode, list[int], bool], list]) -> list:
        """Run ``op`` per node on the key indices it owns, following MOVED / ASK per key."""
        rc = self._ready()
        results: list = [None] * len(keys)
        pending = list(range(len(keys)))
        ask: dict[int, ClusterNode] = {}
        for _ in range(MAX_REDIRECTS + 1):
            groups: dict[tuple[str, bool], tuple[ClusterNode, list[int]]] = {}
            for i in pending:
                cn, asking = (ask[i], True) if i in ask else (self._owner(rc, keys[i]), False)
                groups.setdefault((cn.name, asking), (cn, []))[1].append(i)
            redo: list[int] = []
            for (_, asking), (cn, idxs) in groups.items():
                try:
                    raw = op(self._node(rc, cn), idxs, asking)
                except StorageConnectionError:
                    self._stale = True
                    raise
                for i, r in zip(idxs, raw):
                    ask.pop(i, None)
                    if isinstance(r, RespError) and r.code in ("MOVED", "ASK"):
                        err = _redirect(r, cn)
                        if isinstance(err, MovedError):
                            self._moved(rc, err)
                            self.redirects.add("moved")
                        else:
                            ask[i] = self._ask_target(rc, err)
                            self.redirects.add("ask")
                        redo.append(i)
                    else:
                        results[i] = r
            if not redo:
                return results
            pending = redo
        raise StorageProtocolError(f"more than {MAX_REDIRECTS} cluster redirects for one batch")

    # -- protocol -----------------------------------------------------------------------
    def exists(self, keys: Sequence[str]) -> list[bool]:
        if not keys:
            return []
        raw = self._run(keys, lambda node, idxs, asking: node.exists_raw([keys[i] for i in idxs], asking))
        return map_exists(raw, "cluster")

    def exists_prefix(self, keys: Sequence[str]) -> int:
        return exists_prefix_batched(self.exists, keys, 64)

    def get_into(self, keys: Sequence[str], values: Sequence[Value],
                 accept: Optional[Accept] = None) -> list[Optional[int]]:
        assert len(keys) == len(values), "one destination per key"
        if not keys:
            return []
        dests = [value_views(v, writable=True) for v in values]

        def op(node: RedisNode, idxs: list[int], asking: bool) -> list:
            check = None if accept is None else (lambda j, n, head: accept(idxs[j], n, head))
            return node.get_raw([keys[i] for i in idxs], [dests[i] for i in idxs], asking, check)

        raw = self._run(keys, op)
        return map_get(raw, self._errors, "cluster")

    def put(self, keys: Sequence[str], values: Sequence[Value]) -> list[bool]:
        if not keys:
            return []
        views = put_pieces(keys, values)
        raw = self._run(keys, lambda node, idxs, asking: node.set_raw(
            [keys[i] for i in idxs], [views[i] for i in idxs], asking))
        return map_put(raw, self._errors, "cluster")

    def delete(self, keys: Sequence[str]) -> int:
        if not keys:
            return 0
        raw = self._run(keys, lambda node, idxs, asking: node.del_raw([keys[i] for i in idxs], asking))
        return sum(r for r in raw if isinstance(r, int))

    def _primaries(self) -> list[RedisNode]:
        rc = self._ready()
        return [self._node(rc, cn) for cn in sorted(rc.get_primaries(), key=lambda cn: cn.name)]

    def scan(self, prefix: str = "", batch: int = 1000) -> Iterator[list[tuple[str, Optional[int]]]]:
        """``SCAN`` every primary in turn (each holds its own slots' keys)."""
        for node in self._primaries():
            yield from scan_node(node, prefix, batch)

    def stats(self) -> BackendStats:
        infos = [node.info() for node in self._primaries()]
        st = redis_stats(self.kind, self.url, infos, self._errors.snapshot(), 0)
        st.extra["redirects"] = self.redirects.snapshot()
        return st

    def close(self) -> None:
        with self._lock:
            nodes, self._nodes = list(self._nodes.values()), {}
            rc, self._rc = self._rc, None
        for n in nodes:
            n.close()
        if rc is not None:
            rc.close()
