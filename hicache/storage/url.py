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
``username``, ``password`` (also in the URL's user part), ``ssl_ca_certs``,
``ssl_certfile``, ``ssl_keyfile``, ``ssl_cert_reqs`` (``required`` | ``none``). Unknown
schemes and options raise :class:`ConfigError` naming them.

Opening never touches the network: a Redis that is down at start is a fault counted on
first use (and a tripped breaker), not a failure to build the cache.
"""

from __future__ import annotations

from typing import Any
from urllib.parse import parse_qsl, unquote

from hicache.errors import ConfigError
from hicache.storage.backend import STORAGE_PROTOCOL_VERSION, StorageBackend
from hicache.units import parse_bytes

SCHEMES = ("memory", "file", "redis", "rediss", "unix", "redis+cluster", "rediss+cluster")
_REDIS_OPTS = {"connect_timeout": float, "timeout": float, "connections": int, "pipeline": int,
               "db": int, "username": str, "password": str, "ssl_ca_certs": str, "ssl_certfile": str,
               "ssl_keyfile": str, "ssl_cert_reqs": str, "socket_buffer": int}
_OPTS = {"memory": {"capacity"}, "file": {"capacity", "fsync"}}


def mask_url(url: str) -> str:
    """The URL with any password replaced by ``***`` (for stats and logs)."""
    scheme, sep, rest = url.partition("://")
    if not sep:
        return url
    rest, q, query = rest.partition("?")
    netloc, slash, path = rest.partition("/")
    if "@" in netloc:
        user, _, hosts = netloc.rpartition("@")
        name = user.split(":", 1)[0] if ":" in user else ""
        netloc = f"{name}:***@{hosts}"
    if query:
        query = "&".join("password=***" if p.startswith("password=") else p for p in query.split("&"))
    return f"{scheme}://{netloc}{slash}{path}" + (f"?{query}" if q else "")


def _opt(options: dict, name: str, conv, url: str) -> Any:
    value = options.pop(name)
    if conv == "bytes":
        return parse_bytes(value, f"storage_url.{name}")
    try:
        if conv is bool:
            if isinstance(value, bool):
                return value
            if str(value).lower() in ("1", "true", "yes", "on"):
                return True
            if str(value).lower() in ("0", "false", "no", "off"):
                return False
            raise ValueError
        return conv(value)
    except (TypeError, ValueError):
        raise ConfigError(f"storage_url.{name}", value, f"cannot parse for {mask_url(url)}") from None


def open_backend(url: str, **options: Any) -> StorageBackend:
    """Open the backend a URL names (see module doc). Raises ConfigError for bad URLs."""
    if not isinstance(url, str) or "://" not in url:
        raise ConfigError("storage_url", url, f"must be a URL with one of the schemes {list(SCHEMES)}")
    scheme, _, rest = url.partition("://")
    scheme = scheme.lower()
    if scheme not in SCHEMES:
        raise ConfigError("storage_url", mask_url(url),
                          f"unknown scheme {scheme!r}; expected one of {list(SCHEMES)}")
    rest, _, query = rest.partition("?")
    opts: dict[str, Any] = dict(parse_qsl(query, keep_blank_values=True))
    opts.update({k: v for k, v in options.items() if v is not None})
    allowed = _OPTS.get(scheme, set(_REDIS_OPTS))
    unknown = sorted(set(opts) - allowed)
    if unknown:
        raise ConfigError(f"storage_url.{unknown[0]}", opts[unknown[0]],
                          f"unknown option for {scheme}://; expected one of {sorted(allowed)}")
    if scheme == "memory":
        from hicache.storage.memory import DEFAULT_MEMORY_CAPACITY, MemoryBackend

        cap = _opt(opts, "capacity", "bytes", url) if "capacity" in opts else DEFAULT_MEMORY_CAPACITY
        backend: StorageBackend = MemoryBackend(cap, name=unquote(rest.strip("/")))
    elif scheme == "file":
        from hicache.storage.file import DEFAULT_FILE_CAPACITY, FileBackend

        path = unquote(rest)
        if not path or path == "/":
            raise ConfigError("storage_url", url, "file:// needs a directory, e.g. file:///var/cache/hicache")
        cap = _opt(opts, "capacity", "bytes", url) if "capacity" in opts else DEFAULT_FILE_CAPACITY
        fsync = _opt(opts, "fsync", bool, url) if "fsync" in opts else False
        backend = FileBackend(path, cap, fsync=fsync)
    else:
        backend = _open_redis(url, scheme, rest, opts)
    assert backend.protocol_version == STORAGE_PROTOCOL_VERSION, (
        f"{type(backend).__name__} speaks storage protocol {backend.protocol_version}, "
        f"expected {STORAGE_PROTOCOL_VERSION}")
    return backend


def _open_redis(url: str, scheme: str, rest: str, opts: dict) -> StorageBackend:
    from hicache.storage.resp import Endpoint, RedisOptions

    kw: dict[str, Any] = {}
    conv = {k: _opt(opts, k, c, url) for k, c in list(_REDIS_OPTS.items()) if k in opts}
    netloc, _, path = rest.partition("/") if scheme != "unix" else ("", "", rest)
    if "@" in netloc:
        userinfo, _, netloc = netloc.rpartition("@")
        user, colon, pw = userinfo.partition(":")
        if colon:
            kw["username"] = unquote(user) or None
            kw["password"] = unquote(pw)
        else:
            kw["password"] = unquote(user)  # redis://secret@host: a password alone
    for name, field in (("connect_timeout", "connect_timeout_s"), ("timeout", "op_timeout_s"),
                        ("socket_buffer", "socket_buffer_bytes")):
        if name in conv:
            conv[field] = conv.pop(name)
    kw.update(conv)
    for name, opt in (("connect_timeout_s", "connect_timeout"), ("op_timeout_s", "timeout")):
        if name in kw and not kw[name] > 0:
            raise ConfigError(f"storage_url.{opt}", kw[name], "must be > 0 seconds")
    for name in ("connections", "pipeline"):
        if name in kw and kw[name] < 1:
            raise ConfigError(f"storage_url.{name}", kw[name], "must be >= 1")
    if kw.get("ssl_cert_reqs", "required") not in ("required", "none"):
        raise ConfigError("storage_url.ssl_cert_reqs", kw["ssl_cert_reqs"], "must be 'required' or 'none'")
    kw["tls"] = scheme.startswith("rediss")
    masked = mask_url(url)
    if scheme == "unix":
        sock_path = unquote(path)
        if not sock_path.startswith("/"):
            raise ConfigError("storage_url", masked, "unix:// needs an absolute socket path: unix:///run/redis.sock")
        from hicache.storage.redis_node import RedisBackend

        return RedisBackend(Endpoint(path=sock_path), RedisOptions(**kw), masked)
    if path.strip("/"):
        try:
            kw.setdefault("db", int(path.strip("/")))
        except ValueError:
            raise ConfigError("storage_url", masked, f"database {path.strip('/')!r} must be a number") from None
    endpoints = []
    for hp in netloc.split(","):
        host, colon, port = hp.rpartition(":") if hp.rfind(":") > hp.rfind("]") else (hp, "", "")
        host = host.strip("[]") or "127.0.0.1"
        try:
            endpoints.append(Endpoint(host=host, port=int(port) if colon else 6379))
        except ValueError:
            raise ConfigError("storage_url", masked, f"bad port in {hp!r}") from None
    if scheme.endswith("+cluster"):
        if kw.get("db"):
            raise ConfigError("storage_url.db", kw["db"], "Redis Cluster has only database 0")
        from hicache.storage.cluster import RedisClusterBackend

        return RedisClusterBackend(endpoints, RedisOptions(**kw), masked)
    if len(endpoints) != 1:
        raise ConfigError("storage_url", masked, "several hosts need the redis+cluster:// scheme")
    from hicache.storage.redis_node import RedisBackend

    return RedisBackend(endpoints[0], RedisOptions(**kw), masked)
