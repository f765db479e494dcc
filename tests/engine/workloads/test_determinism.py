"""The same flags give the same requests in every process (no salted hash() anywhere)."""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
from pathlib import Path

import numpy as np

from hicache.engine.workloads import (MixSpec, ReasoningSpec, WorkloadStats, load_trace, mix, production, rag,
                                      reasoning, sharegpt, summarize, synthetic, write_production_trace,
                                      write_trace)
from tests.engine.workloads.helpers import small_sharegpt_items, write_sharegpt

ROOT = Path(__file__).resolve().parents[3]


def digest(requests) -> str:
    h = hashlib.sha256()
    for r in requests:
        h.update(f"{r.request_id}|{r.conversation_id}|{r.turn}|{r.arrival_s!r}|".encode())
        h.update(r.prompt.tobytes())
        h.update(b"|")
        h.update(r.output.tobytes())
    return h.hexdigest()


def production_file_digest(path: str) -> str:
    write_production_trace(path, 300, 3, block_size=512)
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()


def digests(sharegpt_path: str, trace_path: str) -> list[str]:
    return [digest(synthetic(25, 3)),
            digest(synthetic(2, 1, preset="long-context", document_len=(20_000, 60_000))),
            digest(synthetic(3, 4, preset="agentic", system_len=(100, 300), task_len=(10, 50),
                             result_len=(10, 80))),
            digest(sharegpt(6, 2, path=sharegpt_path)),
            digest(load_trace(trace_path)),
            digest(reasoning(3, 5, spec=ReasoningSpec(system_len=50, thinking_len=(10, 80)))),
            digest(rag(2, 6)),
            digest(mix(6, 7, spec=MixSpec(arrival_process="bursty"))),
            digest(production(60, 8)),
            production_file_digest(trace_path + ".production")]


def test_same_requests_in_other_processes(tmp_path):
    sg = write_sharegpt(tmp_path / "sg.json", small_sharegpt_items())
    trace = tmp_path / "t.jsonl"
    trace.write_text('{"hash_ids": ["a", "b"], "input_length": 300, "block_size": 256, "output_length": 7}\n'
                     '{"hash_ids": ["a", "c"], "input_length": 512, "block_size": 256, "timestamp": 5}\n')
    here = digests(str(sg), str(trace))
    code = ("import sys; from tests.engine.workloads.test_determinism import digests; "
            "print('\\n'.join(digests(sys.argv[1], sys.argv[2])))")
    for hash_seed in ("1", "2"):
        env = dict(os.environ, PYTHONHASHSEED=hash_seed)
        out = subprocess.run([sys.executable, "-c", code, str(sg), str(trace)], cwd=ROOT, env=env,
                             capture_output=True, text=True, check=True).stdout.split()
        assert out == here
    assert len(set(here)) == 10


def test_trace_written_in_another_process_is_identical(tmp_path):
    reqs = synthetic(8, 5)
    write_trace(reqs, tmp_path / "here.jsonl", block_size=128)
    code = ("import sys; from hicache.engine.workloads import synthetic, write_trace; "
            "write_trace(synthetic(8, 5), sys.argv[1], block_size=128)")
    subprocess.run([sys.executable, "-c", code, str(tmp_path / "there.jsonl")], cwd=ROOT,
                   env=dict(os.environ, PYTHONHASHSEED="7"), check=True)
    assert (tmp_path / "here.jsonl").read_bytes() == (tmp_path / "there.jsonl").read_bytes()


def _req(rid, conv, turn, prompt, output):
    from hicache.engine.workloads import Request

    return Request(rid, conv, turn, float(rid), np.array(prompt, np.int32), np.array(output, np.int32))


def test_summarize_counts_the_reuse_ceiling_exactly():
    a = list(range(20, 30))
    reqs = [_req(0, "x", 0, a, [1, 2]),                 # nothing cached yet
            _req(1, "x", 1, a + [1, 2, 40, 41], [3]),    # 14 tokens: 3 usable pages, all seen
            _req(2, "y", 0, a[:4] + [50] * 5, [4]),      # first page seen; second page new
            _req(3, "z", 0, a[:8], [5])]                 # 8 tokens: only 1 usable page (7 // 4)
    stats = summarize(reqs, page_tokens=4)
    assert stats == WorkloadStats(requests=4, conversations=3, max_turns=2, prompt_tokens=41,
                                  output_tokens=5, mean_prompt_tokens=41 / 4, max_prompt_tokens=14,
                                  duration_s=3.0, page_tokens=4, reusable_tokens=12 + 4 + 4)
    assert stats.as_dict()["reuse_ratio"] == 20 / 41
