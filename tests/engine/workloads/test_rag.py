"""The RAG workload: popular documents retrieved in a new order each time. Two questions
share exactly their instruction and their common run of leading documents; follow-ups
extend their question; popularity is skewed; the context budget keeps leading documents;
trace round trip; bad input."""

from __future__ import annotations

import dataclasses
import itertools
from collections import Counter

import numpy as np
import pytest

from hicache.engine.workloads import RagSpec, load_trace, rag, reusable_per_request, summarize, write_trace
from hicache.engine.workloads.rag import Corpus
from hicache.engine.workloads.tokenizer import ASSISTANT, BOS, DOC, EOT, FIRST_TEXT_ID, SYSTEM, USER
from hicache.errors import ConfigError
from tests.engine.workloads.helpers import by_conversation, check_workload, common_prefix

SMALL = RagSpec(documents=60, document_len=(20, 60), popularity=1.0, retrieved=(2, 5), instructions=2,
                instruction_len=(30, 50), question_len=(3, 10), answer_len=(5, 20), queries=(3, 8),
                followup_share=0.4, followups=(1, 3), arrival_rate=1.0, query_gap_s=5.0, think_time_s=2.0)
SEED = 5


@pytest.fixture(scope="module")
def small():
    return rag(12, SEED, spec=SMALL)


def parse_first(prompt: np.ndarray, corpus: Corpus) -> tuple[int, list[int]]:
    """(instruction index, retrieved documents in order) of a first turn, checking its template."""
    (inst,) = [i for i, p in enumerate(corpus.instructions) if np.array_equal(prompt[:len(p)], p)]
    pos = len(corpus.instructions[inst])
    assert prompt[pos] == USER
    pos += 1
    head_of = {int(h): d for d, h in enumerate(corpus.heads)}
    docs = []
    while prompt[pos] == DOC:
        d = head_of[int(prompt[pos + 1])]
        doc = corpus.document(d)
        assert np.array_equal(prompt[pos:pos + len(doc)], doc)
        docs.append(d)
        pos += len(doc)
    assert list(prompt[pos:pos + 2]) == [EOT, USER] and list(prompt[-2:]) == [EOT, ASSISTANT]
    assert SMALL.question_len[0] <= len(prompt) - pos - 4 <= SMALL.question_len[1]
    return inst, docs


def test_questions_share_exactly_instruction_and_common_leading_documents(small):
    check_workload(small)  # follow-ups: prompt + output + the next question
    corpus = Corpus(SMALL, SEED)
    firsts = [r for r in small if r.turn == 0]
    parsed = [parse_first(r.prompt, corpus) for r in firsts]
    for inst, docs in parsed:
        assert SMALL.retrieved[0] <= len(docs) <= SMALL.retrieved[1] and len(set(docs)) == len(docs)
    partial_runs = 0
    for (a, (ia, da)), (b, (ib, db)) in itertools.combinations(zip(firsts, parsed), 2):
        n = common_prefix(a.prompt, b.prompt)
        if ia != ib:
            assert n == 2  # <bos><system>: instructions start with distinct tokens
            continue
        run = len(list(itertools.takewhile(lambda x: x[0] == x[1], zip(da, db))))
        expect = len(corpus.instructions[ia]) + 1 + sum(len(corpus.document(d)) for d in da[:run])
        if da == db:
            assert n >= expect + 2  # the whole context; then the questions
        elif run < min(len(da), len(db)):
            assert n == expect + 1  # both have a <doc> there; the documents' first tokens differ
            partial_runs += run > 0
        else:
            assert n == expect  # one list ends: <eot> against <doc>
    assert partial_runs > 0  # some questions do begin with the same document(s)


def test_documents_recur_in_different_orders_and_popularity_is_skewed():
    spec = dataclasses.replace(SMALL, documents=400, queries=(10, 10), followup_share=0.0)
    corpus = Corpus(spec, 1)
    firsts = [r for r in rag(20, 1, spec=spec)]
    lists = []
    for r in firsts:
        (inst,) = [i for i, p in enumerate(corpus.instructions) if np.array_equal(r.prompt[:len(p)], p)]
        heads = r.prompt[np.flatnonzero(r.prompt == DOC) + 1]
        head_of = {int(h): d for d, h in enumerate(corpus.heads)}
        lists.append([head_of[int(h)] for h in heads])
    counts = Counter(d for docs in lists for d in docs)
    top, top_n = counts.most_common(1)[0]
    assert top_n >= 20 * np.median(list(counts.values()))  # Zipf: the head dominates
    assert len(counts) < spec.documents  # many documents never drawn
    positions = Counter(docs.index(top) for docs in lists if top in docs)
    assert len(positions) == spec.retrieved[1]  # the same bytes at every position
    assert positions[0] < top_n / 2  # mostly not where a prefix cache could reuse it
    orders = {}
    for docs in lists:
        for x, y in itertools.combinations(docs, 2):
            orders.setdefault((min(x, y), max(x, y)), set()).add(x < y)
    assert sum(len(o) == 2 for o in orders.values()) >= 10  # pairs seen in both orders


def test_followups_and_context_budget():
    reqs = rag(30, 2, spec=SMALL)
    convs = by_conversation(reqs)
    with_followups = sum(len(steps) > 1 for steps in convs.values())
    assert 0.25 < with_followups / len(convs) < 0.55  # followup_share 0.4
    assert max(len(s) for s in convs.values()) <= 1 + SMALL.followups[1]
    for steps in convs.values():
        for prev, r in zip(steps, steps[1:]):
            tail = r.prompt[prev.prompt_len + prev.output_len:]
            assert tail[0] == USER and list(tail[-2:]) == [EOT, ASSISTANT]
    capped = dataclasses.replace(SMALL, max_prompt_tokens=150)
    corpus = Corpus(capped, 2)
    full = Corpus(SMALL, 2)
    kept = 0
    uncapped = {(r.conversation_id, r.turn): r for r in reqs}
    for a in rag(30, 2, spec=capped):
        assert a.prompt_len <= 150
        if a.turn == 0:
            da = parse_first(a.prompt, corpus)[1]
            db = parse_first(uncapped[(a.conversation_id, 0)].prompt, full)[1]
            assert da == db[:len(da)] and len(da) >= 1  # the leading documents that fit
            kept += len(da) < len(db)
    assert kept > 0


def test_default_size_and_ceiling():
    stats = summarize(rag(100, 0), page_tokens=256)
    assert 1500 < stats.requests < 3500 and 10e6 < stats.prompt_tokens < 40e6
    assert 0.3 < stats.reuse_ratio < 0.7


def test_trace_round_trip_and_determinism(small, tmp_path):
    path = tmp_path / "rag.jsonl"
    write_trace(small, path, block_size=16)
    loaded = load_trace(path)
    check_workload(loaded)
    assert reusable_per_request(loaded, page_tokens=16) == reusable_per_request(small, page_tokens=16)
    again = rag(12, SEED, spec=SMALL)
    assert [(r.conversation_id, r.arrival_s, r.prompt.tobytes(), r.output.tobytes()) for r in small] == \
        [(r.conversation_id, r.arrival_s, r.prompt.tobytes(), r.output.tobytes()) for r in again]
    fewer = by_conversation(rag(3, SEED, spec=SMALL))
    mine = by_conversation(small)
    assert all([r.prompt.tobytes() for r in steps] == [r.prompt.tobytes() for r in mine[cid]]
               for cid, steps in fewer.items())
    assert small[0].prompt[0] == BOS and small[0].prompt[1] == SYSTEM and small[0].prompt[2] >= FIRST_TEXT_ID


def test_bad_input_names_the_field():
    for kw, name in (({"retrieved": (3, 10), "documents": 5}, "retrieved"), ({"popularity": -1.0}, "popularity"),
                     ({"followup_share": 1.5}, "followup_share"), ({"documents": 200_000}, "documents"),
                     ({"document_len": (0, 5)}, "document_len"), ({"max_prompt_tokens": 50}, "max_prompt_tokens"),
                     ({"query_gap_s": -1}, "query_gap_s"), ({"queries": (0, 3)}, "queries")):
        with pytest.raises(ConfigError, match=name):
            RagSpec(**kw)
    with pytest.raises(ConfigError, match="conversations"):
        rag(0, 0)
