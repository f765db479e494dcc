"""A storage URL's password never reaches output: masks, errors, reprs, stats and metrics.

The password is found by the *last* ``@`` of the authority, so ``/``, ``?``, ``#`` and ``@``
inside it neither leak it nor break parsing.
"""

from __future__ import annotations

import pytest

from hicache.config import StorageConfig, cache_config_from_mapping
from hicache.errors import ConfigError
from hicache.storage import mask_url, open_backend
from hicache.storage.redis_opts import RedisOptions

SECRET = "hunter2"
# Passwords with every character that ends an authority in RFC 3986, and "@" itself.
ODD = ["pa/ss", "pa?ss", "pa#ss", "pa@ss", "p/a?s#s@w", "a:b"]


@pytest.mark.parametrize("pw", ODD)
def test_mask_finds_the_user_part_by_its_last_at(pw):
    url = f"redis://alice:{pw}@cache.local:6380/2?timeout=1"
    assert mask_url(url) == "redis://alice:***@cache.local:6380/2?timeout=1"
    if ":" not in pw:
        assert mask_url(f"redis://{pw}@h:1") == "redis://:***@h:1"     # a password alone
    assert mask_url(f"redis+cluster://:{pw}@a:1,b:2") == "redis+cluster://:***@a:1,b:2"


@pytest.mark.parametrize("pw", ODD)
def test_odd_passwords_parse_whole(pw):
    b = open_backend(f"redis://alice:{pw}@cache.local:6380/2")
    assert (b.node.opts.username, b.node.opts.password, b.node.endpoint.host, b.node.endpoint.port,
            b.node.opts.db) == ("alice", pw, "cache.local", 6380, 2)
    assert pw not in b.url and b.url == "redis://alice:***@cache.local:6380/2"


def test_mask_query_and_forgotten_scheme():
    assert mask_url("redis://h:1/0?db=1&password=x/y@z") == "redis://h:1/0?db=1&password=***"
    # an "@" in an option's value is not a user part
    assert mask_url("rediss://h:1/0?ssl_ca_certs=/a@b/ca.pem") == "rediss://h:1/0?ssl_ca_certs=/a@b/ca.pem"
    assert open_backend("redis://h:1/0?password=p@ss").node.opts.password == "p@ss"
    assert mask_url(f"u:{SECRET}@h:6379") == "u:***@h:6379"
    assert mask_url("unix:///run/a@b/redis.sock?password=pw") == "unix:///run/a@b/redis.sock?password=***"
    assert mask_url("file:///data/l3") == "file:///data/l3"


@pytest.mark.parametrize("url", [
    f"redis://h:1/0?pasword={SECRET}",                    # a typo of an option: its value may be the secret
    f"redis://h:1/0?password={SECRET}&colour=red",
    f"redis://h:1/0?timeout={SECRET}",                    # unparsable values are not shown either
    f"redis://h:1/0?connections={SECRET}",
    f"memory://?capacity={SECRET}",
    f"redis://u:{SECRET}@h:70000/0",                      # errors about the URL show it masked
    f"redis://u:{SECRET}@h:1/abc",
    f"redis://u:{SECRET}@h:1,h2:2/0",
    f"redis://u:pa/{SECRET}@[::1:1/0",
    f"memory://u:{SECRET}@name",
    f"u:{SECRET}@h:6379",
    f"ftp://u:{SECRET}@h",
])
def test_errors_never_echo_the_secret(url):
    with pytest.raises(ConfigError) as ei:
        open_backend(url)
    assert SECRET not in str(ei.value), str(ei.value)


def test_config_reprs_and_errors_mask_the_url():
    url = f"redis://u:pa/{SECRET}@h:1/0"
    cfg = StorageConfig(url=url)
    assert SECRET not in repr(cfg) and "u:***@h:1/0" in repr(cfg)
    full = cache_config_from_mapping({"storage_url": url})
    assert SECRET not in repr(full)
    assert SECRET not in repr(RedisOptions(username="u", password=SECRET))
    with pytest.raises(ConfigError) as ei:   # a mistyped key holding a URL
        cache_config_from_mapping({"storage_ur": url})
    assert SECRET not in str(ei.value)
    with pytest.raises(ConfigError) as ei:   # the scheme forgotten
        StorageConfig(url=f"u:{SECRET}@h:6379")
    assert SECRET not in str(ei.value)


def test_stats_and_metrics_of_a_live_server_never_show_the_password(redis_server_factory):
    pw = f"p/a?s#s@{SECRET}"
    server = redis_server_factory("--requirepass", pw)
    backend = open_backend(f"redis://default:{pw}@127.0.0.1:{server.port}/0?connect_timeout=5")
    try:
        assert backend.put(["hc:s"], [b"v"]) == [True]      # the odd password authenticated
        stats = backend.stats()
        assert stats.url == f"redis://default:***@127.0.0.1:{server.port}/0?connect_timeout=5"
        assert SECRET not in repr(stats.to_dict()) and SECRET not in repr(backend.node.opts)
    finally:
        backend.delete(["hc:s"])
        backend.close()


def test_cache_stats_and_prometheus_text_never_show_the_password(redis_server_factory):
    pytest.importorskip("prometheus_client")
    from hicache.cache.metrics import PrometheusExporter
    from tests.cache.conftest import Engine, make_cache, toks

    server = redis_server_factory("--requirepass", SECRET)
    eng = Engine(make_cache(storage=f"redis://:{SECRET}@127.0.0.1:{server.port}/0?connect_timeout=5"))
    try:
        exp = PrometheusExporter(eng.cache)
        eng.run(toks(1, 2, extra=1))
        eng.cache.drain()
        exp.update()
        assert eng.cache.stats()["l3_put_objects"] > 0       # L3 was used, with the password
        for text in (exp.text(), repr(eng.cache.stats()), repr(eng.cache.l3_stats()),
                     repr(eng.cache.store.stats(backend=True).to_dict()), repr(eng.cache.config)):
            assert SECRET not in text
    finally:
        eng.cache.close()
