"""``python -m hicache.engine.workloads``: JSON, the table, a written trace, one-line errors."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from hicache.engine.workloads import load_trace, summarize, synthetic
from hicache.engine.workloads.__main__ import main

ROOT = Path(__file__).resolve().parents[3]


def test_json_and_written_trace(capsys, tmp_path):
    out_path = tmp_path / "w.jsonl"
    assert main(["synthetic", "--conversations", "7", "--seed", "2", "--write-trace", str(out_path),
                 "--block-size", "128", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    expected = summarize(synthetic(7, 2)).as_dict()
    assert out["workload"] == "synthetic" and out["stats"] == expected
    assert out["trace_written"]["records"] == expected["requests"]
    assert out["trace_written"]["block_size"] == 128
    assert len(load_trace(out_path)) == expected["requests"]
    assert main(["trace", "--trace", str(out_path)]) == 0
    table = capsys.readouterr().out
    assert "workload trace" in table and "reusable_tokens" in table


def test_bad_input_is_one_line_exit_2(tmp_path):
    for argv in (["trace"], ["trace", "--trace", str(tmp_path / "nope.jsonl")],
                 ["synthetic", "--conversations", "0"]):
        proc = subprocess.run([sys.executable, "-m", "hicache.engine.workloads", *argv], cwd=ROOT,
                              capture_output=True, text=True)
        assert proc.returncode == 2
        errors = [line for line in proc.stderr.splitlines() if "error:" in line]
        assert len(errors) == 1 and "Traceback" not in proc.stderr, proc.stderr
