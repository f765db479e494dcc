"""``hicache bench tree --trace`` / ``--scale``: exact hits on a hand-made trace, eviction at
capacity, JSON keys, one-line errors."""

from __future__ import annotations

import json

import pytest

from hicache.cli.bench_tree_trace import run_scale
from hicache.cli.main import main

TRACE_KEYS = {"ops_per_s", "match_us_p50", "match_us_p99", "publish_us_p50", "publish_us_p99", "hit_frac"}


def write_trace(path, records):
    path.write_text("".join(json.dumps({"input_ids": i, "output_ids": o}) + "\n" for i, o in records))
    return str(path)


def three_requests(tmp_path):
    """A (10 + 6 tokens), then A's prompt + output + 5 new (+3 out), then an unrelated one."""
    a_in, a_out = list(range(10)), list(range(100, 106))
    b_in = a_in + a_out + [7, 7, 7, 7, 7]
    return write_trace(tmp_path / "t.jsonl", [(a_in, a_out), (b_in, [8, 8, 8]), ([50] * 9, [51] * 3)])


def run_json(capsys, argv):
    rc = main(["bench", "tree", *argv, "--json"])
    out, _ = capsys.readouterr()
    assert rc == 0
    return json.loads(out)


def test_trace_hits_and_cached_pages_are_exact(tmp_path, capsys):
    data = run_json(capsys, ["--trace", three_requests(tmp_path), "--capacity-tokens", "400", "--page-tokens", "4"])
    assert TRACE_KEYS <= data.keys()
    assert (data["requests"], data["ops"], data["page_tokens"]) == (3, 6, 4)
    # B resumes at A's 16 published tokens (4 pages); A and C miss: 16 / (10 + 21 + 9)
    assert data["hit_frac"] == 0.4
    assert (data["evicted_pages"], data["cached_pages"]) == (0, 4 + 2 + 3)
    assert data["ops_per_s"] > 0 and data["match_us_p50"] <= data["match_us_p99"]


def test_trace_evicts_at_capacity(tmp_path, capsys):
    data = run_json(capsys, ["--trace", three_requests(tmp_path), "--capacity-tokens", "24", "--page-tokens", "4"])
    # 6 pages hold A (4) and B (6 with A's 4 shared); C's 3 pages evict what they need, leaf
    # first: B's own 2 pages, then A's last page (a victim is cut: A's head stays)
    assert data["cached_pages"] == 6 and data["evicted_pages"] == 3 and data["hit_frac"] == 0.4


def test_trace_on_a_hybrid_config_publishes_snapshots(tmp_path, capsys):
    # tiny-hybrid: 16-token pages, state families -> each finish publishes a snapshot and
    # the next turn resumes at it (B resumes at A's finish boundary: 32 of its 37 tokens)
    a_in, a_out = list(range(20)), list(range(100, 112))
    b_in = a_in + a_out + [7] * 5
    trace = write_trace(tmp_path / "h.jsonl", [(a_in, a_out), (b_in, [8] * 3)])
    data = run_json(capsys, ["--trace", trace, "--capacity-tokens", "640", "--config", "tiny-hybrid"])
    assert data["page_tokens"] == 16 and data["cached_pages"] == 2
    assert data["hit_frac"] == round(32 / (20 + 37), 4)


def test_scale_reports_one_point_per_size():
    out = run_scale((1024, 4096), page_tokens=8, ops=100)
    assert [p[0] for p in out["scale_points"]] == [p["cached_pages"] for p in out["points"]]
    assert all(992 <= p["cached_pages"] <= 1024 for p in out["points"][:1])
    assert 4000 <= out["points"][1]["cached_pages"] <= 4096 and out["points"][1]["tree_nodes"] > 100
    assert out["scale_ratio"] == round(out["points"][1]["us_per_op"] / out["points"][0]["us_per_op"], 3)


@pytest.mark.parametrize("argv, message", [
    (["--trace", "X"], "--capacity-tokens=None"),
    (["--trace", "/no/such/file.jsonl", "--capacity-tokens", "1024"], "no such file"),
    (["--trace", "X", "--capacity-tokens", "100"], "must be at least one page (256)"),
    (["--trace", "BAD", "--capacity-tokens", "1024"], "needs input_ids and output_ids"),
    (["--trace", "X", "--scale"], "either --trace or --scale"),
    (["--scale", "--scale-max-pages", "2000"], "two points"),
    (["--scale", "--scale-ops", "10"], "--scale-ops=10: must be >= 100"),
    (["--trace", "X", "--capacity-tokens", "1024", "--page-tokens", "0"], "--page-tokens=0"),
    (["--trace", "X", "--capacity-tokens", "1024", "--config", "tiny-mha", "--page-tokens", "4"],
     "comes from the layout"),
])
def test_bad_input_is_one_line(tmp_path, capsys, argv, message):
    good = three_requests(tmp_path)
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"input": [1, 2]}\n')
    argv = [{"X": good, "BAD": str(bad)}.get(a, a) for a in argv]
    rc = main(["bench", "tree", *argv])
    _, err = capsys.readouterr()
    lines = [line for line in err.splitlines() if not line.startswith("bench tree")]
    assert rc == 2 and len(lines) == 1 and lines[0].startswith("hicache bench: error:") and message in lines[0]
