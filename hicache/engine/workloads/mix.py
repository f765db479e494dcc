"""A blend of traffic shapes on one server: chat without a system prompt, reasoning chat,
agent rollouts and document QA, with heavy-tailed contexts and bursty or Poisson arrivals.

A real deployment does not serve one shape at a time. Each *unit* -- a chat conversation,
a reasoning conversation, an agentic task (its rollouts), a RAG session (its questions) --
is drawn from ``weights`` (chat, reasoning, agentic, rag) and built by that family's own
code, so each keeps its own resume rule: chat turns resume through the previous output,
reasoning turns at the previous prompt's end, agent steps through the previous call and the
shared agent prompt, RAG questions at a shared instruction and follow-ups through the
previous answer. The policy is judged on all of them at once, competing for the same bytes.

Heavy tails. Chat and reasoning conversations open with a pasted context (a file, an
article) of ``context_len`` tokens, and the RAG corpus's documents are ``document_len``
long; both are :class:`LogNormal`, clipped, so most prompts are a few thousand tokens and
a few are a hundred thousand:

====================  ==============================  =====================================
field                 default                         tail
====================  ==============================  =====================================
``context_len``       median 2,000, sigma 1.7,        9% of contexts > 10x the median,
                      in [16, 120,000]                0.8% reach the 120,000 clip
``document_len``      median 700, sigma 1.0,          1% of documents > 10x the median
                      in [64, 32,768]
``max_prompt_tokens`` 131,072                         later turns that would exceed it are
                                                      dropped; a RAG question keeps the
                                                      leading documents that fit
====================  ==============================  =====================================

Agentic prompts keep :class:`AgenticSpec`'s ranges (their longest possible prompt is
checked against ``max_prompt_tokens``).

Arrivals (``arrival_process``). ``poisson``: units start as a Poisson process of
``arrival_rate`` per second. ``bursty``: an on/off process with the same long-run rate
(:func:`~hicache.engine.workloads.request.bursty_starts`): ON periods of mean
``burst_on_s`` at ``arrival_rate * (on + off) / on`` per second, silent OFF periods of mean
``burst_off_s`` -- a burst of new prefixes lands while the previous burst's conversations
are still live, which is when eviction choices cost the most. Within a unit, each family's
own timing applies (think times, rollout spread, gaps between a session's questions).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from hicache.engine.workloads._checks import LogNormal, check_int
from hicache.engine.workloads._random import stream
from hicache.engine.workloads.agentic import AgenticSpec, agent_prompts, task_head_offset, task_unit
from hicache.engine.workloads.rag import Corpus, RagSpec, session
from hicache.engine.workloads.reasoning import ReasoningSpec
from hicache.engine.workloads.reasoning import conversation as reasoning_conversation
from hicache.engine.workloads.request import (ArrivalSpec, Conversation, Request, bursty_starts, poisson_starts,
                                              schedule)
from hicache.engine.workloads.synthetic import SyntheticSpec
from hicache.engine.workloads.synthetic import conversation as chat_conversation
from hicache.errors import ConfigError
from hicache.units import check_number

MIX_FAMILIES = ("chat", "reasoning", "agentic", "rag")
ARRIVAL_PROCESSES = ("poisson", "bursty")
MAX_PROMPT = 131_072
CONTEXT_LEN = LogNormal(median=2000, sigma=1.7, low=16, high=120_000)
DOCUMENT_LEN = LogNormal(median=700, sigma=1.0, low=64, high=32_768)


@dataclass(frozen=True)
class MixSpec:
    """Shape of the mix. ``weights``: relative shares of units per family, in the order
    (chat, reasoning, agentic, rag); the component specs give each family's shape (their
    defaults carry the heavy-tailed lengths and the prompt cap, see the module doc)."""

    weights: tuple[float, float, float, float] = (0.35, 0.25, 0.15, 0.25)
    arrival_process: str = "bursty"
    arrival_rate: float = 0.3
    burst_on_s: float = 15.0
    burst_off_s: float = 45.0
    max_prompt_tokens: int = MAX_PROMPT
    chat: SyntheticSpec = field(default_factory=lambda: SyntheticSpec(
        turns=(2, 8), system_prompts=1, system_len=0, document_len=CONTEXT_LEN, max_prompt_tokens=MAX_PROMPT,
        think_time_s=20.0))
    reasoning: ReasoningSpec = field(default_factory=lambda: ReasoningSpec(
        context_len=CONTEXT_LEN, max_prompt_tokens=MAX_PROMPT))
    agentic: AgenticSpec = field(default_factory=AgenticSpec)
    rag: RagSpec = field(default_factory=lambda: RagSpec(document_len=DOCUMENT_LEN, max_prompt_tokens=MAX_PROMPT))

    def __post_init__(self) -> None:
        w = self.weights
        if not (isinstance(w, (tuple, list)) and len(w) == len(MIX_FAMILIES)):
            raise ConfigError("weights", w, f"must be {len(MIX_FAMILIES)} numbers, one per {MIX_FAMILIES}")
        for name, x in zip(MIX_FAMILIES, w):
            check_number(f"weights.{name}", x, positive=False, minimum=0, reason="must be a number >= 0")
        if sum(w) <= 0:
            raise ConfigError("weights", w, "must not all be 0")
        object.__setattr__(self, "weights", tuple(float(x) for x in w))
        if self.arrival_process not in ARRIVAL_PROCESSES:
            raise ConfigError("arrival_process", self.arrival_process, f"must be one of {ARRIVAL_PROCESSES}")
        for name in ("arrival_rate", "burst_on_s", "burst_off_s"):
            check_number(name, getattr(self, name), reason="must be a positive number")
        check_int("max_prompt_tokens", self.max_prompt_tokens, 1)
        for name, spec_type in (("chat", SyntheticSpec), ("reasoning", ReasoningSpec), ("agentic", AgenticSpec),
                                ("rag", RagSpec)):
            if not isinstance(getattr(self, name), spec_type):
                raise ConfigError(name, getattr(self, name), f"must be a {spec_type.__name__}")
        for name in ("chat", "reasoning", "rag"):
            cap = getattr(self, name).max_prompt_tokens
            if cap is None or cap > self.max_prompt_tokens:
                raise ConfigError(f"{name}.max_prompt_tokens", cap, f"must be set and <= {self.max_prompt_tokens}")
        if self.agentic.longest_prompt() > self.max_prompt_tokens:
            raise ConfigError("agentic", self.agentic.longest_prompt(),
                              f"rollouts can grow past max_prompt_tokens ({self.max_prompt_tokens})")


def unit_families(spec: MixSpec, units: int, seed: int) -> list[str]:
    """Which family each unit is; unit ``i``'s draw does not depend on how many are drawn."""
    cum = np.cumsum(spec.weights) / sum(spec.weights)
    u = stream(seed, "mix", "families").random(units)
    return [MIX_FAMILIES[min(int(np.searchsorted(cum, x, side="right")), len(MIX_FAMILIES) - 1)] for x in u]


def mix(units: int = 100, seed: int = 0, *, spec: MixSpec | None = None) -> list[Request]:
    """``units`` units (conversations, tasks, sessions) drawn from the blend, one request per
    turn, sorted by arrival. The same arguments give the same requests in every process."""
    spec = MixSpec() if spec is None else spec
    check_int("conversations", units, 1)
    check_int("seed", seed, 0)
    families = unit_families(spec, units, seed)
    if spec.arrival_process == "poisson":
        starts = poisson_starts(units, spec.arrival_rate, seed)
    else:
        starts = bursty_starts(units, spec.arrival_rate, spec.burst_on_s, spec.burst_off_s, seed)
    prompts = agent_prompts(spec.agentic, seed) if "agentic" in families else []
    head_offset = task_head_offset(spec.agentic, seed)
    corpus = Corpus(spec.rag, seed) if "rag" in families else None
    convs: list[Conversation] = []
    conv_starts: list[float] = []
    think: list[float] = []
    for i, family in enumerate(families):
        unit: list[tuple[Conversation, float]]
        if family == "chat":
            unit, pace = [(chat_conversation(spec.chat, seed, i), 0.0)], spec.chat.think_time_s
        elif family == "reasoning":
            unit, pace = [(reasoning_conversation(spec.reasoning, seed, i), 0.0)], spec.reasoning.think_time_s
        elif family == "agentic":
            unit, pace = task_unit(spec.agentic, seed, i, prompts, head_offset), spec.agentic.think_time_s
        else:
            assert corpus is not None
            unit, pace = session(spec.rag, seed, i, corpus), spec.rag.think_time_s
        for conv, offset in unit:
            convs.append(conv)
            conv_starts.append(float(starts[i]) + offset)
            think.append(pace)
    return schedule(convs, ArrivalSpec(None, 0.0), seed, starts=conv_starts, think_s=think)
