"""The mix: units drawn by weight and built by their own family's code, heavy-tailed and
capped prompt lengths, bursty arrivals measurably burstier than Poisson at the same rate,
bad input."""

from __future__ import annotations

import dataclasses
from collections import Counter

import numpy as np
import pytest

from hicache.engine.workloads import (AgenticSpec, LogNormal, MixSpec, RagSpec, ReasoningSpec, SyntheticSpec,
                                      bursty_starts, mix, poisson_starts, summarize)
from hicache.engine.workloads.mix import CONTEXT_LEN, MIX_FAMILIES, unit_families
from hicache.engine.workloads.reasoning import conversation as reasoning_conversation
from hicache.engine.workloads.synthetic import conversation as chat_conversation
from hicache.engine.workloads.tokenizer import BOS, EOT, SYSTEM, USER
from hicache.errors import ConfigError
from tests.engine.workloads.helpers import by_conversation, check_workload

SMALL = MixSpec(
    arrival_rate=1.0, burst_on_s=10.0, burst_off_s=30.0,
    chat=SyntheticSpec(turns=(1, 3), system_prompts=1, system_len=0, user_len=(5, 20), output_len=(5, 20),
                       document_len=LogNormal(50, 1.0, 1, 400), max_prompt_tokens=1000),
    reasoning=ReasoningSpec(turns=(2, 3), system_len=20, user_len=(5, 20), thinking_len=(20, 40),
                            answer_len=(5, 10), context_len=LogNormal(50, 1.0, 1, 400), max_prompt_tokens=1000),
    agentic=AgenticSpec(system_len=(30, 50), task_len=(5, 10), rollouts=(2, 3), steps=(2, 3), call_len=(3, 8),
                        result_len=(5, 20)),
    rag=RagSpec(documents=40, document_len=LogNormal(30, 1.0, 5, 200), retrieved=(2, 3), instruction_len=(20, 30),
                question_len=(3, 8), answer_len=(3, 8), queries=(2, 3), max_prompt_tokens=1000))


def test_units_come_from_their_families_code():
    reqs = mix(24, 2, spec=SMALL)
    check_workload(reqs, prefix_chain=False)
    families = unit_families(SMALL, 24, 2)
    assert set(families) == set(MIX_FAMILIES)
    prefix = {"chat": "syn", "reasoning": "reason", "agentic": "agent", "rag": "rag"}
    convs = by_conversation(reqs)
    units = Counter(int(cid.split("-")[1]) for cid in convs)
    assert sorted(units) == list(range(24))
    for cid, steps in convs.items():
        kind, unit = cid.split("-")[:2]
        assert kind == prefix[families[int(unit)]]
        for prev, r in zip(steps, steps[1:]):  # reasoning resumes at the prompt, the others through the output
            head = prev.prompt if kind == "reason" else np.concatenate([prev.prompt, prev.output])
            assert np.array_equal(r.prompt[:len(head)], head)
        if kind == "syn":  # the same conversation chat would build, without a system prompt
            conv = chat_conversation(SMALL.chat, 2, int(unit))
            assert np.array_equal(steps[-1].prompt, conv.tokens[:conv.turns[-1][0]])
            assert list(steps[0].prompt[:4]) == [BOS, SYSTEM, EOT, USER]
        if kind == "reason":
            conv = reasoning_conversation(SMALL.reasoning, 2, int(unit))
            assert [r.output.tobytes() for r in steps] == [conv.output(k).tobytes() for k in range(len(steps))]
    # unit i's family does not depend on how many units are drawn; weights steer the draw
    assert unit_families(SMALL, 10, 2) == families[:10]
    only_rag = dataclasses.replace(SMALL, weights=(0, 0, 0, 1))
    assert {r.conversation_id.split("-")[0] for r in mix(5, 2, spec=only_rag)} == {"rag"}


def test_heavy_tail_is_present_and_capped():
    draws = CONTEXT_LEN.draw(np.random.default_rng(0), size=200_000)
    median = np.median(draws)
    assert 1900 < median < 2100
    assert 0.07 < np.mean(draws > 10 * median) < 0.11  # sigma 1.7: 8.8% beyond 10x the median
    assert draws.max() == 120_000 and 0.005 < np.mean(draws == 120_000) < 0.011  # the clip
    # the default mix's chat and reasoning prompts carry it, and none exceeds 131,072 tokens
    spec = dataclasses.replace(MixSpec(), weights=(1, 1, 0, 0),
                               chat=dataclasses.replace(MixSpec().chat, turns=(1, 2)),
                               reasoning=dataclasses.replace(MixSpec().reasoning, turns=(1, 2)))
    reqs = mix(300, 0, spec=spec)
    firsts = np.array([r.prompt_len for r in reqs if r.turn == 0])
    assert np.percentile(firsts, 99) > 10 * np.median(firsts)
    assert firsts.max() > 60_000
    assert max(r.prompt_len for r in reqs) <= 131_072


def test_bursty_arrivals_are_burstier_than_poisson_at_the_same_rate():
    n, rate = 4000, 0.5
    poisson = poisson_starts(n, rate, 3)
    bursty = bursty_starts(n, rate, 30.0, 90.0, 3)
    for starts in (poisson, bursty):
        assert starts[0] == 0.0 and np.all(np.diff(starts) >= 0)
        assert 0.85 * rate < n / starts[-1] < 1.15 * rate  # the same long-run rate

    def cv(starts):
        gaps = np.diff(starts)
        return gaps.std() / gaps.mean()

    def dispersion(starts, window=60.0):
        counts = np.bincount((starts // window).astype(int))
        return counts.var() / counts.mean()

    assert 0.9 < cv(poisson) < 1.1 and cv(bursty) > 1.5
    assert 0.7 < dispersion(poisson) < 1.3 and dispersion(bursty) > 5
    # the mix: same units either way, only the start times differ
    a = mix(12, 1, spec=SMALL)
    b = mix(12, 1, spec=dataclasses.replace(SMALL, arrival_process="poisson"))
    assert sorted(r.prompt.tobytes() for r in a) == sorted(r.prompt.tobytes() for r in b)
    assert [r.arrival_s for r in a] != [r.arrival_s for r in b]


def test_default_size():
    stats = summarize(mix(100, 0), page_tokens=256)
    assert 1000 < stats.requests < 3000 and 8e6 < stats.prompt_tokens < 40e6
    assert stats.max_prompt_tokens <= 131_072


def test_bad_input_names_the_field():
    for kw, name in (({"weights": (1, 1)}, "weights"), ({"weights": (1, -1, 0, 0)}, "weights.reasoning"),
                     ({"weights": (0, 0, 0, 0)}, "weights"), ({"arrival_process": "uniform"}, "arrival_process"),
                     ({"burst_on_s": 0}, "burst_on_s"), ({"arrival_rate": -1}, "arrival_rate"),
                     ({"chat": SyntheticSpec()}, "chat.max_prompt_tokens"),
                     ({"rag": "rag"}, "rag"),
                     ({"agentic": AgenticSpec(steps=(2, 40), result_len=(100, 4000))}, "agentic")):
        with pytest.raises(ConfigError, match=name):
            dataclasses.replace(MixSpec(), **kw)
    with pytest.raises(ConfigError, match="conversations"):
        mix(0, 0)
    with pytest.raises(ConfigError, match="sigma"):
        LogNormal(100, -1, 1, 10)
