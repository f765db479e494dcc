"""Bad input to every command: exit status 2, exactly one stderr line naming the field, no
traceback, nothing run. Each row was a traceback, a silent acceptance or a multi-line
error before (issue 11); the rest of the table keeps the commands that already behaved so.
"""

from __future__ import annotations

import json
import traceback
from pathlib import Path

import pytest

from hicache.cli.common import print_json
from hicache.cli.main import main
from tests.conftest import CONFIGS, FIXTURES

TINY = str(CONFIGS / "tiny-hybrid.yaml")
KV = '    - {name: kv, kind: history, layers: "0-1", tokens_per_row: 1, row_bytes: 8}\n'
FAMILIES = "model: m\nlayout:\n  page_tokens: 16\n  families:\n" + KV
V4 = '{"compress_ratios": [0, 4, 4, 8], "num_hidden_layers": 4, "head_dim": 64, "sliding_window": 8, ' \
     '"index_head_dim": 32}'
FILES: dict[str, bytes | str] = {
    "nonutf8.yaml": b"model: m\xff\nlayout: {}\n",
    "nonutf8.json": b'{"num_attention_heads": 4, "num_hidden_layers": 2, "hidden_size": 64, "x": "\xff"}',
    "nonutf8.jsonl": b"\xff\xfe\n",
    "huge_input.jsonl": '{"hash_ids": [1], "input_length": 1000000000000, "block_size": 1000000000000}\n',
    "huge_output.jsonl": '{"hash_ids": [1], "input_length": 16, "block_size": 16, "output_length": 100000000000}\n',
    "cache_list.yaml": FAMILIES + "cache: [1, 2]\n",
    "cache_str.yaml": FAMILIES + "cache: fast\n",
    "inf_bytes.yaml": FAMILIES + "cache: {device_bytes: .inf}\n",
    "nan_bytes.yaml": FAMILIES + "cache: {host_bytes: .nan}\n",
    "huge_bytes.yaml": FAMILIES + "cache: {host_bytes: '" + "9" * 400 + "GiB'}\n",
    "nan_ratio.yaml": FAMILIES + "cache: {host_ratio: .nan}\n",
    "huge_snapshots.yaml": FAMILIES + "cache: {device_snapshots: 1000000000000}\n",
    "nan_timeout.yaml": FAMILIES + "cache: {prefetch_timeout_s: .nan}\n",
    "salt_list.yaml": FAMILIES + "cache: {storage_salt: [1]}\n",
    "model_list.yaml": FAMILIES.replace("model: m", "model: [1]"),
    "hf_pt_abc.yaml": f"model: m\nlayout:\n  page_tokens: abc\n  hf_config: {V4}\n",
    "hf_pt_zero.yaml": f"model: m\nlayout:\n  page_tokens: 0\n  hf_config: {V4}\n",
    "hf_mtp.yaml": f"model: m\nlayout:\n  page_tokens: 16\n  include_mtp: 7\n  hf_config: {V4}\n",
    "pt_abc.yaml": "model: m\nlayout:\n  page_tokens: abc\n",
    "v4.json": V4,
    "huge_layers.json": '{"num_attention_heads": 4, "num_hidden_layers": 1000000000, "hidden_size": 64}',
    "history_on_state.yaml": FAMILIES + KV.replace("name: kv", "name: kv2").replace("}", ", index_source: state}"),
    "huge_range.yaml": FAMILIES.replace('"0-1"', '"0-99999999"'),
}
R = ["replay", "--config", TINY, "--conversations", "2", "--quiet", "--device-pages", "24", "--host-pages", "30"]
S = ["stress", "--config", TINY, "--ops", "20"]

CASES = [
    # (argv, the field the one line must name)
    (["layout", "{nonutf8.yaml}"], "config="),
    (["layout", "--hf-config", "{nonutf8.json}"], "hf_config="),
    (["replay", "--config", "{nonutf8.yaml}", "--quiet"], "config="),
    (R + ["--trace", "{nonutf8.jsonl}"], "trace="),
    (R + ["--trace", "{huge_input.jsonl}"], "input_length="),      # a terabyte allocation before
    (R + ["--trace", "{huge_output.jsonl}"], "output_length="),
    (["replay", "--config", "{cache_list.yaml}", "--quiet"], "cache="),
    (["replay", "--config", "{cache_str.yaml}", "--quiet"], "cache="),
    (["stress", "--config", "{cache_list.yaml}", "--ops", "5"], "cache="),
    (S + ["--adaptive-record", "0"], "--adaptive-record="),
    (S + ["--adaptive-z", "-1"], "--adaptive-z="),
    (R + ["--adaptive-z", "inf"], "--adaptive-z="),
    (S + ["--adaptive-trial", "-1"], "--adaptive-trial="),
    (R + ["--adaptive-trial", "-5"], "--adaptive-trial="),
    (["replay", "--config", "{inf_bytes.yaml}", "--quiet"], "cache.device_bytes="),
    (["replay", "--config", "{nan_bytes.yaml}", "--quiet"], "cache.host_bytes="),
    (["replay", "--config", "{huge_bytes.yaml}", "--quiet"], "cache.host_bytes="),
    (["replay", "--config", "{nan_ratio.yaml}", "--quiet"], "host_ratio="),
    (["replay", "--config", "{huge_snapshots.yaml}", "--quiet"], "device_snapshots="),   # 7 TiB before
    (["replay", "--config", "{nan_timeout.yaml}", "--quiet"], "prefetch_timeout_s="),
    (["replay", "--config", "{salt_list.yaml}", "--quiet"], "storage_salt="),
    (["replay", "--config", "{model_list.yaml}", "--quiet"], "model="),
    (R + ["--device-gib", "inf"], "--device-gib="),
    (R + ["--device-gib", "nan"], "--device-gib="),
    (R + ["--host-gib", "inf"], "--host-gib="),
    (R + ["--prefill-tps", "nan", "--json"], "--prefill-tps="),
    (R + ["--prefill-tps", "inf", "--json"], "--prefill-tps="),
    (["layout", "{hf_pt_abc.yaml}"], "page_tokens="),
    (["layout", "{hf_pt_zero.yaml}"], "page_tokens="),
    (["layout", "{pt_abc.yaml}", "--hf-config", "{v4.json}"], "page_tokens="),
    (["layout", "{hf_mtp.yaml}"], "include_mtp="),
    (["layout", "--hf-config", "{huge_layers.json}"], "num_hidden_layers="),
    (["layout", "{history_on_state.yaml}"], "index_source="),
    (["replay", "--config", "{history_on_state.yaml}", "--quiet"], "index_source="),
    (["layout", "{huge_range.yaml}"], "layers="),
    (["layout"], "config="),
    (R + ["--storage", "rediss://127.0.0.1:1/0?ssl_ca_certs=/nonexistent/ca.pem"], "storage_url.ssl_ca_certs="),
    (R + ["--storage", "redis://127.0.0.1:1/0?ssl_cert_reqs=none"], "storage_url.ssl_cert_reqs="),
    (R + ["--storage", "redis://127.0.0.1:70000/0"], "storage_url="),
    (R + ["--storage", "redis://127.0.0.1:1/0?db=-1"], "storage_url.db="),
    (R + ["--storage", "redis://127.0.0.1:1/0?timeout=inf"], "storage_url.timeout="),
    (R + ["--storage", "file://relative/dir"], "storage_url="),
    (R + ["--storage", ""], "storage_url="),
    (R + ["--requests-out", "/nonexistent-dir/requests.jsonl"], "--requests-out="),
    (R + ["--plot", "/nonexistent-dir/hit.png"], "--plot="),
    (R + ["--requests-out", "{.}"], "--requests-out="),
    (["replay", "--model", "tiny", "--quiet", "--requests-out", "/nonexistent-dir/r.jsonl"], "--requests-out="),
    (R + ["--conversations", "0"], "--conversations="),
    (R + ["--retention", "-5"], "--retention="),
    (R + ["--ops", "1"], "--ops"),
    (S + ["--seed", "-1"], "--seed="),
    (S + ["--seeds", "5-2"], "--seeds="),
    (S + ["--seeds", "x"], "--seeds="),
    (S + ["--seed", "1", "--seeds", "1-2"], "--seeds"),
    (S + ["--max-queued-ops", "0"], "--max-queued-ops="),
    (S + ["--device-snapshots", "-1"], "--device-snapshots="),
    (S + ["--host-snapshots", "-2"], "--host-snapshots="),
    (S + ["--retention", "soon"], "--retention="),
    (S + ["--eviction", "mru"], "--eviction"),
    (S + ["--host-tier", "exclusive", "--write-policy", "write_through"], "host_tier="),
    (S + ["--device-pages", "3"], "--device-pages="),
    (S + ["--fault-rate", "nan"], "--fault-rate="),
    (S + ["--ops", "many"], "--ops"),
    (["bench", "transfer", "--config", TINY, "--pages", "2", "--reps", "1", "--device", "nope"], "device="),
    (["bench", "storage", "--url", "memory://", "--object-mib", "inf"], "--object-mib="),
    (["bench", "storage", "--url", "memory://", "--object-mib", "1e9", "--objects", "1"], "--object-mib="),
    (["bench", "storage", "--url", "redis://127.0.0.1:1/0?pasword=x"], "storage_url.pasword="),
    (["bench", "tree", "--config", TINY, "--prompt-tokens", "64", "--requests", "0"], "--requests="),
    (["bench", "tree", "--config", TINY, "--prompt-tokens", "64", "--chunk-pages", "0"], "--chunk-pages="),
    (["bench", "tree", "--config", TINY, "--prompt-tokens", "64", "--seconds", "nan"], "--seconds="),
    (["bench", "nope"], "NAME"),
]


def run_cli(capsys, argv: list[str]) -> tuple[int, str, str]:
    """Run ``hicache ARGV`` in-process: (exit status, stdout, stderr); an exception escaping
    ``main`` is what a user would see as a traceback."""
    try:
        rc = main(argv)
    except SystemExit as exc:  # argparse
        rc = exc.code
    except Exception:
        pytest.fail("Traceback (escaped main):\n" + traceback.format_exc())
    out = capsys.readouterr()
    return rc, out.out, out.err


@pytest.mark.parametrize("argv, field", CASES, ids=[" ".join(a[-3:]) for a, _ in CASES])
def test_bad_input_is_one_line_naming_the_field(capsys, tmp_path, argv, field):
    for name, text in FILES.items():
        (tmp_path / name).write_bytes(text if isinstance(text, bytes) else text.encode())
    argv = [str(tmp_path) if a == "{.}" else str(tmp_path / a[1:-1]) if a.startswith("{") else a for a in argv]
    rc, out, err = run_cli(capsys, argv)
    lines = err.strip().splitlines()
    assert rc == 2, (rc, out[-500:], err[-500:])
    assert len(lines) == 1 and "Traceback" not in err, err
    assert lines[0].startswith("hicache") and ": error: " in lines[0] and field in lines[0], lines[0]
    assert out == "", "nothing runs on bad input"


def test_json_never_holds_nan_or_infinity(capsys):
    print_json({"a": float("nan"), "b": [float("inf"), 1.5], "c": {"d": float("-inf")}})
    text = capsys.readouterr().out
    assert json.loads(text, parse_constant=lambda c: pytest.fail(f"{c} in --json")) == \
        {"a": None, "b": [None, 1.5], "c": {"d": None}}


def test_outputs_are_written_after_a_good_run(capsys, tmp_path):
    pytest.importorskip("matplotlib")
    req, plot = tmp_path / "r.jsonl", tmp_path / "hit.png"
    rc, out, _ = run_cli(capsys, R + ["--json", "--prefill-tps", "5000", "--requests-out", str(req), "--plot", str(plot),
                                      "--device-pages", "400"])  # room to run, so TTFTs exist
    summary = json.loads(out, parse_constant=lambda c: pytest.fail(f"{c} in --json"))
    assert rc == 0 and summary["requests"] == len(req.read_text().splitlines()) > 0
    assert plot.stat().st_size > 0 and summary["ttft_mean_s"] >= 0


def test_a_hf_fixture_still_loads(capsys):
    """The stricter hf checks keep the shipped configs working (page_tokens from the YAML)."""
    rc, out, err = run_cli(capsys, ["layout", str(CONFIGS / "deepseek-v4-flash.yaml"), "--hf-config",
                                    str(FIXTURES / "deepseek-v4-flash.config.json"), "--json"])
    assert rc == 0 and json.loads(out)["page_tokens"] == 256, err


def test_paths_are_not_touched_by_a_failed_check(tmp_path, capsys):
    target = tmp_path / "new.jsonl"
    run_cli(capsys, R + ["--conversations", "0", "--requests-out", str(target)])
    assert not target.exists()   # the check opens and removes; a refused run leaves nothing
    assert not list(Path(tmp_path).iterdir())


@pytest.mark.parametrize("argv", [["replay", "--requests", "200"], ["sweep", "--device-gib", "1", "--host-gib", "1", "--requests", "300"],
                                  ["bench", "storage", "--url", "memory://", "--object", "1"]])
def test_an_abbreviated_flag_is_refused_not_read_as_a_longer_one(capsys, tmp_path, monkeypatch, argv):
    """``--requests 200`` once meant ``--requests-out 200`` and wrote a request dump named 200."""
    monkeypatch.chdir(tmp_path)
    with pytest.raises(SystemExit) as exc:
        main(argv)
    err = capsys.readouterr().err.strip()
    assert exc.value.code == 2 and len(err.splitlines()) == 1 and "unrecognized arguments" in err
    assert list(tmp_path.iterdir()) == []
