"""``hicache bench transfer``: runs end to end on a tiny layout, verifies bytes, JSON keys."""

from __future__ import annotations

import json

import pytest

from hicache.cli.main import main

KEYS = {"memcpy_gbps", "naive_gbps", "d2h_gbps", "h2d_gbps", "d2h_ratio", "h2d_ratio", "verified", "device"}


def test_bench_transfer_json(capsys):
    rc = main(["bench", "transfer", "--config", "tiny-hybrid", "--pages", "48", "--reps", "1", "--json"])
    out, err = capsys.readouterr()
    assert rc == 0
    data = json.loads(out)
    assert KEYS <= data.keys()
    assert data["verified"] is True and data["device"] == "cpu"
    assert (data["pages"], data["snapshots"]) == (48, 3)
    assert data["bytes"] == 48 * 384 + 3 * 1776            # tiny-hybrid object sizes
    assert data["d2h_ratio"] == pytest.approx(data["d2h_gbps"] / data["memcpy_gbps"])
    assert data["h2d_ratio"] == pytest.approx(data["h2d_gbps"] / data["memcpy_gbps"])
    assert data["naive_gbps"] == max(data["naive_d2h_gbps"], data["naive_h2d_gbps"])
    assert data["load_granularity"] == "batch"
    assert "round 1/1" in err and "verified: True" in err   # progress goes to stderr


def test_bench_transfer_duplex_moves_both_directions_at_once(capsys):
    rc = main(["bench", "transfer", "--config", "tiny-hybrid", "--pages", "24", "--reps", "1", "--duplex", "--json"])
    out, err = capsys.readouterr()
    assert rc == 0 and "both at once verified: True" in err
    data = json.loads(out)
    assert data["verified"] is True and data["duplex_gbps"] > 0
    # CPU: one memory bus, so the limit of both at once is the two memcpys one after the other
    assert data["memcpy_duplex_gbps"] == pytest.approx(data["memcpy_gbps"])
    assert data["duplex_ratio"] == pytest.approx(data["duplex_gbps"] / data["memcpy_duplex_gbps"])
    for d in ("d2h", "h2d"):
        assert data[f"naive_{d}_ratio"] == pytest.approx(data[f"naive_{d}_gbps"] / data["memcpy_gbps"])
    rc = main(["bench", "transfer", "--config", "tiny-mha", "--pages", "8", "--reps", "1", "--duplex"])
    out, _ = capsys.readouterr()
    assert rc == 0 and "both at once" in out and "every byte matched" in out


def test_bench_transfer_table_layer_first(capsys):
    rc = main(["bench", "transfer", "--config", "tiny-mha", "--pages", "16", "--reps", "1",
               "--host-layout", "layer_first"])
    out, _ = capsys.readouterr()
    assert rc == 0
    assert "hicache batched" in out and "every byte matched" in out and "layer_first" in out


@pytest.mark.parametrize("argv, message", [
    (["--pages", "0"], "--pages=0: must be >= 1"),
    (["--pages", "100000000"], "host memory"),
    (["--backend", "gpu"], "transfer.backend='gpu'"),
    (["--config", "no-such-model"], "no such file"),
])
def test_bench_transfer_bad_input_is_one_line(capsys, argv, message):
    rc = main(["bench", "transfer", "--config", "tiny-hybrid", *argv])
    _, err = capsys.readouterr()
    assert rc == 2
    lines = [l for l in err.splitlines() if not l.startswith("[bench transfer")]
    assert len(lines) == 1 and lines[0].startswith("hicache bench: error:") and message in lines[0]
