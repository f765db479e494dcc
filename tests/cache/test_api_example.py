"""The engine loop in docs/api.md runs as documented."""

from __future__ import annotations

import os
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_api_doc_example_runs(capsys):
    text = (ROOT / "docs" / "api.md").read_text()
    blocks = re.findall(r"```python\n(.*?)```", text, flags=re.S)
    example = next(b for b in blocks if "def serve" in b)
    cwd = os.getcwd()
    os.chdir(ROOT)
    try:
        exec(compile(example, "docs/api.md", "exec"), {"__name__": "api_example"})
    finally:
        os.chdir(cwd)
    assert "tokens reused" in capsys.readouterr().out
