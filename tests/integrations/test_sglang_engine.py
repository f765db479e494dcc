"""Runs ``tests/integrations/sglang_engine/`` (SGLang's own HiCache controller with hicache as
its L3) under the SGLang venv, as one subprocess of the main test run.

SGLang pins its own torch and a long import chain, so it lives in a venv of its own, built
by ``.ci/run`` with ``../shared/tools/setup_sglang_venv.sh``. The venv is found at
``$HICACHE_SGLANG_VENV``, else ``../venvs/sglang`` beside the checkout; without one these
tests skip and say how to build it. The subprocess imports this checkout (``PYTHONPATH``),
whatever the venv has installed.
"""

from __future__ import annotations

import os
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from tests.redis_server import REDIS_SERVER

ROOT = Path(__file__).resolve().parents[2]
INNER = "tests/integrations/sglang_engine"
NEEDED = ("sglang", "pytest", "hypothesis", "xxhash", "yaml", "psutil", "torch")


def sglang_venv() -> Path:
    return Path(os.environ.get("HICACHE_SGLANG_VENV") or ROOT.parent / "venvs" / "sglang")


@pytest.fixture(scope="module")
def venv_python() -> Path:
    venv = sglang_venv()
    py = venv / "bin" / "python"
    if not py.exists():
        pytest.skip(f"no SGLang venv at {venv}: build it with ../shared/tools/setup_sglang_venv.sh {venv} "
                    f"plus `{venv}/bin/pip install xxhash pyyaml psutil pytest hypothesis` (.ci/run does both), "
                    "or point HICACHE_SGLANG_VENV at one")
    probe = subprocess.run([str(py), "-c", f"import importlib.util as u, sys; "
                            f"missing = [m for m in {NEEDED!r} if u.find_spec(m) is None]; "
                            f"sys.exit(','.join(missing) if missing else 0)"],
                           capture_output=True, text=True, timeout=120)
    assert probe.returncode == 0, (f"the SGLang venv at {venv} lacks {probe.stderr.strip()}: "
                                   f"{venv}/bin/pip install xxhash pyyaml psutil pytest hypothesis")
    return py


def test_sglang_controller_suite_under_the_sglang_venv(venv_python, tmp_path):
    report = tmp_path / "sglang.xml"
    env = {**os.environ, "PYTHONPATH": str(ROOT), "HICACHE_SGLANG_INNER": "1"}
    proc = subprocess.run([str(venv_python), "-m", "pytest", INNER, "-q", "-rs", "-p", "no:cacheprovider",
                           "-W", "ignore::UserWarning", "-W", "ignore::DeprecationWarning",
                           f"--junitxml={report}"],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=1200)
    out = (proc.stdout + proc.stderr)[-6000:]
    print(out)
    assert proc.returncode == 0, f"SGLang engine tests failed (exit {proc.returncode}):\n{out}"
    suite = ET.parse(report).getroot()
    suite = suite if suite.tag == "testsuite" else suite.find("testsuite")
    counts = {k: int(suite.get(k, 0)) for k in ("tests", "failures", "errors", "skipped")}
    assert counts["tests"] >= 20 and counts["failures"] == counts["errors"] == 0, counts
    if REDIS_SERVER is not None:  # with redis-server installed nothing may be skipped
        assert counts["skipped"] == 0, f"skipped inside the SGLang venv:\n{out}"
    sys.stdout.write(f"SGLang engine tests: {counts}\n")
