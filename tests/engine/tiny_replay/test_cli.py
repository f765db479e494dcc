"""``hicache replay --model tiny``: JSON keys, exactness, every tier hit, errors, exit 1."""

from __future__ import annotations

import json

import pytest
import torch

from hicache.cli.main import main
from hicache.engine.tiny_model import TOLERANCE
from hicache.engine.tiny_serving import TinyEngine, tiny_workload

SYNTHETIC_KEYS = {"requests", "prompt_tokens", "hit_tokens", "hit_rate", "device_hit_tokens", "host_hit_tokens",
                  "l3_hit_tokens", "verified_pages", "mismatched_pages", "l3_errors"}


def _run(capsys, *flags):
    rc = main(["replay", "--model", "tiny", "--quiet", *flags])
    out = capsys.readouterr()
    return rc, out.out, out.err


def test_json_is_exact_with_hits_from_every_tier(capsys):
    rc, out, err = _run(capsys, "--json")
    assert rc == 0 and err == ""
    s = json.loads(out)
    assert SYNTHETIC_KEYS | {"max_logit_diff", "checked_tokens"} <= set(s)
    assert s["max_logit_diff"] <= TOLERANCE and s["checked_tokens"] > 0
    assert s["device_hit_tokens"] > 0 and s["host_hit_tokens"] > 0 and s["l3_hit_tokens"] > 0
    assert s["hit_tokens"] == s["device_hit_tokens"] + s["host_hit_tokens"] + s["l3_hit_tokens"]
    reqs = tiny_workload(6, 0)
    assert s["requests"] == len(reqs)
    assert s["prompt_tokens"] == sum(r.prompt_len for r in reqs)
    # Every computed position is checked: prompt + output minus what was reused.
    assert s["checked_tokens"] == sum(r.prompt_len + r.output_len for r in reqs) - s["hit_tokens"]
    assert s["mismatched_pages"] == 0 and s["verified_pages"] > 0 and s["l3_errors"] == 0
    assert (s["retention_interval"], s["storage_url"], s["device"]) == (None, "memory://", "cpu")


def test_table_and_requests_out(capsys, tmp_path):
    path = tmp_path / "requests.jsonl"
    rc, out, _ = _run(capsys, "--conversations", "2", "--retention", "0", "--requests-out", str(path))
    assert rc == 0
    assert "max |logit diff| (tolerance 1e-09)" in out and "0 (bit-exact)" in out
    assert "retention / L3" in out and "0 / memory://" in out
    lines = [json.loads(line) for line in path.read_text().splitlines()]
    assert [r["request_id"] for r in lines] == [r.request_id for r in sorted(tiny_workload(2, 0), key=lambda r: r.request_id)]
    assert all(r["max_logit_diff"] <= TOLERANCE and r["checked_tokens"] > 0 for r in lines)
    assert any(r["hit_tokens"] > 0 for r in lines)


@pytest.mark.parametrize("flags, named", [
    (["--device-gib", "1"], "--device-gib"),
    (["--workload", "sharegpt"], "--workload"),
    (["--trace", "x.jsonl"], "--trace"),
    (["--config", "llama-3.1-8b"], "--config"),
    (["--conversations", "0"], "--conversations"),
    (["--retention", "10"], "retention_interval"),   # not a multiple of 16-token pages
    (["--retention", "soon"], "--retention"),
    (["--max-running", "0"], "--max-running"),
    (["--storage", "nonsense"], "storage_url"),
])
def test_bad_flags_get_one_line_and_exit_2(capsys, flags, named):
    rc, out, err = _run(capsys, *flags)
    assert rc == 2 and out == ""
    assert err.count("\n") == 1 and err.startswith("hicache replay: error: ") and named in err


def test_exit_1_when_a_resume_is_wrong(capsys, monkeypatch):
    """The same run with one snapshot row corrupted before each resume: the command
    reports the difference and fails."""
    real = TinyEngine.resume_sequence

    def corrupt(self, lease):
        if lease.resume_tokens:
            self.cache.pools.device.view("swa_kv")[0, lease.snapshot_id].view(torch.float64)[0] += 1.0
        return real(self, lease)

    monkeypatch.setattr(TinyEngine, "resume_sequence", corrupt)
    rc, out, _ = _run(capsys, "--json", "--conversations", "2")
    s = json.loads(out)
    assert rc == 1
    assert s["max_logit_diff"] > TOLERANCE and s["mismatched_pages"] > 0 and s["exact"] is False


@pytest.mark.parametrize("bad, says", [("tpu", "must be 'cpu', 'cuda', 'cuda:N' or 'auto'"),
                                       pytest.param("cuda", "no CUDA device is available", marks=pytest.mark.skipif(
                                           torch.cuda.is_available(), reason="CUDA is available here"))])
def test_a_bad_device_is_one_line(capsys, bad, says):
    rc, out, err = _run(capsys, "--device", bad, "--conversations", "1")
    assert rc == 2 and out == ""
    assert len(err.splitlines()) == 1 and err.startswith("hicache replay: error:") and says in err, err
