import pytest

# The Redis backends import redis-py (an optional dependency): without it this module skips
# instead of stopping the whole collection (a GPU machine has no redis-py).
pytest.importorskip("redis")

from hicache.errors import ConfigError
from hicache.storage import SCHEMES, mask_url, open_backend
from hicache.storage.cluster import RedisClusterBackend
from hicache.storage.file import FileBackend
from hicache.storage.memory import MemoryBackend
from hicache.storage.redis_node import RedisBackend
from hicache.storage.redis_opts import Endpoint


def test_schemes_select_backends(tmp_path):
    m = open_backend("memory://?capacity=2MiB")
    assert isinstance(m, MemoryBackend) and m.stats().capacity_bytes == 2 << 20
    f = open_backend(f"file://{tmp_path}/l3?capacity=1GiB&fsync=1")
    assert isinstance(f, FileBackend) and f.capacity == 1 << 30 and f.fsync is True
    # opening a Redis URL never touches the network
    r = open_backend("redis://alice:s3cret@10.255.255.1:7000/3?timeout=0.25&connect_timeout=0.1&connections=3")
    assert isinstance(r, RedisBackend)
    o = r.node.opts
    assert (r.node.endpoint, o.username, o.password, o.db, o.op_timeout_s, o.connect_timeout_s, o.connections) == (
        Endpoint("10.255.255.1", 7000), "alice", "s3cret", 3, 0.25, 0.1, 3)
    assert r.url == "redis://alice:***@10.255.255.1:7000/3?timeout=0.25&connect_timeout=0.1&connections=3"
    t = open_backend("rediss://h:6380?ssl_cert_reqs=none")
    assert t.node.opts.tls and t.node.opts.ssl_cert_reqs == "none" and t.node.endpoint == Endpoint("h", 6380)
    u = open_backend("unix:///run/redis/redis.sock?db=2&password=pw")
    assert u.node.endpoint == Endpoint(path="/run/redis/redis.sock") and u.node.opts.db == 2
    assert u.url == "unix:///run/redis/redis.sock?db=2&password=***"
    c = open_backend("redis+cluster://:pw@a:7000,b:7001,c")
    assert isinstance(c, RedisClusterBackend)
    assert c.seeds == [Endpoint("a", 7000), Endpoint("b", 7001), Endpoint("c", 6379)]
    assert c.opts.password == "pw" and c.opts.username is None
    assert open_backend("rediss+cluster://a:1").opts.tls
    # keyword options win over the query string
    assert open_backend("redis://h?timeout=5", timeout=0.5).node.opts.op_timeout_s == 0.5
    assert "redis+cluster" in SCHEMES


@pytest.mark.parametrize("url, field, words", [
    ("ftp://x", "storage_url", "unknown scheme 'ftp'"),
    ("localhost:6379", "storage_url", "must be a URL"),
    ("redis://h:notaport", "storage_url", "bad port"),
    ("redis://h/abc", "storage_url", "must be a number"),
    ("redis://h?colour=red", "storage_url.colour", "unknown option"),
    ("memory://?fsync=1", "storage_url.fsync", "unknown option"),
    ("redis://h?timeout=0", "storage_url.timeout", "> 0"),
    ("redis://h?connections=0", "storage_url.connections", ">= 1"),
    ("redis://a:1,b:2", "storage_url", "redis+cluster"),
    ("redis+cluster://a:1/2", "storage_url.db", "only database 0"),
    ("unix://relative.sock", "storage_url", "absolute"),
    ("file://", "storage_url", "needs a directory"),
    ("memory://?capacity=lots", "storage_url.capacity", "byte size"),
    # accepted silently before: now one line naming the field
    ("redis://h:70000/0", "storage_url", "1..65535"),
    ("redis://h:0/0", "storage_url", "1..65535"),
    ("redis://h:-1/0", "storage_url", "1..65535"),
    ("redis://h:1/-1", "storage_url", "must be a number >= 0"),
    ("redis://h:1/0?db=-1", "storage_url.db", ">= 0"),
    ("redis://[::1/0", "storage_url", "IPv6"),
    ("redis://::1:6379/0", "storage_url", "brackets"),
    ("redis://h o:1/0", "storage_url", "bad host name"),
    ("redis://h:1?timeout=inf", "storage_url.timeout", "finite"),
    ("redis://h:1?connect_timeout=nan", "storage_url.connect_timeout", "finite"),
    ("redis://h:1?socket_buffer=-1", "storage_url.socket_buffer", ">= 0"),
    ("file://relative/dir", "storage_url", "absolute"),
    ("file://host/dir", "storage_url", "absolute"),
    ("memory://user:pw@name", "storage_url", "no user or password"),
    ("unix:///", "storage_url", "absolute"),
    ("redis+cluster://a:1,,b:2", "storage_url", "empty host"),
    # TLS options: only with a TLS scheme, files that exist, no name check without verification
    ("rediss://h:1?ssl_cert_reqs=none&ssl_check_hostname=1", "storage_url.ssl_check_hostname", "ssl_cert_reqs=required"),
    ("rediss://h:1?ssl_check_hostname=maybe", "storage_url.ssl_check_hostname", "0 or 1"),
    ("rediss://h:1?ssl_ca_certs=/nonexistent/ca.pem", "storage_url.ssl_ca_certs", "no such file"),
    ("rediss://h:1?ssl_certfile=/nonexistent/c.pem", "storage_url.ssl_certfile", "no such file"),
    ("redis://h:1?ssl_cert_reqs=none", "storage_url.ssl_cert_reqs", "not TLS"),
    ("unix:///run/r.sock?ssl_ca_certs=/x", "storage_url.ssl_ca_certs", "not TLS"),
])
def test_bad_urls_are_config_errors(url, field, words):
    with pytest.raises(ConfigError) as ei:
        open_backend(url)
    assert ei.value.field == field
    assert words in str(ei.value)


def test_ipv6_and_loopback_defaults():
    assert open_backend("redis://[::1]:7000/1").node.endpoint == Endpoint("::1", 7000)
    assert open_backend("redis://[::1]").node.endpoint == Endpoint("::1", 6379)
    assert open_backend("redis://:7001").node.endpoint == Endpoint("127.0.0.1", 7001)
    assert open_backend("redis://h/3?db=4").node.opts.db == 4   # the option wins over the path


def test_mask_url():
    assert mask_url("redis://u:p@h:1/0") == "redis://u:***@h:1/0"
    assert mask_url("redis://p@h:1") == "redis://:***@h:1"
    assert mask_url("redis://h:1/0?password=x&db=1") == "redis://h:1/0?password=***&db=1"
    assert mask_url("memory://") == "memory://"
