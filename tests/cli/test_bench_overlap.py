"""``hicache bench overlap``: runs end to end on the CPU, checks every layer as it lands,
reports the hidden share of the copy in [0, 1]; bad input is one line."""

from __future__ import annotations

import json

import pytest

from hicache.cli.main import main


def test_bench_overlap_json(capsys):
    rc = main(["bench", "overlap", "--config", "tiny-hybrid", "--pages", "32", "--reps", "1", "--matmul", "32",
               "--json"])
    out, err = capsys.readouterr()
    assert rc == 0 and "per-layer landing verified: True" in err
    d = json.loads(out)
    assert d["verified"] is True and d["device"] == "cpu" and d["pages"] == 32
    assert d["layers"] == 4                           # tiny-hybrid's page families: layers 2-5
    assert d["bytes"] == 32 * 384 and d["matmuls_per_layer"] >= 1
    for k in ("hidden_per_layer", "hidden_free"):
        assert 0.0 <= d[k] <= 1.0
    assert d["hidden_bound_per_layer"] == pytest.approx(0.75)
    for k in ("copy_s", "compute_s", "per_layer_s", "free_s"):
        assert d[k] > 0


def test_bench_overlap_table(capsys):
    rc = main(["bench", "overlap", "--config", "tiny-mha", "--pages", "8", "--reps", "1", "--matmul", "16",
               "--host-layout", "layer_first"])
    out, _ = capsys.readouterr()
    assert rc == 0 and "wait_layer(l), then layer l's compute" in out and "layer_first" in out
    assert "every layer landed before its wait returned" in out


@pytest.mark.parametrize("argv, message", [
    (["--pages", "0"], "--pages=0: must be >= 1"),
    (["--matmul", "0"], "--matmul=0: must be >= 1"),
    (["--pages", "100000000"], "host memory"),
    (["--backend", "gpu"], "transfer.backend='gpu'"),
])
def test_bench_overlap_bad_input_is_one_line(capsys, argv, message):
    rc = main(["bench", "overlap", "--config", "tiny-hybrid", *argv])
    _, err = capsys.readouterr()
    assert rc == 2
    lines = [l for l in err.splitlines() if not l.startswith("[bench overlap")]
    assert len(lines) == 1 and lines[0].startswith("hicache bench: error:") and message in lines[0], lines
