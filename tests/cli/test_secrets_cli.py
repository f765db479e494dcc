"""No command prints a storage password: summaries, ``--json``, bench output, progress, errors."""

from __future__ import annotations

import json
import logging

import pytest

from hicache.cli.main import main
from tests.conftest import CONFIGS
from tests.redis_server import REDIS_SERVER, SKIP_REASON, RedisServer

SECRET = "hunter2"
PASSWORD = f"p/w?x#y@{SECRET}"      # every character that could end the user part early


@pytest.fixture(scope="module")
def locked_redis():
    if REDIS_SERVER is None:
        pytest.skip(SKIP_REASON)
    server = RedisServer("--requirepass", PASSWORD)
    yield server
    server.close()


def url(server) -> str:
    return f"redis://default:{PASSWORD}@127.0.0.1:{server.port}/0?connect_timeout=5"


def run(capsys, caplog, argv) -> tuple[int, str]:
    caplog.set_level(logging.DEBUG)
    rc = main(argv)
    out = capsys.readouterr()
    text = out.out + out.err + caplog.text
    assert SECRET not in text, text[-2000:]
    return rc, out.out


@pytest.mark.parametrize("as_json", [True, False])
def test_replay_masks_the_url(capsys, caplog, locked_redis, as_json):
    argv = ["replay", "--config", str(CONFIGS / "tiny-hybrid.yaml"), "--conversations", "3",
            "--storage", url(locked_redis)] + (["--json"] if as_json else [])
    rc, out = run(capsys, caplog, argv)
    assert rc == 0
    if as_json:
        s = json.loads(out)
        assert s["storage_url"] == f"redis://default:***@127.0.0.1:{locked_redis.port}/0?connect_timeout=5"
        assert s["l3_put_objects"] > 0 and s["l3_errors"] == 0     # it authenticated and stored pages


@pytest.mark.parametrize("as_json", [True, False])
def test_tiny_replay_masks_the_url(capsys, caplog, locked_redis, as_json):
    rc, out = run(capsys, caplog, ["replay", "--model", "tiny", "--conversations", "1", "--storage", url(locked_redis)]
                  + (["--json"] if as_json else []))
    assert rc == 0 and "default:***@" in out


@pytest.mark.parametrize("as_json", [True, False])
def test_bench_storage_masks_the_url(capsys, caplog, locked_redis, as_json):
    rc, out = run(capsys, caplog, ["bench", "storage", "--url", url(locked_redis), "--objects", "2", "--rounds", "1",
                                   "--object-mib", "0.01"] + (["--json"] if as_json else []))
    assert rc == 0 and "default:***@" in out


@pytest.mark.parametrize("argv", [
    ["bench", "storage", "--url", f"redis://:{PASSWORD}@127.0.0.1:1/0?connect_timeout=0.2", "--objects", "1",
     "--rounds", "1", "--object-mib", "0.01"],                             # unreachable: the error names the URL
    ["replay", "--storage", f"redis://u:{PASSWORD}@h:99999/0"],
    ["replay", "--storage", f"redis://h:1/0?pasword={SECRET}"],
    ["replay", "--storage", f"redis://h:1/0?timeout={SECRET}"],
    ["replay", "--storage", f"u:{PASSWORD}@h:6379"],
    ["stress", "--config", str(CONFIGS / "tiny-hybrid.yaml"), "--seed", "-1"],  # unrelated error: nothing to leak
])
def test_errors_mask_the_url(capsys, caplog, argv):
    rc, _ = run(capsys, caplog, argv)
    assert rc == 2
