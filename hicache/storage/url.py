"""Storage URLs -> backends. One place decides which schemes exist and what options mean.

=============================================  =============================================
URL                                            backend
=============================================  =============================================
``memory://`` / ``memory://NAME``              in-process LRU store (NAME: shared in-process)
``file:///abs/dir``                            one file per object, atomic rename, LRU budget
``redis://[[user]:pass@]host[:port][/db]``     one Redis server over TCP
``rediss://...``                               the same over TLS
``unix:///path/redis.sock``                    one Redis server over a unix socket
``redis+cluster://[[user]:pass@]h1:p1,h2:p2``  Redis Cluster (hosts are seeds)
``rediss+cluster://...``                       Redis Cluster over TLS
=============================================  =============================================

Options go in the query string or as keyword arguments to :func:`open_backend` (keyword
arguments win): ``capacity`` (memory, file: bytes, ``4GiB``), ``fsync`` (file: 0/1);
for Redis ``connect_timeout`` and ``timeout`` (seconds), ``connections`` (parallel
connections per batch), ``pipeline`` (values in flight per connection), ``db``,
``username``, ``password`` (also in the URL's user part), and with a TLS scheme
``ssl_ca_certs``, ``ssl_certfile``, ``ssl_keyfile``, ``ssl_cert_reqs`` (``required`` |
``none``) and ``ssl_check_hostname`` (1 by default whenever certificates are required: the
server's certificate must name the host dialled; 0 turns that check off). Unknown schemes
and options raise :class:`ConfigError` naming them -- never echoing an option's value, which
may be a mistyped password.

The user part ends at the *last* ``@`` before the host, so a password may hold ``/``, ``?``,
``#`` or ``@`` unescaped (percent-escapes work too); only ``?name=`` inside a password must
be escaped (``%3F``), since that is where the query string starts.

Redis URLs need redis-py (the ``redis`` extra), which reads each host's URL and makes the
connections (``hicache/storage/redis_url.py``, ``redis_conns.py``); without it they are a
ConfigError naming the extra. Opening never touches the network: a Redis that is down at
start is a fault counted on first use (and a tripped breaker), not a failure to build the
cache.
"""

from __future__ import annotations

import math
import re
from typing import Any
from urllib.parse import parse_qsl, unquote

from hicache.errors import ConfigError
from hicache.storage.backend import STORAGE_PROTOCOL_VERSION, StorageBackend
from hicache.units import parse_bytes

SCHEMES = ("memory", "file", "redis", "rediss", "unix", "redis+cluster", "rediss+cluster")
_TLS_OPTS = {"ssl_ca_certs": str, "ssl_certfile": str, "ssl_keyfile": str, "ssl_cert_reqs": str,
             "ssl_check_hostname": bool}
_REDIS_OPTS = {"connect_timeout": float, "timeout": float, "connections": int, "pipeline": int,
               "db": int, "username": str, "password": str, "socket_buffer": int, **_TLS_OPTS}
_OPTS = {"memory": {"capacity"}, "file": {"capacity", "fsync"}}
# Where a query string starts: "?name=" (a "?" elsewhere may be part of a password).
_QUERY_START = re.compile(r"\?[A-Za-z_][A-Za-z0-9_]*=")


class _Hidden:
    """Stands for a value an error must not print (an unknown option may be a password)."""

    def __repr__(self) -> str:
        return "<not shown>"


HIDDEN = _Hidden()


def split_userinfo(after_scheme: str) -> tuple[str | None, str]:
    """Split what follows ``scheme://`` into (user part or None, the rest).

    The user part ends at the last ``@`` of the authority; an ``@`` inside the query
    string (after ``?name=``) belongs to an option's value. A rest starting with ``/``
    (``file:///dir``, ``unix:///sock``) has no authority, so no user part.
    """
    if after_scheme.startswith("/"):
        return None, after_scheme
    end = len(after_scheme)
    while (at := after_scheme.rfind("@", 0, end)) >= 0:
        if not _QUERY_START.search(after_scheme, 0, at):
            return after_scheme[:at], after_scheme[at + 1:]
        end = at
    return None, after_scheme


def mask_url(url: object) -> str:
    """The URL with its password replaced by ``***`` (for stats, logs, errors, reports).

    Both places a password can sit are masked: the user part (``user:***@host``, or
    ``:***@host`` for a password alone) and a ``password=`` option. A string without
    ``scheme://`` is masked the same way (a URL whose scheme was forgotten).
    """
    if not isinstance(url, str):
        return repr(url)
    scheme, sep, rest = url.partition("://")
    if not sep:
        scheme, rest = "", url
    userinfo, rest = split_userinfo(rest)
    rest, q, query = rest.partition("?")
    head = f"{scheme}://" if sep else ""
    if userinfo is not None:
        user = userinfo.split(":", 1)[0] if ":" in userinfo else ""
        head += f"{user}:***@"
    if query:
        query = "&".join("password=***" if p.split("=", 1)[0] == "password" else p for p in query.split("&"))
    return head + rest + (f"?{query}" if q else "")


def _opt(options: dict, name: str, conv) -> Any:
    value = options.pop(name)
    try:
        if conv == "bytes":
            return parse_bytes(value, f"storage_url.{name}")
        if conv is bool:
            if isinstance(value, bool):
                return value
            if str(value).lower() in ("1", "true", "yes", "on"):
                return True
            if str(value).lower() in ("0", "false", "no", "off"):
                return False
            raise ValueError
        out = conv(value)
        if isinstance(out, float) and not math.isfinite(out):
            raise ValueError
        return out
    except (TypeError, ValueError):  # ConfigError is a ValueError: its message echoes the value
        expect = {"bytes": "a byte size like 4GiB", bool: "0 or 1", int: "an integer",
                  float: "a finite number", str: "text"}[conv]
        raise ConfigError(f"storage_url.{name}", HIDDEN, f"cannot parse (expected {expect})") from None


def memory_store_name(url: str) -> str | None:
    """The name a ``memory://`` URL gives its store, as :func:`open_backend` reads it ("" for
    a private, unnamed store); None when the URL names another scheme."""
    scheme, sep, rest = url.partition("://")
    if not sep or scheme.lower() != "memory":
        return None
    return unquote(rest.partition("?")[0].strip("/"))


def with_memory_store_name(url: str, name: str) -> str:
    """``url`` (an unnamed ``memory://`` one) with its store named ``name``, options kept."""
    _, _, rest = url.partition("://")
    query = rest.partition("?")[2]
    return f"memory://{name}" + (f"?{query}" if query else "")


def open_backend(url: str, **options: Any) -> StorageBackend:
    """Open the backend a URL names (see module doc). Raises ConfigError for bad URLs."""
    if not isinstance(url, str) or "://" not in url:
        raise ConfigError("storage_url", mask_url(url) if isinstance(url, str) else url,
                          f"must be a URL with one of the schemes {list(SCHEMES)}")
    scheme, _, rest = url.partition("://")
    scheme = scheme.lower()
    masked = mask_url(url)
    if scheme not in SCHEMES:
        raise ConfigError("storage_url", masked, f"unknown scheme {scheme!r}; expected one of {list(SCHEMES)}")
    userinfo, rest = split_userinfo(rest)
    rest, _, query = rest.partition("?")
    opts: dict[str, Any] = dict(parse_qsl(query, keep_blank_values=True))
    opts.update({k: v for k, v in options.items() if v is not None})
    allowed = _OPTS.get(scheme, set(_REDIS_OPTS))
    unknown = sorted(set(opts) - allowed)
    if unknown:
        raise ConfigError(f"storage_url.{unknown[0]}", HIDDEN,
                          f"unknown option for {scheme}://; expected one of {sorted(allowed)}")
    if scheme in _OPTS and userinfo is not None:
        raise ConfigError("storage_url", masked, f"{scheme}:// takes no user or password")
    if scheme == "memory":
        from hicache.storage.memory import DEFAULT_MEMORY_CAPACITY, MemoryBackend

        cap = _opt(opts, "capacity", "bytes") if "capacity" in opts else DEFAULT_MEMORY_CAPACITY
        backend: StorageBackend = MemoryBackend(cap, name=unquote(rest.strip("/")))
    elif scheme == "file":
        from hicache.storage.file import DEFAULT_FILE_CAPACITY, FileBackend

        path = unquote(rest)
        if not path or path == "/":
            raise ConfigError("storage_url", masked, "file:// needs a directory, e.g. file:///var/cache/hicache")
        if not path.startswith("/"):
            raise ConfigError("storage_url", masked,
                              "file:// needs an absolute directory after the third slash, "
                              "e.g. file:///var/cache/hicache")
        cap = _opt(opts, "capacity", "bytes") if "capacity" in opts else DEFAULT_FILE_CAPACITY
        fsync = _opt(opts, "fsync", bool) if "fsync" in opts else False
        backend = FileBackend(path, cap, fsync=fsync)
    else:
        from hicache.storage.redis_url import open_redis

        backend = open_redis(scheme, userinfo, rest, opts, masked)
    assert backend.protocol_version == STORAGE_PROTOCOL_VERSION, (
        f"{type(backend).__name__} speaks storage protocol {backend.protocol_version}, "
        f"expected {STORAGE_PROTOCOL_VERSION}")
    return backend
