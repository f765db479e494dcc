from __future__ import annotations

from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[1]
CONFIGS = ROOT / "configs"
FIXTURES = Path(__file__).resolve().parent / "fixtures"

# The two halves of a test that takes the ``device`` fixture. The CUDA half is marked
# ``gpu`` (``pytest -m gpu`` is what bench/gpu/run.sh runs on a GPU machine) and skipped
# without CUDA; the CPU half, marked ``cpu_half``, runs everywhere (the suite's CPU dry run
# selects it with ``-m cpu_half``), so the same assertions hold in CI before any GPU comes.
DEVICES = [
    pytest.param("cpu", marks=pytest.mark.cpu_half, id="cpu"),
    pytest.param("cuda", marks=(pytest.mark.gpu,
                                pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")),
                 id="cuda"),
]


@pytest.fixture(params=DEVICES)
def device(request, monkeypatch) -> torch.device:
    """The device of the device tier. On CPU Triton kernels run in Triton's interpreter
    (``TRITON_INTERPRET=1``); on CUDA the variable is removed, so the compiled kernel runs."""
    if request.param == "cpu":
        monkeypatch.setenv("TRITON_INTERPRET", "1")
    else:
        monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    return torch.device(request.param)


@pytest.fixture
def configs_dir() -> Path:
    return CONFIGS


@pytest.fixture
def fixtures_dir() -> Path:
    return FIXTURES
