"""``file:///dir``: one file per object, written atomically, with an LRU size budget.

Layout on disk: ``DIR/xx/KEY`` where ``xx`` is a shard (two hex digits of crc32(key)) so
no directory grows past a few thousand entries. A put writes ``DIR/xx/.tmp.KEY.PID.N`` with
``os.writev`` straight from the caller's buffers (header and payload, no concatenation),
optionally fsyncs, and renames it over ``KEY``: a reader sees the old value, the new
value, or nothing, never half a file. A get opens ``KEY`` and ``os.readv``s it into the
caller's buffers.

Budget: ``?capacity=10GiB`` (default 8 GiB). The process keeps an LRU index of the files
it knows (scanned at open, ordered by modification time; reads refresh the time so a
restart keeps the order) and unlinks the least recently used ones to make room. Several
processes may share a directory: each enforces the budget over what it has seen, and a
file another process already removed is simply skipped. ``?fsync=1`` makes puts durable
across power loss (slower); a cache does not need it.
"""

from __future__ import annotations

import itertools
import os
import threading
import time
import zlib
from collections import OrderedDict
from pathlib import Path
from typing import Iterator, Optional, Sequence

from hicache.errors import ConfigError
from hicache.storage.backend import STORAGE_PROTOCOL_VERSION, Accept, BackendStats, exists_prefix_batched
from hicache.storage.buffers import Value, consume, value_views
from hicache.storage.faults import StorageConnectionError
from hicache.storage.objects import check_key

DEFAULT_FILE_CAPACITY = 8 << 30
_TMP = ".tmp."
_STALE_TMP_S = 300.0
_IOV_MAX = 512


class FileBackend:
    """One file per object under a directory (see module doc)."""

    protocol_version = STORAGE_PROTOCOL_VERSION
    accepts_deferred = True  # put() resolves Deferred pieces itself (buffers.value_views / send_pieces)
    kind = "file"

    def __init__(self, root: str | os.PathLike, capacity_bytes: int = DEFAULT_FILE_CAPACITY,
                 fsync: bool = False):
        if isinstance(capacity_bytes, bool) or not isinstance(capacity_bytes, int) or capacity_bytes <= 0:
            raise ConfigError("capacity", capacity_bytes, "must be a positive byte count")
        self.root = Path(root)
        try:
            self.root.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise ConfigError("storage_url", str(root), f"cannot create directory: {exc.strerror}") from None
        if not os.access(self.root, os.W_OK | os.X_OK):
            raise ConfigError("storage_url", str(root), "directory is not writable")
        self.capacity = capacity_bytes
        self.fsync = fsync
        self.url = f"file://{self.root}?capacity={capacity_bytes}" + ("&fsync=1" if fsync else "")
        self._lock = threading.Lock()
        self._index: "OrderedDict[str, int]" = OrderedDict()
        self._used = 0
        self._evictions = 0
        self._refused = 0
        self._seq = itertools.count()
        self._scan()

    # -- paths --------------------------------------------------------------------------
    def _path(self, key: str) -> Path:
        check_key(key)
        return self.root / f"{zlib.crc32(key.encode()) & 0xFF:02x}" / key

    def _scan(self) -> None:
        """Index existing files by mtime (oldest first); remove stale temp files."""
        found = []
        now = time.time()
        for shard in self.root.iterdir():
            if not shard.is_dir() or len(shard.name) != 2:
                continue
            for entry in os.scandir(shard):
                try:
                    st = entry.stat()
                except FileNotFoundError:
                    continue
                if entry.name.startswith(_TMP):
                    if now - st.st_mtime > _STALE_TMP_S:
                        _unlink(entry.path)
                    continue
                found.append((st.st_mtime_ns, entry.name, st.st_size))
        found.sort()
        for _, name, size in found:
            self._index[name] = size
            self._used += size

    # -- protocol -----------------------------------------------------------------------
    def exists(self, keys: Sequence[str]) -> list[bool]:
        return [self._path(k).is_file() for k in keys]

    def exists_prefix(self, keys: Sequence[str]) -> int:
        return exists_prefix_batched(self.exists, keys, 64)

    def get_into(self, keys: Sequence[str], values: Sequence[Value],
                 accept: Optional[Accept] = None) -> list[Optional[int]]:
        assert len(keys) == len(values), "one destination per key"
        out: list[Optional[int]] = []
        for i, (key, value) in enumerate(zip(keys, values)):
            path = self._path(key)
            try:
                fd = os.open(path, os.O_RDONLY)
            except FileNotFoundError:
                out.append(None)
                with self._lock:
                    self._drop(key)
                continue
            except OSError as exc:
                raise StorageConnectionError(f"{path}: {exc.strerror}") from None
            try:
                size = os.fstat(fd).st_size
                views = value_views(value, writable=True)
                if accept is not None and len(views) > 1:
                    # the first buffer (the object header) is checked before the rest is read
                    first = min(views[0].nbytes, size)
                    _readv_all(fd, views[:1], first)
                    if accept(i, size, views[0]):
                        _readv_all(fd, views[1:], size - first)
                else:
                    _readv_all(fd, views, size)
                    if accept is not None and views:
                        accept(i, size, views[0])
                try:
                    os.utime(fd)  # recency survives a restart (the index is rebuilt by mtime)
                except OSError:
                    pass
            except OSError as exc:
                raise StorageConnectionError(f"{path}: {exc.strerror}") from None
            finally:
                os.close(fd)
            with self._lock:
                if key in self._index:
                    self._index.move_to_end(key)
                else:
                    self._index[key] = size
                    self._used += size
            out.append(size)
        return out

    def put(self, keys: Sequence[str], values: Sequence[Value]) -> list[bool]:
        assert len(keys) == len(values), "one value per key"
        out = []
        for key, value in zip(keys, values):
            path = self._path(key)
            views = value_views(value, writable=False)
            size = sum(v.nbytes for v in views)
            if size > self.capacity:
                with self._lock:
                    self._refused += 1
                out.append(False)
                continue
            self._make_room(key, size)
            tmp = path.parent / f"{_TMP}{key}.{os.getpid()}.{next(self._seq)}"
            try:
                path.parent.mkdir(exist_ok=True)
                fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
                try:
                    _writev_all(fd, views)
                    if self.fsync:
                        os.fsync(fd)
                finally:
                    os.close(fd)
                os.replace(tmp, path)
            except OSError as exc:
                _unlink(tmp)
                if exc.errno in (28, 122):  # ENOSPC, EDQUOT: the disk is full, a refusal
                    with self._lock:
                        self._refused += 1
                    out.append(False)
                    continue
                raise StorageConnectionError(f"{path}: {exc.strerror}") from None
            with self._lock:
                self._drop(key)
                self._index[key] = size
                self._used += size
            out.append(True)
        return out

    def delete(self, keys: Sequence[str]) -> int:
        n = 0
        for key in keys:
            if _unlink(self._path(key)):
                n += 1
            with self._lock:
                self._drop(key)
        return n

    def scan(self, prefix: str = "", batch: int = 1000) -> Iterator[list[tuple[str, Optional[int]]]]:
        """Walk the shard directories (not the index: other processes may share them)."""
        out: list[tuple[str, Optional[int]]] = []
        for shard in sorted(self.root.iterdir()):
            if not shard.is_dir() or len(shard.name) != 2:
                continue
            for entry in os.scandir(shard):
                if entry.name.startswith(_TMP) or not entry.name.startswith(prefix):
                    continue
                try:
                    out.append((entry.name, entry.stat().st_size))
                except FileNotFoundError:  # removed by another process meanwhile
                    continue
                if len(out) >= batch:
                    yield out
                    out = []
        if out:
            yield out

    def stats(self) -> BackendStats:
        with self._lock:
            return BackendStats(self.kind, self.url, objects=len(self._index), used_bytes=self._used,
                                capacity_bytes=self.capacity, evictions=self._evictions,
                                errors={"refused": self._refused} if self._refused else {})

    def close(self) -> None:
        pass

    # -- budget -------------------------------------------------------------------------
    def _drop(self, key: str) -> None:
        size = self._index.pop(key, None)
        if size is not None:
            self._used -= size

    def _make_room(self, key: str, size: int) -> None:
        victims = []
        with self._lock:
            self._drop(key)
            while self._used + size > self.capacity and self._index:
                victim, vsize = self._index.popitem(last=False)
                self._used -= vsize
                self._evictions += 1
                victims.append(victim)
        for victim in victims:
            _unlink(self._path(victim))


def _unlink(path) -> bool:
    try:
        os.unlink(path)
        return True
    except FileNotFoundError:
        return False


def _writev_all(fd: int, views: list[memoryview]) -> None:
    pending = [v for v in views if v.nbytes]
    while pending:
        n = os.writev(fd, pending[:_IOV_MAX])
        consume(pending, n)


def _readv_all(fd: int, views: list[memoryview], size: int) -> None:
    """Read up to ``size`` bytes into the views (what does not fit is left unread)."""
    pending, left = [], size
    for v in views:
        if left <= 0:
            break
        take = min(v.nbytes, left)
        pending.append(v[:take])
        left -= take
    while pending:
        n = os.readv(fd, pending[:_IOV_MAX])
        if n == 0:
            return  # the file shrank under us (replaced): the caller sees a short value
        consume(pending, n)
