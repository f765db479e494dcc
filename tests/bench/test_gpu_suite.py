"""bench/gpu: how the suite judges each step (from recorded outputs, so a step that exits 0
with a bad figure still fails), its markdown, its one-line errors, and one real step."""

from __future__ import annotations

import json
import os
import subprocess

import pytest

from bench.gpu import report, suite
from tests.conftest import ROOT

TRANSFER = {"layout": "deepseek-v4-flash", "bytes": 2**30, "device": "NVIDIA H100", "backend": "triton",
            "d2h_gbps": 45.0, "h2d_gbps": 48.0, "memcpy_d2h_gbps": 50.0, "memcpy_h2d_gbps": 52.0,
            "d2h_ratio": 0.9, "h2d_ratio": 0.923, "naive_d2h_gbps": 3.0, "naive_h2d_gbps": 3.5,
            "naive_d2h_ratio": 0.06, "naive_h2d_ratio": 0.067, "h2d_per_layer_gbps": 40.0,
            "h2d_per_layer_ratio": 0.77, "duplex_gbps": 80.0, "memcpy_duplex_gbps": 95.0,
            "duplex_ratio": 0.842, "verified": True}
OVERLAP = {"layout": "deepseek-v4-flash", "pages": 512, "layers": 41, "copy_s": 0.01, "compute_s": 0.011,
           "per_layer_s": 0.0125, "free_s": 0.0115, "hidden_per_layer": 0.85, "hidden_free": 0.95,
           "hidden_bound_per_layer": 0.976, "matmuls_per_layer": 3, "matmul": 4096, "copy_gbps": 48.0,
           "verified": True}
JUNIT = """<?xml version="1.0" encoding="utf-8"?><testsuites><testsuite name="pytest" tests="3">
<testcase classname="tests.transfer.test_device_kernels" name="test_a[cuda]" time="0.5"/>
<testcase classname="tests.transfer.test_device_kernels" name="test_b[cuda]" time="0.1">
<failure message="AssertionError: d2h scattered: c4_kv differs&#10;more">trace</failure></testcase>
<testcase classname="tests.pools.test_pinned" name="test_c[cuda]" time="0"><skipped message="needs a CUDA device"/></testcase>
</testsuite></testsuites>"""


def out(obj: dict) -> str:
    """What a command prints: progress lines may precede its one JSON object."""
    return "a progress line\n" + json.dumps(obj, indent=2) + "\n"


@pytest.mark.parametrize("kind, data, ok", [
    ("transfer", TRANSFER, True),
    ("transfer", {**TRANSFER, "verified": False}, False),
    ("overlap", OVERLAP, True),
    ("replay", {"requests": 9, "verified_pages": 120, "mismatched_pages": 0}, True),
    ("replay", {"requests": 9, "verified_pages": 120, "mismatched_pages": 1}, False),
    ("replay", {"requests": 9, "verified_pages": 0, "mismatched_pages": 0}, False),   # nothing checked
    ("replay_tiny", {"requests": 17, "exact": True, "mismatched_pages": 0, "max_logit_diff": 0.0}, True),
    ("replay_tiny", {"requests": 17, "exact": False, "mismatched_pages": 0, "max_logit_diff": 1e-12}, False),
    ("env", {"torch": "2.11.0", "gpu": "NVIDIA H100 80GB HBM3"}, True),
])
def test_a_step_passes_on_exit_0_and_what_its_output_says(kind, data, ok, tmp_path):
    got = report.judge(kind, 0, out(data), tmp_path / "none.xml")
    assert got["status"] == ("pass" if ok else "fail") and got["data"] == data and got["summary"]
    assert report.judge(kind, 1, out(data), tmp_path / "none.xml")["status"] == "fail"
    assert report.judge(kind, 0, "Traceback ...\n", tmp_path / "none.xml")["status"] == "fail"
    assert report.judge(kind, 124, out(data), tmp_path / "none.xml", "timeout")["status"] == "timeout"


def test_tests_step_reads_every_case_from_junit(tmp_path):
    junit = tmp_path / "t.xml"
    junit.write_text(JUNIT)
    got = report.judge("tests", 0, "", junit)
    assert got["status"] == "fail" and got["summary"] == "1 passed, 1 failed, 1 skipped"
    cases = {c["test"]: c for c in got["data"]["cases"]}
    bad = cases["tests.transfer.test_device_kernels::test_b[cuda]"]
    assert bad["outcome"] == "failed" and bad["message"] == "AssertionError: d2h scattered: c4_kv differs"
    junit.write_text(JUNIT.replace('<failure message="AssertionError: d2h scattered: c4_kv differs&#10;more">'
                                   'trace</failure>', ""))
    assert report.judge("tests", 0, "", junit)["status"] == "pass"
    assert report.judge("tests", 0, "", tmp_path / "missing.xml")["status"] == "fail"   # no test ran
    # Killed at its timeout, pytest writes no JUnit file: the -v lines still count.
    verbose = ("tests/a.py::test_x[cuda] PASSED                  [ 50%]\n"
               "tests/a.py::test_y[cuda] FAILED                  [100%]\n")
    got = report.judge("tests", 124, verbose, tmp_path / "missing.xml", "timeout")
    assert got["status"] == "timeout" and got["summary"] == "1 passed, 1 failed, 0 skipped"


def test_markdown_has_the_step_bandwidth_overlap_and_failed_test_tables(tmp_path):
    junit = tmp_path / "t.xml"
    junit.write_text(JUNIT)
    steps = {"env": report.judge("env", 0, out({"torch": "2.11", "gpu": "NVIDIA H100", "python": "3.12"}), junit),
             "tests": report.judge("tests", 1, "", junit),
             "transfer-v4-flash": report.judge("transfer", 0, out(TRANSFER), junit),
             "overlap": report.judge("overlap", 0, out(OVERLAP), junit)}
    for r in steps.values():
        r["seconds"] = 1.0
    md = report.markdown({"device": "cuda", "steps": steps, "passed": False, "seconds": 100, "budget_s": 470})
    assert md.startswith("## GPU suite: GPU run on NVIDIA H100")
    assert "| tests | fail | 1.0 | 1 passed, 1 failed, 1 skipped |" in md
    assert "| deepseek-v4-flash | 1,024 MiB | D2H | 45.00 | 50.00 | 0.90 | 3.00 | 0.06 |" in md
    assert "| deepseek-v4-flash | 1,024 MiB | both at once (sum) | 80.00 | 95.00 | 0.84 | | |" in md
    assert "(cudaMemcpyAsync, the DMA limit)" in md
    assert "| deepseek-v4-flash | one per chunk | 512 | 41 | 10.00 | 11.00 | 12.50 | 0.85 | 11.50 | 0.95 | 0.98 |" in md
    assert "- `tests.transfer.test_device_kernels::test_b[cuda]`: AssertionError" in md
    assert "All steps passed: **no**" in md


@pytest.mark.parametrize("argv, says", [
    ([], "give --out DIR (or set $OUT)"),
    (["--out", "{tmp}", "--steps", "env,nope"], "unknown ['nope']"),
    (["--out", "{tmp}", "--budget-s", "0"], "must be > 0"),
    (["--out", "{tmp}", "--device", "tpu"], "invalid choice: 'tpu'"),
])
def test_bad_input_is_one_line(argv, says, tmp_path):
    env = {k: v for k, v in os.environ.items() if k != "OUT"}
    r = subprocess.run(["bash", str(ROOT / "bench" / "gpu" / "run.sh"), *[a.format(tmp=tmp_path) for a in argv]],
                       capture_output=True, text=True, timeout=60, env=env)
    assert r.returncode == 2 and r.stdout == ""
    assert len(r.stderr.splitlines()) == 1 and says in r.stderr, r.stderr


def test_one_real_step_writes_json_markdown_and_log(tmp_path):
    r = subprocess.run(["bash", str(ROOT / "bench" / "gpu" / "run.sh"), "--device", "cpu", "--out", str(tmp_path),
                        "--steps", "env"], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stdout + r.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == ["gpu_suite.json", "gpu_suite.log", "gpu_suite.md"]
    data = json.loads((tmp_path / "gpu_suite.json").read_text())
    assert data["passed"] is True and list(data["steps"]) == ["env"]
    assert data["steps"]["env"]["data"]["python"] and data["device"] == "cpu"
    assert "| env | pass |" in (tmp_path / "gpu_suite.md").read_text()
    assert "===== env: exit 0" in (tmp_path / "gpu_suite.log").read_text()
    assert [s.name for s in suite.plan("cuda", tmp_path / "j.xml")] == [
        "env", "transfer-v4-flash", "transfer-llama-3.1-8b", "overlap", "overlap-bounded", "tests", "replay",
        "replay-tiny", "tune-copy"]
