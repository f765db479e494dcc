"""Hostile configs, config.json files, traces and counts (issue 29, part 5): each class is
exit status 2, exactly one stderr line naming the field, no traceback, in under 2 s.

Before, these ended in a MemoryError after 30-39 s (a YAML alias bomb), a RecursionError
(deep nesting), ``ValueError: Exceeds the limit (4300 digits)``, ``TypeError: '<' not
supported`` (keys mixing text and integers), an OverflowError (``--seeds``), a
FileNotFoundError after a whole run (``--metrics-out``) or a workload built until memory ran
out (``--conversations``).
"""

from __future__ import annotations

import time
import traceback

import pytest

from hicache.cli.main import main
from tests.conftest import CONFIGS

TINY = str(CONFIGS / "tiny-hybrid.yaml")
KV = '    - {name: kv, kind: history, layers: "0-1", tokens_per_row: 1, row_bytes: 8}\n'
FAMILIES = "model: m\nlayout:\n  page_tokens: 16\n  families:\n" + KV
DEEP = 50_000
DIGITS = "9" * 5000


def bomb(levels: int = 9) -> str:
    """A flow mapping whose last anchor stands for 10**levels values (the billion laughs)."""
    parts = ["k0: &a0 [x, x, x, x, x, x, x, x, x, x]"]
    parts += [f"k{i}: &a{i} [" + ", ".join([f"*a{i - 1}"] * 10) + "]" for i in range(1, levels)]
    return "{" + ", ".join(parts) + "}"


FILES: dict[str, str] = {
    "bomb_device.yaml": FAMILIES + f"cache:\n  anchors: {bomb()}\n  device_bytes: *a8\n",
    "bomb_model.yaml": FAMILIES.replace("model: m", f"model: {bomb()}"),
    "bomb_unknown.yaml": FAMILIES + f"cache:\n  bogus: {bomb()}\n",
    "deep.yaml": FAMILIES + "cache: " + "[" * DEEP + "]" * DEEP + "\n",
    "deep_block.yaml": FAMILIES + "cache:\n" + "".join("  " * (i + 1) + f"k{i}:\n" for i in range(40)),
    "deep.json": "[" * DEEP + "]" * DEEP,
    "deep40.json": '{"num_attention_heads": ' + "[" * 40 + "]" * 40 + "}",
    "deep.jsonl": '{"hash_ids": ' + "[" * DEEP + "]" * DEEP + ', "input_length": 16, "block_size": 16}\n',
    "digits.jsonl": '{"hash_ids": [1], "input_length": ' + DIGITS + ', "block_size": 16}\n',
    "digits.json": '{"num_attention_heads": 4, "num_hidden_layers": ' + DIGITS + ', "hidden_size": 64}',
    "digits.yaml": FAMILIES + f"cache:\n  device_bytes: {DIGITS}\n",
    "mixed_cache.yaml": FAMILIES + "cache:\n  1: a\n  device_bytes: 1GiB\n",
    "mixed_top.yaml": FAMILIES + "7: x\n",
    "mixed_hf.yaml": "model: m\nlayout:\n  hf_config: {num_attention_heads: 4, 2: x}\n",
    "huge.yaml": FAMILIES + "# padding\n" * 500_000,
}
R = ["replay", "--config", TINY, "--conversations", "2", "--quiet", "--device-pages", "24", "--host-pages", "30"]

CASES = [
    # (argv, what the one line must name)
    (["replay", "--config", "{bomb_device.yaml}", "--quiet"], "cache.anchors"),
    (["layout", "{bomb_model.yaml}"], "model."),
    (["replay", "--config", "{bomb_unknown.yaml}", "--quiet"], "cache.bogus"),
    (["stress", "--config", "{bomb_device.yaml}", "--ops", "5"], "cache.anchors"),
    (["replay", "--config", "{deep.yaml}", "--quiet"], "cache[0]"),
    (["layout", "{deep_block.yaml}"], "cache.k0.k1"),
    (["layout", "--hf-config", "{deep.json}"], "hf_config="),
    (["layout", "--hf-config", "{deep40.json}"], "hf_config.num_attention_heads[0]"),
    (R + ["--trace", "{deep.jsonl}"], "deep.jsonl:1"),
    (R + ["--trace", "{digits.jsonl}"], "input_length="),
    (["layout", "--hf-config", "{digits.json}"], "hf_config.num_hidden_layers="),
    (["replay", "--config", "{digits.yaml}", "--quiet"], "cache.device_bytes="),
    (["replay", "--config", "{mixed_cache.yaml}", "--quiet"], "cache.1="),
    (["layout", "{mixed_top.yaml}"], "7="),
    (["layout", "{mixed_hf.yaml}"], "layout.hf_config.2="),
    (["layout", "{huge.yaml}"], "config="),
    (["stress", "--config", TINY, "--seeds", "0-99999999999999999999999"], "--seeds="),
    (["stress", "--config", TINY, "--seeds", "0-100000000"], "--seeds="),
    (R + ["--metrics-out", "/nonexistent/dir/x.prom"], "--metrics-out="),
    (["replay", "--conversations", "1000000000", "--quiet"], "--conversations="),
    (["replay", "--workload", "long-revisit", "--conversations", "100000", "--quiet"], "--conversations="),
    (["sweep", "--conversations", "1000000000", "--device-gib", "1", "--host-gib", "1", "--no-sim"],
     "--conversations="),
]


def run_timed(capsys, argv: list[str]) -> tuple[int, str, str, float]:
    """``hicache ARGV`` in-process: (exit status, stdout, stderr, seconds); an exception
    escaping ``main`` is what a user would see as a traceback."""
    start = time.perf_counter()
    try:
        rc = main(argv)
    except SystemExit as exc:  # argparse
        rc = exc.code
    except BaseException:      # MemoryError and RecursionError included
        pytest.fail("Traceback (escaped main):\n" + traceback.format_exc()[-3000:])
    took = time.perf_counter() - start
    out = capsys.readouterr()
    return rc, out.out, out.err, took


@pytest.mark.parametrize("argv, field", CASES, ids=[" ".join(a[-3:]) for a, _ in CASES])
def test_hostile_input_is_one_line_naming_the_field(capsys, tmp_path, argv, field):
    for name in {a[1:-1] for a in argv if a.startswith("{")}:
        (tmp_path / name).write_text(FILES[name])
    argv = [str(tmp_path / a[1:-1]) if a.startswith("{") else a for a in argv]
    rc, out, err, took = run_timed(capsys, argv)
    lines = err.strip().splitlines()
    assert rc == 2, (rc, out[-300:], err[-300:])
    assert len(lines) == 1 and "Traceback" not in err, err[-2000:]
    assert lines[0].startswith("hicache") and ": error: " in lines[0] and field in lines[0], lines[0][:500]
    assert len(lines[0]) < 1000, "the line stays short whatever the value"
    assert out == "", "nothing runs on bad input"
    assert took < 2.0, f"took {took:.1f} s"


def test_a_trace_line_without_end_is_refused(capsys, tmp_path, monkeypatch):
    """A line longer than the bound is refused, never read whole (the bound made small here)."""
    from hicache.engine.workloads import trace_parse

    monkeypatch.setattr(trace_parse, "MAX_LINE_BYTES", 1000)
    path = tmp_path / "long.jsonl"
    path.write_text('{"hash_ids": [' + ", ".join(["1"] * 1000) + '], "input_length": 16, "block_size": 16}\n')
    rc, _, err, took = run_timed(capsys, R + ["--trace", str(path)])
    assert rc == 2 and err.count("\n") == 1 and "long.jsonl:1=" in err and "longer than 1,000" in err, err
    assert took < 2.0

