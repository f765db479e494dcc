"""``hicache l3 stats|scan|purge`` against file://, a redis-server and the 3-node cluster."""

from __future__ import annotations

import io
import json

import pytest

from hicache.cli.main import main
from hicache.storage import L3Store, open_backend
from tests.redis_server import REDIS_SERVER, SKIP_REASON, RedisServer
from tests.storage.conftest import page_hashes, redis_cluster, rows  # noqa: F401 (fixture)

FP = "c1ab0123"


@pytest.fixture(params=["file", "redis", "cluster"])
def store_url(request, tmp_path):
    if request.param == "file":
        (tmp_path / "l3").mkdir()
        yield f"file://{tmp_path}/l3"
        return
    if REDIS_SERVER is None:
        pytest.skip(SKIP_REASON)
    request.applymarker(pytest.mark.redis)
    if request.param == "cluster":
        cluster = request.getfixturevalue("redis_cluster")
        yield cluster.url
        for node in cluster.nodes:
            node.cli("FLUSHALL")
        return
    server = RedisServer()
    try:
        assert server.cli("CONFIG", "SET", "requirepass", "pw-sekret") == "OK"
        yield f"redis://:pw-sekret@127.0.0.1:{server.port}/3"
    finally:
        server.close()


def _l3(capsys, *argv: str) -> tuple[int, str, str]:
    code = main(["l3", *argv])
    out, err = capsys.readouterr()
    return code, out, err


def _fill(url: str, salt: str, pages: int, states: int) -> str:
    s = L3Store(open_backend(url), FP, salt)
    hs = page_hashes(pages, seed=salt)
    assert all(s.put(hs, "page", list(rows(pages, 5000))))
    assert all(s.put(hs[-states:], "state", list(rows(states, 700))))
    s.close()
    return s.namespace


def test_stats_scan_purge(store_url, capsys, monkeypatch):
    a, b = _fill(store_url, "model-a", 40, 3), _fill(store_url, "model-b", 25, 1)
    code, out, _ = _l3(capsys, "stats", "--url", store_url, "--json")
    got = json.loads(out)
    assert code == 0
    assert [(n["namespace"], n["pages"], n["states"], n["bytes"]) for n in got["namespaces"]] == sorted(
        [(a, 40, 3, 40 * 5064 + 3 * 764), (b, 25, 1, 25 * 5064 + 764)])
    assert got["layouts"] == [{"fingerprint": FP, "namespaces": 2, "objects": 69,
                               "bytes": 65 * 5064 + 4 * 764}]
    assert "pw-sekret" not in out
    code, out, _ = _l3(capsys, "stats", "--url", store_url, "--namespace", b)
    assert code == 0 and b in out and a not in out and "26 objects" in out

    code, out, _ = _l3(capsys, "scan", "--url", store_url, "--sample", "500", "--json")
    assert code == 0 and json.loads(out)["verdicts"] == {"ok": 69}
    # Damage one object of b behind the store's back: a scan of b finds exactly it.
    backend = open_backend(store_url)
    key = L3Store(backend, FP, "model-b").key(page_hashes(25, seed="model-b")[7], "page")
    buf = bytearray(5064)
    assert backend.get_into([key], [buf]) == [5064]
    buf[-1] ^= 0xFF
    assert backend.put([key], [bytes(buf)]) == [True]
    code, out, _ = _l3(capsys, "scan", "--url", store_url, "--namespace", b, "--sample", "100", "--json")
    got = json.loads(out)
    assert code == 1 and got["verdicts"] == {"corrupt": 1, "ok": 25}
    assert got["failures"] == [{"key": key, "verdict": "corrupt"}]

    monkeypatch.setattr("sys.stdin", io.StringIO(""))   # not a terminal: --yes is required
    code, _, err = _l3(capsys, "purge", "--url", store_url, "--namespace", b)
    assert code == 2 and err.count("\n") == 1 and "--yes" in err

    class Tty(io.StringIO):
        def isatty(self):
            return True

    monkeypatch.setattr("sys.stdin", Tty("n\n"))
    code, out, err = _l3(capsys, "purge", "--url", store_url, "--namespace", b)
    assert code == 1 and "nothing deleted" in err and "26 objects" in out
    monkeypatch.setattr("sys.stdin", Tty("y\n"))
    code, out, _ = _l3(capsys, "purge", "--url", store_url, "--namespace", b)
    assert code == 0 and "removed 26 of 26" in out and "pw-sekret" not in out
    code, out, _ = _l3(capsys, "stats", "--url", store_url, "--json")
    assert [n["namespace"] for n in json.loads(out)["namespaces"]] == [a]
    code, out, _ = _l3(capsys, "purge", "--url", store_url, "--namespace", a, "--yes", "--json")
    assert json.loads(out)["removed"] == 43
    backend.close()


@pytest.mark.parametrize("argv, field", [
    (["stats", "--url", "redis://:pw-sekret@127.0.0.1:1/0?bogus=1"], "--url"),
    (["stats", "--url", "redis:pw-sekret@127.0.0.1"], "--url"),
    (["stats", "--url", "file:///no/such/dir/anywhere"], "--url"),
    (["scan", "--url", "memory://", "--namespace", "hc1.x"], "--namespace"),
    (["scan", "--url", "memory://", "--sample", "0"], "--sample"),
])
def test_bad_input_is_one_line_exit_2_and_never_shows_the_password(capsys, argv, field):
    code, out, err = _l3(capsys, *argv)
    assert code == 2 and out == ""
    assert err.count("\n") == 1 and field in err and "pw-sekret" not in err


def test_unreachable_server_is_one_line_without_the_password(capsys):
    from tests.redis_server import free_port

    code, out, err = _l3(capsys, "stats", "--url", f"redis://u:pw-sekret@127.0.0.1:{free_port()}/0?connect_timeout=0.2")
    assert code == 2 and err.count("\n") == 1 and "pw-sekret" not in err


def test_scan_verifies_macs_with_the_key(tmp_path, capsys, monkeypatch):
    from hicache.storage import ObjectKeys

    key = "s" * 48
    monkeypatch.setenv("SCAN_KEYS", key)
    url = f"file://{tmp_path}/l3"
    signed = L3Store(open_backend(url), "scanfp", "salt", keys=ObjectKeys.load("env:SCAN_KEYS"))
    hs = page_hashes(6, "scan-mac")
    assert all(signed.put(hs, "page", list(rows(6, 256))))
    planted = L3Store(open_backend(url), "scanfp", "salt")            # a writer without the key
    assert planted.put(hs[:2], "page", list(rows(2, 256, seed=5))) == [True, True]
    code, out, _ = _l3(capsys, "scan", "--url", url, "--sample", "100", "--auth-key", "env:SCAN_KEYS", "--json")
    report = json.loads(out)
    assert code == 1 and report["verdicts"] == {"ok": 4, "unauthenticated": 2} and key not in out
    # without the key: the signed objects are not judged (not failed), the plain ones are
    code, out, _ = _l3(capsys, "scan", "--url", url, "--sample", "100")
    assert code == 0 and "4 authenticated objects not checked: pass --auth-key" in out
    code, out, _ = _l3(capsys, "scan", "--url", url, "--sample", "100", "--json")
    assert json.loads(out)["verdicts"] == {"mac_not_checked": 4, "ok": 2}
    code, out, err = _l3(capsys, "scan", "--url", url, "--auth-key", "env:NOT_SET_ANYWHERE")
    assert code == 2 and "NOT_SET_ANYWHERE" in err and "Traceback" not in err and len(err.strip().splitlines()) == 1
    code, out, err = _l3(capsys, "scan", "--url", url, "--auth-key", key)             # a key pasted
    assert code == 2 and key not in err and key not in out
