from __future__ import annotations

from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
CONFIGS = ROOT / "configs"
FIXTURES = Path(__file__).resolve().parent / "fixtures"


@pytest.fixture
def configs_dir() -> Path:
    return CONFIGS


@pytest.fixture
def fixtures_dir() -> Path:
    return FIXTURES
