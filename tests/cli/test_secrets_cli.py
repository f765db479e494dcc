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


def test_sweep_json_masks_the_storage_field(capsys, caplog, locked_redis):
    """``sweep --json`` printed the password in its ``storage`` field (issue 29)."""
    rc, out = run(capsys, caplog, ["sweep", "--config", str(CONFIGS / "tiny-hybrid.yaml"), "--conversations", "2",
                                   "--device-gib", "0.01", "--host-gib", "0.01", "--storage", url(locked_redis),
                                   "--json", "--no-sim", "--quiet"])
    assert rc == 0 and json.loads(out)["storage"].startswith("redis://default:***@127.0.0.1:")


def test_a_password_option_is_masked():
    from hicache.storage import mask_url

    assert mask_url(f"redis://h:1/0?db=1&password={SECRET}") == "redis://h:1/0?db=1&password=***"


# A redis-benchmark stand-in: logs its command line and REDISCLI_AUTH (the name split in two,
# so only the marker line says whether the binary "reads" it), prints SET/GET in CSV.
FAKE_BENCHMARK = """#!/bin/sh
# {marker}
echo "$@" > "{log}/argv"
printf '%s' "$(printenv REDISCLI_""AUTH)" > "{log}/env"
echo '"SET","1000.0"'
echo '"GET","1000.0"'
"""


@pytest.mark.parametrize("reads_env", [True, False])
def test_redis_benchmark_never_gets_the_password_on_its_command_line(capsys, caplog, locked_redis, tmp_path,
                                                                    monkeypatch, reads_env):
    """``ps`` shows every local user a command line: the password goes in REDISCLI_AUTH where
    redis-benchmark reads it, and where it does not (7.0-7.4), no limit is measured."""
    import os

    exe = tmp_path / "redis-benchmark"
    exe.write_text(FAKE_BENCHMARK.format(marker="REDISCLI_AUTH" if reads_env else "no env", log=tmp_path))
    exe.chmod(0o755)
    monkeypatch.setenv("PATH", f"{tmp_path}{os.pathsep}{os.environ['PATH']}")
    rc, out = run(capsys, caplog, ["bench", "storage", "--url", url(locked_redis), "--objects", "2", "--rounds", "1",
                                   "--object-mib", "0.01", "--json"])
    assert rc == 0
    if reads_env:
        assert SECRET not in (tmp_path / "argv").read_text() and "-a" not in (tmp_path / "argv").read_text().split()
        assert (tmp_path / "env").read_text() == PASSWORD
        assert json.loads(out)["limit_get_gbps"] is not None
    else:
        assert not (tmp_path / "argv").exists(), "not run at all"
        assert json.loads(out)["limit_get_gbps"] is None
