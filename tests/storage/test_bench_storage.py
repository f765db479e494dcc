"""``hicache bench storage``: JSON keys, verification, and one-line errors (no timings asserted)."""

from __future__ import annotations

import json

import pytest

from hicache.cli.main import main
from tests.redis_server import REDIS_SERVER

KEYS = {"put_gbps", "get_gbps", "limit_put_gbps", "limit_get_gbps", "redis_py_get_gbps", "put_ratio",
        "get_ratio", "verified"}


def run_json(capsys, *argv):
    rc = main(["bench", "storage", *argv, "--json"])
    out = json.loads(capsys.readouterr().out)
    return rc, out


def test_memory_bench_json(capsys):
    rc, out = run_json(capsys, "--url", "memory://", "--object-mib", "0.0625", "--objects", "8", "--rounds", "1")
    assert rc == 0 and KEYS <= set(out)
    assert out["verified"] is True and out["objects"] == 8 and out["object_bytes"] == 65536
    assert out["put_gbps"] > 0 and out["limit_get_gbps"] > 0 and out["redis_py_get_gbps"] is None
    assert out["get_ratio"] == pytest.approx(out["get_gbps"] / out["limit_get_gbps"])


def test_file_bench_table(capsys, tmp_path):
    rc = main(["bench", "storage", "--url", f"file://{tmp_path}", "--object-mib", "0.03125", "--objects", "4",
               "--rounds", "1"])
    text = capsys.readouterr().out
    assert rc == 0 and "ratio ours / limit" in text and "verified: yes" in text
    assert [p.name for p in tmp_path.rglob("*") if p.is_file()] == []   # cleaned up


@pytest.mark.redis
@pytest.mark.skipif(REDIS_SERVER is None, reason="redis-server is not installed")
def test_redis_bench_json(capsys, redis_server):
    rc, out = run_json(capsys, "--url", redis_server.url, "--object-mib", "0.25", "--objects", "8",
                       "--rounds", "1")
    assert rc == 0 and out["verified"] is True
    for k in ("limit_put_gbps", "limit_get_gbps", "redis_py_get_gbps", "put_ratio", "get_ratio", "lookup_us",
              "redis_py_lookup_us"):
        assert out[k] > 0, k
    assert redis_server.cli("DBSIZE") == "0"          # our keys and redis-benchmark's are gone


@pytest.mark.parametrize("argv, words", [
    (["--url", "nope://x"], "unknown scheme"),
    (["--url", "memory://", "--object-mib", "0"], "--object-mib"),
    (["--url", "memory://", "--objects", "0"], "--objects"),
])
def test_bad_input_is_one_line(capsys, argv, words):
    assert main(["bench", "storage", *argv]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("hicache bench: error:") and words in err[0]


def test_unreachable_server_is_a_clear_error_not_a_hang(capsys):
    import socket

    with socket.socket() as s:  # a loopback port nobody listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    assert main(["bench", "storage", "--url", f"redis://127.0.0.1:{port}/0", "--objects", "2",
                 "--object-mib", "0.0625"]) == 2
    last = capsys.readouterr().err.strip().splitlines()[-1]
    assert last.startswith("hicache bench: error:") and "cannot reach the store" in last


def test_mac_is_timed_beside_the_plain_objects(capsys):
    rc, out = run_json(capsys, "--url", "memory://", "--object-mib", "0.0625", "--objects", "4", "--rounds", "1",
                       "--mac")
    assert rc == 0 and out["verified"] and out["mac_put_gbps"] > 0 and out["mac_get_gbps"] > 0
    assert 0 < out["mac_get_ratio"] and len(out["samples"]["mac_get"]) == 1
