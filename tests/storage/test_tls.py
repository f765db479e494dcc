"""``rediss://`` verifies the server: its certificate must chain to the CA *and* name the host.

A test CA (made here with openssl) signs two server certificates: one for ``localhost`` and
one for another name. Each is served by a real ``redis-server`` with TLS on a loopback port.
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

from hicache.errors import ConfigError
from hicache.storage import open_backend
from hicache.storage.faults import StorageConnectionError
from tests.redis_server import REDIS_SERVER, SKIP_REASON, RedisServer

needs_tls = pytest.mark.skipif(REDIS_SERVER is None or shutil.which("openssl") is None,
                               reason=SKIP_REASON if REDIS_SERVER is None else "openssl is not installed")
KEY = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes"]


def _openssl(*args: str, cwd: Path) -> None:
    subprocess.run(["openssl", *args], cwd=cwd, check=True, capture_output=True, timeout=60)


def make_ca(d: Path) -> Path:
    _openssl("req", "-x509", *KEY, "-keyout", "ca.key", "-out", "ca.pem", "-days", "1",
             "-subj", "/CN=hicache test CA", "-addext", "basicConstraints=critical,CA:TRUE",
             "-addext", "keyUsage=critical,keyCertSign,cRLSign", cwd=d)
    return d / "ca.pem"


def make_server_cert(d: Path, name: str, san: str) -> tuple[str, str]:
    """A server certificate for ``name`` (subjectAltName ``san``) signed by the CA in ``d``."""
    (d / f"{name}.ext").write_text(f"subjectAltName={san}\nbasicConstraints=CA:FALSE\n"
                                   "keyUsage=critical,digitalSignature\nextendedKeyUsage=serverAuth\n"
                                   "subjectKeyIdentifier=hash\nauthorityKeyIdentifier=keyid,issuer\n")
    _openssl("req", "-new", *KEY, "-keyout", f"{name}.key", "-out", f"{name}.csr", "-subj", f"/CN={name}", cwd=d)
    _openssl("x509", "-req", "-in", f"{name}.csr", "-CA", "ca.pem", "-CAkey", "ca.key", "-CAcreateserial",
             "-out", f"{name}.pem", "-days", "1", "-extfile", f"{name}.ext", cwd=d)
    return str(d / f"{name}.pem"), str(d / f"{name}.key")


@pytest.fixture(scope="module")
def tls_servers(tmp_path_factory):
    """(CA file, server whose certificate names localhost, server whose certificate names another host)."""
    d = tmp_path_factory.mktemp("tls")
    ca = make_ca(d)
    right = RedisServer(tls_files=make_server_cert(d, "localhost", "DNS:localhost"))
    try:
        wrong = RedisServer(tls_files=make_server_cert(d, "other.example", "DNS:other.example"))
    except BaseException:
        right.close()
        raise
    yield ca, right, wrong
    right.close()
    wrong.close()


def _roundtrip(url: str) -> None:
    b = open_backend(url)
    try:
        assert b.put(["hc:tls"], [b"value"]) == [True]
        assert b.exists(["hc:tls", "hc:none"]) == [True, False]
    finally:
        b.close()


@needs_tls
def test_wrong_name_certificate_is_refused(tls_servers):
    ca, _, wrong = tls_servers
    b = open_backend(f"rediss://localhost:{wrong.port}/0?ssl_ca_certs={ca}&connect_timeout=5")
    assert b.node.opts.ssl_check_hostname is True
    try:
        with pytest.raises(StorageConnectionError, match="(?i)hostname mismatch"):
            b.exists(["hc:tls"])
    finally:
        b.close()


@needs_tls
def test_redis_py_refuses_the_same_server(tls_servers):
    redis = pytest.importorskip("redis")
    ca, _, wrong = tls_servers
    client = redis.Redis(host="localhost", port=wrong.port, ssl=True, ssl_ca_certs=str(ca), socket_timeout=5)
    with pytest.raises(redis.ConnectionError, match="(?i)hostname mismatch"):
        client.ping()


@needs_tls
def test_right_name_certificate_connects(tls_servers):
    ca, right, _ = tls_servers
    _roundtrip(f"rediss://localhost:{right.port}/0?ssl_ca_certs={ca}&connect_timeout=5")


@needs_tls
def test_hostname_check_can_be_turned_off_explicitly(tls_servers):
    ca, _, wrong = tls_servers
    _roundtrip(f"rediss://localhost:{wrong.port}/0?ssl_ca_certs={ca}&ssl_check_hostname=0&connect_timeout=5")


@needs_tls
def test_untrusted_ca_is_refused_even_without_hostname_check(tls_servers, tmp_path):
    _, right, _ = tls_servers
    other_ca = make_ca(tmp_path)
    b = open_backend(f"rediss://localhost:{right.port}/0?ssl_ca_certs={other_ca}&ssl_check_hostname=0"
                     "&connect_timeout=5")
    try:
        with pytest.raises(StorageConnectionError, match="(?i)certificate verify failed"):
            b.exists(["hc:tls"])
    finally:
        b.close()


def test_hostname_check_follows_certificate_checks():
    assert open_backend("rediss://h:1").node.opts.ssl_check_hostname is True
    assert open_backend("rediss+cluster://h:1").opts.ssl_check_hostname is True
    assert open_backend("rediss://h:1?ssl_check_hostname=0").node.opts.ssl_check_hostname is False
    assert open_backend("rediss://h:1?ssl_cert_reqs=none").node.opts.ssl_check_hostname is False


def test_unreadable_ca_file_is_a_config_error(tmp_path):
    bad = tmp_path / "ca.pem"
    bad.write_text("not a certificate\n")
    with pytest.raises(ConfigError) as ei:
        open_backend(f"rediss://h:1?ssl_ca_certs={bad}")
    assert ei.value.field == "storage_url.ssl_ca_certs" and "cannot load" in str(ei.value)
