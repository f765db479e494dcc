"""The Redis half of :func:`hicache.storage.url.open_backend`: hosts, database, options, TLS.

Who reads what. Our code splits the user part at its *last* ``@`` (urllib, and so
redis-py, ends the authority at the first ``/``, ``?`` or ``#``, so a password holding one
of them would be cut), splits ``redis+cluster://`` host lists (redis-py's URLs name one host),
reads our own options (``connections``, ``pipeline``, ``timeout``, ...) and checks
everything with one-line errors before any connection is made: ports in 1..65535, a
database >= 0, finite positive timeouts, TLS options only with a TLS scheme, certificate
files that exist and load. Then each host is written back as a plain one-host URL (user and
password percent-escaped) and ``redis.connection.parse_url`` -- redis-py's own URL reader
-- says what it means: host, port, unix socket path, database, user, password. Those are
the values redis-py's connections are built from. Errors print the URL with its password
masked.

redis-py is the ``redis`` extra: without it a Redis URL is a ConfigError saying so.
"""

from __future__ import annotations

import os
from typing import Any, Optional
from urllib.parse import quote, unquote

from hicache.errors import ConfigError
from hicache.storage.backend import StorageBackend
from hicache.storage.redis_opts import Endpoint, RedisOptions

DEFAULT_PORT = 6379
_RENAMED = {"connect_timeout": "connect_timeout_s", "timeout": "op_timeout_s", "socket_buffer": "socket_buffer_bytes"}


def open_redis(scheme: str, userinfo: Optional[str], rest: str, opts: dict, masked: str) -> StorageBackend:
    """A backend for ``redis``, ``rediss``, ``unix`` and the ``+cluster`` schemes.

    ``userinfo`` is the URL's user part (None without one), ``rest`` what follows it up to
    the query string, ``opts`` the query options merged with keyword options.
    """
    from hicache.storage.url import _REDIS_OPTS, _TLS_OPTS, _opt

    tls = scheme.startswith("rediss")
    if not tls:
        given = sorted(set(opts) & set(_TLS_OPTS))
        if given:
            raise ConfigError(f"storage_url.{given[0]}", opts[given[0]],
                              f"is a TLS option; {scheme}:// is not TLS (use rediss:// or rediss+cluster://)")
    conv = {k: _opt(opts, k, c) for k, c in list(_REDIS_OPTS.items()) if k in opts}
    kw: dict[str, Any] = {_RENAMED.get(k, k): v for k, v in conv.items()}
    if userinfo is not None:
        user, colon, pw = userinfo.partition(":")
        if colon:
            kw.setdefault("username", unquote(user) or None)
            kw.setdefault("password", unquote(pw))
        else:
            kw.setdefault("password", unquote(user))  # redis://secret@host: a password alone
    _check_numbers(kw)
    if tls:
        _check_tls(kw, conv)
    kw["tls"] = tls
    if kw.get("db", 0) < 0:
        raise ConfigError("storage_url.db", kw["db"], "must be >= 0")
    if scheme == "unix":
        sock_path = unquote(rest)
        if not sock_path.startswith("/") or sock_path == "/":
            raise ConfigError("storage_url", masked, "unix:// needs an absolute socket path: unix:///run/redis.sock")
        endpoints = [Endpoint(path=sock_path)]
    else:
        netloc, _, path = rest.partition("/")
        db = path.strip("/")
        if db:
            if not db.isdigit():
                raise ConfigError("storage_url", masked, f"database {db!r} must be a number >= 0")
            kw.setdefault("db", int(db))  # a db= option (or keyword) wins over the path
        hosts = netloc.split(",")
        if len(hosts) > 1 and not all(hosts):
            raise ConfigError("storage_url", masked, "an empty host in the host list")
        endpoints = [parse_host_port(hp, masked) for hp in hosts]
    cluster = scheme.endswith("+cluster")
    if cluster and kw.get("db"):
        raise ConfigError("storage_url.db", kw["db"], "Redis Cluster has only database 0")
    if not cluster and len(endpoints) != 1:
        raise ConfigError("storage_url", masked, "several hosts need the redis+cluster:// scheme")
    RedisOptions(**kw).check_tls_files()  # a bad certificate file is a ConfigError now
    # Everything is checked: redis-py reads each host's URL (and is needed from here on).
    endpoints = [_read_by_redis_py(scheme, ep, kw, masked) for ep in endpoints]
    opts_obj = RedisOptions(**kw)
    if cluster:
        from hicache.storage.cluster import RedisClusterBackend

        return RedisClusterBackend(endpoints, opts_obj, masked)
    from hicache.storage.redis_node import RedisBackend

    return RedisBackend(endpoints[0], opts_obj, masked)


def _read_by_redis_py(scheme: str, ep: Endpoint, kw: dict, masked: str) -> Endpoint:
    """The endpoint redis-py's ``parse_url`` reads from one checked host written as a plain
    URL; the user and password it reads replace those in ``kw``. So the connections are
    made from what redis-py understands the URL to say."""
    try:
        from redis.connection import parse_url
    except ImportError:
        raise ConfigError("storage_url", masked, "Redis URLs need redis-py, the 'redis' extra: "
                          "pip install 'hicache[redis]'") from None
    password = kw.get("password")
    user = quote(kw.get("username") or "", safe="")
    auth = f"{user}:{quote(password, safe='')}@" if password else ""
    if ep.path:
        parsed = parse_url(f"unix://{auth}{quote(ep.path, safe='/')}?db={kw.get('db', 0)}")
        out = Endpoint(path=parsed["path"])
    else:
        assert ep.host is not None, "an endpoint has a path or a host"
        host = f"[{ep.host}]" if ":" in ep.host else ep.host
        base = "rediss" if scheme.startswith("rediss") else "redis"
        parsed = parse_url(f"{base}://{auth}{host}:{ep.port}/{kw.get('db', 0)}")
        out = Endpoint(host=parsed["host"], port=parsed["port"])
    assert parsed.get("db", 0) == kw.get("db", 0), "redis-py read another database than we wrote"
    if password:  # redis-py reads no empty password; ours (``user:@host``) stays as given
        kw["password"], kw["username"] = parsed["password"], parsed.get("username")
    return out


def parse_host_port(hp: str, masked: str) -> Endpoint:
    """``host``, ``host:port``, ``[v6]:port`` or ``:port`` (loopback) -> an Endpoint."""
    if hp.startswith("["):
        close = hp.find("]")
        tail = hp[close + 1:] if close >= 0 else ""
        host = hp[1:close]
        if close < 0 or (tail and not tail.startswith(":")) or not _is_ipv6(host):
            raise ConfigError("storage_url", masked, f"bad IPv6 address in {hp!r}; write [::1]:6379")
        colon, port = (":", tail[1:]) if tail else ("", "")
    else:
        if hp.count(":") > 1:
            raise ConfigError("storage_url", masked, f"an IPv6 address goes in brackets: [{hp}]")
        host, colon, port = hp.partition(":")
        if not all(c.isalnum() or c in "._-" for c in host):
            raise ConfigError("storage_url", masked, f"bad host name {host!r}")
    if not colon:
        return Endpoint(host=host or "127.0.0.1", port=DEFAULT_PORT)
    if not port.isdigit() or not 1 <= int(port) <= 65535:
        raise ConfigError("storage_url", masked, f"bad port in {hp!r}: must be a number in 1..65535")
    return Endpoint(host=host or "127.0.0.1", port=int(port))


def _is_ipv6(host: str) -> bool:
    import ipaddress

    try:
        ipaddress.IPv6Address(host.split("%", 1)[0])
    except ValueError:
        return False
    return True


def _check_numbers(kw: dict) -> None:
    for field, opt in (("connect_timeout_s", "connect_timeout"), ("op_timeout_s", "timeout")):
        if field in kw and not kw[field] > 0:
            raise ConfigError(f"storage_url.{opt}", kw[field], "must be > 0 seconds")
    for name in ("connections", "pipeline"):
        if name in kw and kw[name] < 1:
            raise ConfigError(f"storage_url.{name}", kw[name], "must be >= 1")
    if kw.get("socket_buffer_bytes", 0) < 0:
        raise ConfigError("storage_url.socket_buffer", kw["socket_buffer_bytes"], "must be >= 0 (0: the kernel's)")


def _check_tls(kw: dict, given: dict) -> None:
    """TLS options: known values, files that exist, no hostname check without verification."""
    reqs = kw.get("ssl_cert_reqs", "required")
    if reqs not in ("required", "none"):
        raise ConfigError("storage_url.ssl_cert_reqs", reqs, "must be 'required' or 'none'")
    if reqs == "none":
        if given.get("ssl_check_hostname"):
            raise ConfigError("storage_url.ssl_check_hostname", 1,
                              "needs ssl_cert_reqs=required: a certificate that is not verified names nothing")
        kw["ssl_check_hostname"] = False
    for name in ("ssl_ca_certs", "ssl_certfile", "ssl_keyfile"):
        path = kw.get(name)
        if path is not None and not os.path.isfile(path):
            raise ConfigError(f"storage_url.{name}", path, "no such file")
    if kw.get("ssl_keyfile") and not kw.get("ssl_certfile"):
        raise ConfigError("storage_url.ssl_keyfile", kw["ssl_keyfile"], "needs ssl_certfile (the client certificate)")
