"""Where a Redis server is and how to talk to it: :class:`Endpoint` and :class:`RedisOptions`.

These are our frozen config; :meth:`RedisOptions.client_kwargs` turns them into the keyword
arguments of redis-py's ``Redis`` / ``RedisCluster``, which establish, authenticate and
verify every connection. Nothing here imports redis-py.
"""

from __future__ import annotations

import ssl
from dataclasses import dataclass, field
from typing import Any, Optional

from hicache.errors import ConfigError


@dataclass(frozen=True)
class Endpoint:
    """Where a Redis server listens: ``host``/``port`` (TCP) or ``path`` (unix socket)."""

    host: Optional[str] = None
    port: Optional[int] = None
    path: Optional[str] = None

    def __str__(self) -> str:
        return f"unix:{self.path}" if self.path else f"{self.host}:{self.port}"


@dataclass(frozen=True)
class RedisOptions:
    """Connection options shared by every connection to one server (or cluster).

    With ``tls`` the server's certificate is verified against ``ssl_ca_certs`` (added to
    the system's CAs, as redis-py does) unless ``ssl_cert_reqs`` is ``"none"``, and while
    it is verified ``ssl_check_hostname`` (default on) also requires it to name the host
    dialled -- a valid certificate of another server is refused. redis-py does both checks.
    The password never appears in ``repr()``.
    """

    username: Optional[str] = None
    password: Optional[str] = field(default=None, repr=False)
    db: int = 0
    tls: bool = False
    ssl_ca_certs: Optional[str] = None
    ssl_certfile: Optional[str] = None
    ssl_keyfile: Optional[str] = None
    ssl_cert_reqs: str = "required"      # "required" | "none"
    ssl_check_hostname: bool = True
    connect_timeout_s: float = 0.5
    op_timeout_s: float = 1.0
    connections: int = 2                 # connections one large batch is spread over
    pipeline: int = 8                    # values in flight per connection
    socket_buffer_bytes: int = 4 << 20   # SO_SNDBUF / SO_RCVBUF (0 = kernel default)

    def client_kwargs(self) -> dict[str, Any]:
        """Keyword arguments of ``redis.Redis`` and ``redis.cluster.RedisCluster`` (no
        address, no database, no retry policy: the caller adds those).

        A username without a password authenticates nothing (``AUTH`` needs a password),
        so it is dropped, as it was before redis-py made the connections.
        """
        kw: dict[str, Any] = {"socket_timeout": self.op_timeout_s,
                              "socket_connect_timeout": self.connect_timeout_s,
                              # RESP2, whatever redis-py's default (8.x: RESP3 via HELLO 3):
                              # our data path parses RESP2 replies; see hicache/storage/resp.py
                              "protocol": 2}
        if self.password is not None:
            kw.update(username=self.username or None, password=self.password)
        if self.tls:
            kw.update(ssl=True, ssl_ca_certs=self.ssl_ca_certs, ssl_certfile=self.ssl_certfile,
                      ssl_keyfile=self.ssl_keyfile, ssl_cert_reqs=self.ssl_cert_reqs,
                      ssl_check_hostname=self.ssl_check_hostname and self.ssl_cert_reqs != "none")
        return kw

    def check_tls_files(self) -> None:
        """Load the certificate files the way redis-py will at connect time, so a file
        that cannot be read or parsed is a ConfigError (naming the option and the file)
        when the URL is opened, not a connection fault on every call."""
        if not self.tls:
            return
        ctx = ssl.create_default_context()
        if self.ssl_ca_certs:
            try:
                ctx.load_verify_locations(cafile=self.ssl_ca_certs)
            except (OSError, ssl.SSLError) as exc:
                raise ConfigError("storage_url.ssl_ca_certs", self.ssl_ca_certs,
                                  f"cannot load: {_reason(exc)}") from None
        if self.ssl_certfile:
            try:
                ctx.load_cert_chain(self.ssl_certfile, self.ssl_keyfile)
            except (OSError, ssl.SSLError) as exc:
                raise ConfigError("storage_url.ssl_certfile", self.ssl_certfile,
                                  f"cannot load with its key: {_reason(exc)}") from None


def _reason(exc: BaseException) -> str:
    return getattr(exc, "reason", None) or getattr(exc, "strerror", None) or type(exc).__name__
