from __future__ import annotations

from pathlib import Path

import pytest

from tests.engine.workloads.helpers import small_sharegpt_items, write_sharegpt


@pytest.fixture
def small_sharegpt(tmp_path) -> Path:
    return write_sharegpt(tmp_path / "sg.json", small_sharegpt_items())
