"""``hicache layout``: the table, the JSON keys, --hf-config, and one-line errors."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from hicache.cli.main import main

KEYS = {"page_tokens", "families", "history_bytes_per_token", "history_bytes_per_page",
        "state_bytes_per_snapshot", "fingerprint"}
FAMILY_KEYS = {"name", "kind", "num_layers", "tokens_per_row", "row_bytes", "bytes_per_token"}


def run_json(capsys, *argv) -> dict:
    assert main(["layout", *argv, "--json"]) == 0
    return json.loads(capsys.readouterr().out)


def test_flash_json(capsys, configs_dir):
    out = run_json(capsys, str(configs_dir / "deepseek-v4-flash.yaml"))
    assert KEYS <= set(out)
    assert out["page_tokens"] == 256 and out["history_bytes_per_token"] == 3850.25
    assert len(out["families"]) == 7
    assert all(FAMILY_KEYS <= set(f) for f in out["families"])
    kinds = {f["name"]: f["kind"] for f in out["families"]}
    assert kinds["swa_kv"] == "state" and kinds["c4_kv"] == "history"


def test_hf_config_gives_same_numbers(capsys, configs_dir, fixtures_dir):
    for model, per_token in (("deepseek-v4-flash", 3850.25), ("deepseek-v4-pro", 5511.4375)):
        yaml_out = run_json(capsys, str(configs_dir / f"{model}.yaml"))
        hf_out = run_json(capsys, "--hf-config", str(fixtures_dir / f"{model}.config.json"))
        assert hf_out["history_bytes_per_token"] == yaml_out["history_bytes_per_token"] == per_token
        assert hf_out["families"] == yaml_out["families"]
        assert hf_out["fingerprint"] == yaml_out["fingerprint"]


def test_config_by_name_and_table(capsys):
    assert main(["layout", "deepseek-v4-flash"]) == 0
    out = capsys.readouterr().out
    assert "c4_indexer" in out and "3,850.25" in out and "page_tokens=256" in out


def test_bad_config_exits_nonzero_with_one_line(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("layout:\n  page_tokens: 16\n  families:\n"
                   "    - {name: kv, kind: history, layers: '0', tokens_per_row: 3, row_bytes: 8}\n")
    proc = subprocess.run([sys.executable, "-m", "hicache.cli.main", "layout", str(bad)],
                          capture_output=True, text=True)
    assert proc.returncode == 2
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1, proc.stderr
    assert "tokens_per_row=3" in lines[0] and "does not divide page_tokens=16" in lines[0]
    assert "Traceback" not in proc.stderr


@pytest.mark.parametrize("argv", [["layout", "no-such-config"], ["layout", "--hf-config", "/nonexistent.json"]])
def test_missing_files(capsys, argv):
    assert main(argv) == 2
    assert "no such file" in capsys.readouterr().err
