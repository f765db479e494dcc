"""Runs ``tests/integrations/vllm_engine/`` (vLLM's own tiering manager, primary tier and tier
factory driving hicache as a secondary tier; ``HiCacheConnector`` in vLLM's CPU engine serving
a tiny Llama) under the vLLM venv, as one subprocess of the main test run.

vLLM's import chain is long, so it lives in a venv of its own, built by ``.ci/run`` with
``.ci/setup_vllm_venv.sh`` (it shares this machine's torch through the system
site-packages). The venv is found at ``$HICACHE_VLLM_VENV``, else ``../venvs/vllm`` beside
the checkout; without one these tests skip and say how to build it -- unless
``HICACHE_VLLM_VENV`` is set (CI sets it): then a missing venv fails. The subprocess imports
this checkout (``PYTHONPATH``), whatever the venv can see installed.
"""

from __future__ import annotations

import os
import subprocess
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from tests.redis_server import REDIS_SERVER

ROOT = Path(__file__).resolve().parents[2]
INNER = "tests/integrations/vllm_engine"


def vllm_venv() -> Path:
    return Path(os.environ.get("HICACHE_VLLM_VENV") or ROOT.parent / "venvs" / "vllm")


@pytest.fixture(scope="module")
def venv_python() -> Path:
    venv = vllm_venv()
    py = venv / "bin" / "python"
    if not py.exists():
        if os.environ.get("HICACHE_VLLM_VENV"):
            pytest.fail(f"HICACHE_VLLM_VENV={venv} has no bin/python: build it with "
                        f"`bash .ci/setup_vllm_venv.sh {venv}`")
        pytest.skip(f"no vLLM venv at {venv}: build it with `bash .ci/setup_vllm_venv.sh {venv}` "
                    "(.ci/run does), or point HICACHE_VLLM_VENV at one")
    return py


def test_vllm_tier_suite_under_the_vllm_venv(venv_python, tmp_path):
    report = tmp_path / "vllm.xml"
    env = {**os.environ, "PYTHONPATH": str(ROOT), "HICACHE_VLLM_INNER": "1"}
    proc = subprocess.run([str(venv_python), "-m", "pytest", INNER, "-q", "-p", "no:cacheprovider",
                           f"--junitxml={report}"], cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=900)
    tail = (proc.stdout + proc.stderr)[-6000:]
    assert proc.returncode == 0, f"the vLLM tier suite failed:\n{tail}"
    suite = ET.parse(report).getroot()
    suite = suite if suite.tag == "testsuite" else suite.find("testsuite")
    counts = {k: int(suite.get(k, 0)) for k in ("tests", "failures", "errors", "skipped")}
    assert counts["failures"] == counts["errors"] == 0, tail
    # Every tier scenario runs against memory:// and a redis-server; none may be skipped here
    # when redis-server is installed (CI installs it). 19 tier tests, 6 connector engine tests,
    # 2 sliding-window (hybrid manager) engine tests, 7 window-rule checks against vLLM's
    # code, 2 offloading-connector engine tests, the DeepSeek-V4 probe, 3 DeepSeek-V4
    # connector tests (the groups and copies on vLLM's caches; layers without vLLM's
    # per-layer hooks, on the window Llama; the identical-output test).
    assert counts["tests"] >= 40, counts
    if REDIS_SERVER is not None:   # only DeepSeek-V4 forwards may skip: they need vLLM's AVX-512 CPU ops
        skipped = [c.get("classname", "") + "." + c.get("name", "") for c in suite.iter("testcase")
                   if c.find("skipped") is not None]
        may_skip = ("test_v4_cpu.", "test_v4_connector.test_v4_identical_outputs")
        assert all(any(m in s for m in may_skip) for s in skipped), f"vLLM tier tests skipped: {skipped}\n{tail}"
