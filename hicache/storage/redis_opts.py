"""Where a Redis server is and how to talk to it: :class:`Endpoint` and :class:`RedisOptions`."""

from __future__ import annotations

import ssl
from dataclasses import dataclass
from typing import Optional


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
    """Connection options shared by every connection to one server (or cluster)."""

    username: Optional[str] = None
    password: Optional[str] = None
    db: int = 0
    tls: bool = False
    ssl_ca_certs: Optional[str] = None
    ssl_certfile: Optional[str] = None
    ssl_keyfile: Optional[str] = None
    ssl_cert_reqs: str = "required"      # "required" | "none"
    ssl_check_hostname: bool = False
    connect_timeout_s: float = 0.5
    op_timeout_s: float = 1.0
    connections: int = 2                 # connections one large batch is spread over
    pipeline: int = 8                    # values in flight per connection
    socket_buffer_bytes: int = 4 << 20   # SO_SNDBUF / SO_RCVBUF (0 = kernel default)

    def ssl_context(self) -> Optional[ssl.SSLContext]:
        if not self.tls:
            return None
        ctx = ssl.create_default_context(cafile=self.ssl_ca_certs)
        if self.ssl_cert_reqs == "none":
            ctx.check_hostname = False
            ctx.verify_mode = ssl.CERT_NONE
        else:
            ctx.check_hostname = self.ssl_check_hostname
        if self.ssl_certfile:
            ctx.load_cert_chain(self.ssl_certfile, self.ssl_keyfile)
        return ctx
