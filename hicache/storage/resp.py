"""Our RESP2 data path: pipelined GET/SET (and EXISTS/DEL) on a socket redis-py established.

redis-py (``hicache.storage.redis_node``) makes, authenticates and verifies each connection
and owns its pool; the data path borrows one (``redis_conns.py``) and runs here, on its
socket, because redis-py's reply path copies a megabyte value twice (its parser builds a
``bytes``, the caller copies that into pool memory): measured on this box, redis-py
pipelines read 1 MiB values at about 0.76 of the rate this path reads, and take 2.7x as
long for a 64-key ``EXISTS`` batch (``hicache bench storage``, bench/README.md). This code

* sends a ``SET`` as one ``socket.sendmsg`` gather list: the command prefix, the 64-byte
  object header and the payload straight from pool memory (no concatenation);
* reads a bulk reply's ``$<len>\\r\\n`` line through a small buffer and then
  ``recv_into``\\ s the value straight into the caller's buffers (header buffer, then the
  pool row), so a 1 MiB value crosses from the kernel into the pool once;
* pipelines: many commands in flight per connection, replies read in order.

TLS sockets have no ``sendmsg``; there each piece is written with ``sendall`` (the TLS layer
copies to encrypt anyway). Errors are typed: a timeout is :class:`StorageTimeout`, a broken
connection :class:`StorageConnectionError`, unparsable bytes :class:`StorageProtocolError`;
after any of them :attr:`RespConnection.broken` is set and the owner drops the connection.
A ``-ERR`` reply is a value (:class:`RespError`), so one refused key never desynchronises a
pipeline. Our clients ask redis-py for RESP2 (``protocol=2``; redis-py 8 would otherwise
open with ``HELLO 3``): every Redis version speaks it, and under RESP3 out-of-band push
frames (redis-py 8 turns maintenance notifications on with it) could land between replies.
"""

from __future__ import annotations

import socket
import ssl
from typing import Callable, Optional, Sequence, Union

from hicache.storage.buffers import consume, resolve_pieces
from hicache.storage.faults import StorageConnectionError, StorageProtocolError, StorageTimeout

__all__ = ["RespConnection", "RespError", "encode_command", "ASKING", "UNAVAILABLE_CODES"]

_CRLF = b"\r\n"
_IOV_MAX = 512
_DIRECT_MIN = 16 << 10   # read pieces at least this large straight into the destination
_COALESCE_MAX = 4 << 10  # glue command pieces smaller than this into one send
_SEND_GROUP_BYTES = 1 << 20  # set_many sends once this much payload is queued
# Replies that mean "this server cannot serve now" rather than "this key was refused".
UNAVAILABLE_CODES = ("LOADING", "BUSY", "MASTERDOWN", "CLUSTERDOWN", "NOAUTH", "NOPERM",
                     "WRONGPASS", "READONLY", "NOREPLICAS")


class RespError:
    """A ``-ERR ...`` reply, kept as a value. ``code`` is its first word (``OOM``, ``MOVED``)."""

    __slots__ = ("message",)

    def __init__(self, message: str):
        self.message = message

    @property
    def code(self) -> str:
        return self.message.split(" ", 1)[0]

    def __repr__(self) -> str:
        return f"RespError({self.message!r})"


Reply = Union[None, int, bytes, str, list, RespError]
Arg = Union[bytes, str, int]


def _arg(a: Arg) -> bytes:
    if isinstance(a, bytes):
        return a
    if isinstance(a, str):
        return a.encode()
    return str(a).encode()


def encode_command(*args: Arg) -> bytes:
    parts = [b"*%d\r\n" % len(args)]
    for a in args:
        b = _arg(a)
        parts.append(b"$%d\r\n%s\r\n" % (len(b), b))
    return b"".join(parts)


ASKING = encode_command("ASKING")


class RespConnection:
    """Gather sends, buffered replies and bulk reads into buffers, on one connected socket.

    ``where`` names the server in errors. The socket's own timeout (redis-py sets it to the
    URL's ``timeout``) bounds every wait. The read buffer is empty between operations:
    every reply of a pipeline is read before the connection goes back to its pool.
    """

    def __init__(self, sock: socket.socket, where: object):
        self.sock = sock
        self.endpoint = where
        self._gather = not isinstance(sock, ssl.SSLSocket)
        self._rb = bytearray(64 << 10)
        self._rv = memoryview(self._rb)
        self._rpos = self._rend = 0
        self.broken = False

    @property
    def idle(self) -> bool:
        """No unread reply bytes are buffered (true between operations)."""
        return self._rpos == self._rend

    # -- sending ------------------------------------------------------------------------
    def send(self, pieces: Sequence[Union[bytes, memoryview]]) -> None:
        """Send the pieces in order, as few syscalls and as few copies as possible."""
        merged: list = []
        small: list[bytes] = []
        for p in pieces:
            if len(p) < _COALESCE_MAX:
                small.append(p if isinstance(p, bytes) else bytes(p))
                continue
            if small:
                merged.append(b"".join(small))
                small = []
            merged.append(p)
        if small:
            merged.append(b"".join(small))
        try:
            if not self._gather:
                for p in merged:
                    self.sock.sendall(p)
                return
            pending = [memoryview(p) for p in merged if len(p)]
            while pending:
                n = self.sock.sendmsg(pending[:_IOV_MAX])
                consume(pending, n)
        except socket.timeout:
            self.broken = True
            raise StorageTimeout(f"{self.endpoint}: send timed out") from None
        except (OSError, ssl.SSLError) as exc:
            self.broken = True
            raise StorageConnectionError(f"{self.endpoint}: send failed: {exc}") from None

    # -- receiving ----------------------------------------------------------------------
    def _recv_into(self, mv: memoryview) -> int:
        try:
            n = self.sock.recv_into(mv)
        except socket.timeout:
            self.broken = True
            raise StorageTimeout(f"{self.endpoint}: no reply within {self.sock.gettimeout()}s") from None
        except (OSError, ssl.SSLError) as exc:
            self.broken = True
            raise StorageConnectionError(f"{self.endpoint}: receive failed: {exc}") from None
        if n == 0:
            self.broken = True
            raise StorageConnectionError(f"{self.endpoint}: connection closed by the server")
        return n

    def _fill(self) -> None:
        if self._rpos == self._rend:
            self._rpos = self._rend = 0
        elif self._rend == len(self._rb):
            live = self._rend - self._rpos
            if self._rpos == 0:  # a line longer than the buffer: grow it
                self._rv.release()
                self._rb = bytearray(self._rb) + bytearray(len(self._rb))
                self._rv = memoryview(self._rb)
            else:
                self._rb[:live] = self._rb[self._rpos:self._rend]
                self._rpos, self._rend = 0, live
        self._rend += self._recv_into(self._rv[self._rend:])

    def _readline(self) -> bytes:
        while True:
            i = self._rb.find(_CRLF, self._rpos, self._rend)
            if i >= 0:
                line = bytes(self._rv[self._rpos:i])
                self._rpos = i + 2
                return line
            self._fill()

    def _read_exact(self, mv: memoryview) -> None:
        want = mv.nbytes
        k = min(self._rend - self._rpos, want)
        if k:
            mv[:k] = self._rv[self._rpos:self._rpos + k]
            self._rpos += k
        off = k
        while off < want:
            if want - off >= _DIRECT_MIN:  # large: straight from the socket into the caller's memory
                off += self._recv_into(mv[off:])
            else:
                self._fill()
                k = min(self._rend - self._rpos, want - off)
                mv[off:off + k] = self._rv[self._rpos:self._rpos + k]
                self._rpos += k
                off += k

    def _skip(self, n: int) -> None:
        while n:
            if self._rpos == self._rend:
                self._fill()
            k = min(self._rend - self._rpos, n)
            self._rpos += k
            n -= k

    def _expect_crlf(self) -> None:
        while self._rend - self._rpos < 2:
            self._fill()
        if self._rv[self._rpos:self._rpos + 2] != _CRLF:
            self.broken = True
            raise StorageProtocolError(f"{self.endpoint}: bulk reply not terminated by CRLF")
        self._rpos += 2

    def read_reply(self) -> Reply:
        line = self._readline()
        if not line:
            self.broken = True
            raise StorageProtocolError(f"{self.endpoint}: empty reply line")
        t, rest = line[:1], line[1:]
        try:
            if t == b"+":
                return rest.decode()
            if t == b"-":
                return RespError(rest.decode(errors="replace"))
            if t == b":":
                return int(rest)
            if t == b"$":
                n = int(rest)
                if n < 0:
                    return None
                buf = bytearray(n)
                self._read_exact(memoryview(buf))
                self._expect_crlf()
                return bytes(buf)
            if t == b"*":
                n = int(rest)
                return None if n < 0 else [self.read_reply() for _ in range(n)]
        except ValueError:
            pass
        self.broken = True
        raise StorageProtocolError(f"{self.endpoint}: unexpected reply {line[:40]!r}")

    def read_bulk_into(self, views: Sequence[memoryview],
                       accept: Optional[Callable[[int, memoryview], bool]] = None
                       ) -> Union[int, None, RespError]:
        """Read one bulk reply into ``views`` in order; returns its length (see backend doc).

        ``accept(length, first_view)`` is asked once the first view is full; when it says
        False the rest of the value is read and dropped instead of landing in the others.
        """
        line = self._readline()
        if line[:1] == b"-":
            return RespError(line[1:].decode(errors="replace"))
        if line[:1] != b"$":
            self.broken = True
            raise StorageProtocolError(f"{self.endpoint}: expected a bulk reply, got {line[:40]!r}")
        try:
            n = int(line[1:])
        except ValueError:
            self.broken = True
            raise StorageProtocolError(f"{self.endpoint}: bad bulk length {line[:40]!r}") from None
        if n < 0:
            return None
        left = n
        for j, v in enumerate(views):
            if not left:
                break
            take = min(v.nbytes, left)
            self._read_exact(v[:take] if take < v.nbytes else v)
            left -= take
            if j == 0 and accept is not None and not accept(n, v):
                break
        if left:
            self._skip(left)
        self._expect_crlf()
        return n

    # -- commands -----------------------------------------------------------------------
    def pipeline(self, commands: Sequence[bytes]) -> list[Reply]:
        """Send pre-encoded commands at once and read their replies in order."""
        self.send([b"".join(commands)])
        return [self.read_reply() for _ in commands]

    def get_many(self, keys: Sequence[str], dests: Sequence[Sequence[memoryview]], depth: int,
                 asking: bool = False, accept: Optional[Callable[[int, int, memoryview], bool]] = None
                 ) -> list[Union[int, None, RespError]]:
        """Pipelined GETs, at most ``depth`` in flight, each read into its destination."""
        n = len(keys)
        out: list = []
        sent = 0
        prefix = ASKING if asking else b""

        def send_to(m: int) -> int:
            self.send([b"".join(prefix + encode_command("GET", k) for k in keys[sent:m])])
            return m

        sent = send_to(min(depth, n))
        for i in range(n):
            if sent < n and sent - i <= depth // 2:
                sent = send_to(min(i + depth, n))
            if asking:
                r = self.read_reply()
                if isinstance(r, RespError):
                    out.append(r)
                    self.read_bulk_into(())  # the GET's own reply, discarded
                    continue
            check = None if accept is None else (lambda length, head, i=i: accept(i, length, head))
            out.append(self.read_bulk_into(dests[i], check))
        return out

    def set_many(self, keys: Sequence[str], values: Sequence[Sequence[memoryview]],
                 asking: bool = False) -> list[Reply]:
        """Pipelined SETs; every value is sent before the first reply is read.

        ``values`` are :func:`~hicache.storage.buffers.send_pieces` lists: a
        :class:`~hicache.storage.buffers.Deferred` piece (the store's header, with its
        checksum) is made just before its value is sent, so hashing the next value
        overlaps the server reading this one. Values go out in gather lists of at least
        ``_SEND_GROUP_BYTES``.
        """
        pieces: list = []
        pending = 0
        for key, views in zip(keys, values):
            views = resolve_pieces(views)
            kb = key.encode()
            size = sum(v.nbytes for v in views)
            if asking:
                pieces.append(ASKING)
            pieces.append(b"*3\r\n$3\r\nSET\r\n$%d\r\n%s\r\n$%d\r\n" % (len(kb), kb, size))
            pieces.extend(views)
            pieces.append(_CRLF)
            pending += size
            if pending >= _SEND_GROUP_BYTES:
                self.send(pieces)
                pieces, pending = [], 0
        if pieces:
            self.send(pieces)
        out: list[Reply] = []
        for _ in keys:
            if asking:
                r = self.read_reply()
                if isinstance(r, RespError):
                    self.read_reply()
                    out.append(r)
                    continue
            out.append(self.read_reply())
        return out
