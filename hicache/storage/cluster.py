"""``redis+cluster://h1:p1,h2:p2,...``: Redis Cluster through the same fast RESP path.

URL form (``rediss+cluster://`` for TLS)::

    redis+cluster://[user:password@]host1:port1,host2:port2,host3:port3[?options]

The hosts are seeds: the client asks the first one that answers for ``CLUSTER SLOTS`` and
routes each key to the primary that owns its slot. A key's slot is CRC16 (XMODEM, the
polynomial 0x1021 Redis uses) of the key, or of the part between the first ``{`` and the
next ``}`` when that part is non-empty, modulo 16384. Our keys carry no braces, so pages
spread over every node.

A batch is grouped by node, each group pipelined to its node. Redirects are per key:

* ``-MOVED slot host:port``: the slot lives elsewhere now; record the new owner, re-send the
  key there, and refresh the whole map before the next batch;
* ``-ASK slot host:port``: the slot is being migrated and this key already moved; re-send
  the key to the target preceded by ``ASKING``, without changing the map.

At most :data:`MAX_REDIRECTS` rounds per batch. A node that cannot be reached raises
:class:`StorageConnectionError` and marks the map stale (a failover may have promoted a
replica).
"""

from __future__ import annotations

import threading
from typing import Callable, Iterator, Optional, Sequence

from hicache.storage.backend import STORAGE_PROTOCOL_VERSION, Accept, BackendStats, exists_prefix_batched
from hicache.storage.buffers import Value, value_views
from hicache.storage.faults import FaultCounter, StorageConnectionError, StorageError, StorageProtocolError
from hicache.storage.redis_node import (RedisNode, map_exists, map_get, map_put, put_pieces, redis_stats,
                                        scan_node)
from hicache.storage.resp import Endpoint, RedisOptions, RespError

NUM_SLOTS = 16384
MAX_REDIRECTS = 5


def _crc16_table() -> list[int]:
    table = []
    for i in range(256):
        crc = i << 8
        for _ in range(8):
            crc = ((crc << 1) ^ 0x1021) if crc & 0x8000 else (crc << 1)
        table.append(crc & 0xFFFF)
    return table


_TABLE = _crc16_table()


def crc16(data: bytes) -> int:
    """CRC16-XMODEM (poly 0x1021, init 0), as in Redis' ``crc16.c``: crc16(b"123456789") == 0x31C3."""
    crc = 0
    for b in data:
        crc = ((crc << 8) & 0xFFFF) ^ _TABLE[((crc >> 8) ^ b) & 0xFF]
    return crc


def key_slot(key: "str | bytes") -> int:
    """The cluster slot of a key, honouring ``{hash tags}``."""
    k = key.encode() if isinstance(key, str) else bytes(key)
    s = k.find(b"{")
    if s >= 0:
        e = k.find(b"}", s + 1)
        if e > s + 1:
            k = k[s + 1:e]
    return crc16(k) % NUM_SLOTS


def _endpoint(addr: str, default_host: Optional[str]) -> Endpoint:
    host, _, port = addr.rpartition(":")
    return Endpoint(host=host or default_host, port=int(port))


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
        self._nodes: dict[Endpoint, RedisNode] = {}
        self._slots: list[Optional[Endpoint]] = [None] * NUM_SLOTS
        self._stale = True
        self._errors = FaultCounter()
        self.redirects = FaultCounter()

    # -- topology -----------------------------------------------------------------------
    def _node(self, ep: Endpoint) -> RedisNode:
        with self._lock:
            node = self._nodes.get(ep)
            if node is None:
                node = self._nodes[ep] = RedisNode(ep, self.opts)
            return node

    def refresh(self) -> None:
        """Rebuild the slot map from the first node that answers ``CLUSTER SLOTS``."""
        with self._lock:
            candidates = list(dict.fromkeys(list(self._nodes) + self.seeds))
        last: Optional[StorageError] = None
        for ep in candidates:
            try:
                reply = self._node(ep).command("CLUSTER", "SLOTS")
            except StorageError as exc:
                last = exc
                continue
            if not isinstance(reply, list):
                last = StorageProtocolError(f"{ep}: CLUSTER SLOTS returned {reply!r}")
                continue
            slots: list[Optional[Endpoint]] = [None] * NUM_SLOTS
            for entry in reply:
                start, end, primary = entry[0], entry[1], entry[2]
                host = primary[0].decode() if isinstance(primary[0], bytes) else str(primary[0])
                owner = Endpoint(host=host or ep.host, port=int(primary[1]))
                for s in range(int(start), int(end) + 1):
                    slots[s] = owner
            with self._lock:
                self._slots = slots
                self._stale = False
            self.redirects.add("map_refresh")
            return
        raise last or StorageConnectionError("no cluster node answered")

    def _owner(self, key: str) -> Endpoint:
        ep = self._slots[key_slot(key)]
        if ep is None:
            raise StorageConnectionError(f"cluster slot {key_slot(key)} has no owner (cluster down?)")
        return ep

    # -- routing ------------------------------------------------------------------------
    def _run(self, keys: Sequence[str], op: Callable[[RedisNode, list[int], bool], list]) -> list:
        """Run ``op`` per node on the key indices it owns, following MOVED / ASK per key."""
        if self._stale:
            self.refresh()
        results: list = [None] * len(keys)
        pending = list(range(len(keys)))
        ask: dict[int, Endpoint] = {}
        for _ in range(MAX_REDIRECTS + 1):
            groups: dict[tuple[Endpoint, bool], list[int]] = {}
            for i in pending:
                target = (ask[i], True) if i in ask else (self._owner(keys[i]), False)
                groups.setdefault(target, []).append(i)
            redo: list[int] = []
            moved = False
            for (ep, asking), idxs in groups.items():
                try:
                    raw = op(self._node(ep), idxs, asking)
                except StorageConnectionError:
                    self._stale = True
                    raise
                for i, r in zip(idxs, raw):
                    ask.pop(i, None)
                    if isinstance(r, RespError) and r.code in ("MOVED", "ASK"):
                        parts = r.message.split()
                        target = _endpoint(parts[2], ep.host)
                        if r.code == "MOVED":
                            self._slots[int(parts[1])] = target
                            moved = True
                            self.redirects.add("moved")
                        else:
                            ask[i] = target
                            self.redirects.add("ask")
                        redo.append(i)
                    else:
                        results[i] = r
            if moved:
                self._stale = True
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

    def scan(self, prefix: str = "", batch: int = 1000) -> Iterator[list[tuple[str, Optional[int]]]]:
        """``SCAN`` every primary in turn (each holds its own slots' keys)."""
        if self._stale:
            self.refresh()
        for ep in sorted({ep for ep in self._slots if ep is not None}, key=str):
            yield from scan_node(self._node(ep), prefix, batch)

    def stats(self) -> BackendStats:
        if self._stale:
            self.refresh()
        owners = sorted({ep for ep in self._slots if ep is not None}, key=str)
        infos = [self._node(ep).info() for ep in owners]
        st = redis_stats(self.kind, self.url, infos, self._errors.snapshot(), 0)
        st.extra["redirects"] = self.redirects.snapshot()
        return st

    def close(self) -> None:
        with self._lock:
            nodes, self._nodes = list(self._nodes.values()), {}
        for n in nodes:
            n.close()
