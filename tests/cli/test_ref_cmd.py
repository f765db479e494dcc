"""``hicache ref``: the table, the JSON, a gzipped trace, and one-line errors."""

from __future__ import annotations

import gzip
import json

from hicache.cli.main import main

REQS = [([1, 2, 3], 48), ([1, 2, 4], 48), ([1, 2, 5, 6], 74), ([1, 2, 5, 8], 64)]


def lines():
    return "".join(json.dumps({"hash_ids": ids, "input_length": n, "block_size": 16}) + "\n" for ids, n in REQS)


def test_table_json_and_gzip(tmp_path, capsys):
    path = tmp_path / "t.jsonl"
    path.write_text(lines())
    assert main(["ref", str(path), "--blocks", "4,5", "--chunk-blocks", "2"]) == 0
    table = capsys.readouterr().out
    assert "hicache ref" in table and "62.50%" in table and "50.00%" in table and "underfilled" in table
    gz = tmp_path / "t.jsonl.gz"
    with gzip.open(gz, "wt") as f:
        f.write(lines())
    assert main(["ref", str(gz), "--blocks", "4", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["chunk_blocks"] == 0
    assert out["points"] == [{"capacity_blocks": 4, "block_lru": 0.625, "hybrid_lru": 0.5}]


def test_bad_input_is_one_line(tmp_path, capsys):
    path = tmp_path / "t.jsonl"
    path.write_text(lines())
    empty = tmp_path / "e.jsonl"
    empty.write_text('{"no": "hashes"}\n')
    for argv in (["ref", str(path), "--blocks", "x"], ["ref", str(path), "--blocks", "0"],
                 ["ref", str(tmp_path / "missing.jsonl"), "--blocks", "4"],
                 ["ref", str(path), "--blocks", "4", "--chunk-blocks", "-1"], ["ref", str(empty), "--blocks", "4"],
                 ["ref", str(path), "--blocks", "4", "--block-size", "0"]):
        assert main(argv) == 2, argv
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and err[0].startswith("hicache ref: error:"), (argv, err)


def test_block_size_flag_reads_a_trace_without_the_field(tmp_path, capsys):
    path = tmp_path / "t.jsonl"
    path.write_text("".join(json.dumps({"hash_ids": ids, "input_length": n}) + "\n" for ids, n in REQS))
    assert main(["ref", str(path), "--blocks", "4", "--json"]) == 2
    assert "--block-size" in capsys.readouterr().err
    assert main(["ref", str(path), "--blocks", "4", "--block-size", "16", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["points"] == [{"capacity_blocks": 4, "block_lru": 0.625, "hybrid_lru": 0.5}]
