"""Where a Redis server is and how to talk to it: :class:`Endpoint` and :class:`RedisOptions`."""

from __future__ import annotations

import ssl
from dataclasses import dataclass, field
from typing import Optional

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

    With ``tls`` the server's certificate is verified against ``ssl_ca_certs`` (or the
    system's CAs) unless ``ssl_cert_reqs`` is ``"none"``, and while it is verified
    ``ssl_check_hostname`` (default on) also requires it to name the host dialled -- a valid
    certificate of another server is refused, as redis-py and browsers refuse it.
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

    def ssl_context(self) -> Optional[ssl.SSLContext]:
        """The client TLS context (None without ``tls``); a certificate file that cannot be
        read or parsed is a ConfigError naming the option and the file."""
        if not self.tls:
            return None
        try:
            ctx = ssl.create_default_context(cafile=self.ssl_ca_certs)
        except (OSError, ssl.SSLError) as exc:
            raise ConfigError("storage_url.ssl_ca_certs", self.ssl_ca_certs, f"cannot load: {_reason(exc)}") from None
        if self.ssl_cert_reqs == "none":
            ctx.check_hostname = False
            ctx.verify_mode = ssl.CERT_NONE
        else:
            ctx.check_hostname = self.ssl_check_hostname
        if self.ssl_certfile:
            try:
                ctx.load_cert_chain(self.ssl_certfile, self.ssl_keyfile)
            except (OSError, ssl.SSLError) as exc:
                raise ConfigError("storage_url.ssl_certfile", self.ssl_certfile,
                                  f"cannot load with its key: {_reason(exc)}") from None
        return ctx


def _reason(exc: BaseException) -> str:
    return getattr(exc, "reason", None) or getattr(exc, "strerror", None) or type(exc).__name__
