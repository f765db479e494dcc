"""Synthetic multi-turn conversations: shared system prompts, random turns, optional documents.

Each conversation picks one of ``system_prompts`` system prompts (the prefix shared across
conversations), has a random number of turns with random user and output lengths, and may
open with a long document in its first user message (the long-context preset: few
conversations, prompts up to ~1M tokens, few at a time)::

    <bos><system> system prompt k <eot> <user> [document d] question 1 <eot> <assistant> | answer 1 <eot>
    <user> question 2 <eot> <assistant> | answer 2 <eot> ...

Token ids are drawn with numpy from streams keyed by (seed, what, index), so the same flags
give the same requests in every process, and a system prompt or document is the same token
sequence in every conversation that uses it. Generation is vectorised; a 1M-token document
takes a few milliseconds.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, TypedDict

import numpy as np

from hicache.engine.workloads._checks import LogNormal, Range, check_int as _check_int, check_length
from hicache.engine.workloads._checks import check_range as _check_range, draw as _draw, high
from hicache.engine.workloads._random import counter_tokens, stable_u64, stream
from hicache.engine.workloads.agentic import AgenticSpec, agentic
from hicache.engine.workloads.request import ArrivalSpec, Conversation, Request, schedule
from hicache.engine.workloads.tokenizer import (ASSISTANT, BOS, DEFAULT_VOCAB, EOT, FIRST_TEXT_ID,
                                                SYSTEM, USER)
from hicache.errors import ConfigError



@dataclass(frozen=True)
class SyntheticSpec:
    """Shape of a synthetic workload. Ranges are inclusive ``(low, high)`` token counts.

    ``documents``: number of distinct documents (None: one per conversation); only used
    with ``document_len`` (a range, or a :class:`LogNormal` for heavy-tailed contexts, as
    the ``mix`` workload's chat). ``max_prompt_tokens``: later turns whose prompt would exceed it
    are dropped; the first turn must always fit.
    """

    turns: Range = (2, 8)
    system_prompts: int = 4
    system_len: int = 1024
    user_len: Range = (32, 512)
    output_len: Range = (64, 512)
    document_len: Range | LogNormal | None = None
    documents: int | None = None
    max_prompt_tokens: int | None = None
    vocab_size: int = DEFAULT_VOCAB
    arrival_rate: float | None = 2.0
    think_time_s: float = 5.0
    max_active: int | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "turns", _check_range("turns", self.turns, 1))
        object.__setattr__(self, "user_len", _check_range("user_len", self.user_len, 0))
        object.__setattr__(self, "output_len", _check_range("output_len", self.output_len, 0))
        if self.document_len is not None:
            object.__setattr__(self, "document_len", check_length("document_len", self.document_len, 1))
        _check_int("system_prompts", self.system_prompts, 1)
        _check_int("system_len", self.system_len, 0)
        _check_int("documents", self.documents, 1, optional=True)
        _check_int("max_prompt_tokens", self.max_prompt_tokens, 1, optional=True)
        _check_int("vocab_size", self.vocab_size, FIRST_TEXT_ID + 2)
        ArrivalSpec(self.arrival_rate, self.think_time_s, self.max_active)  # validates them
        if self.max_prompt_tokens is not None and self.first_prompt_max() > self.max_prompt_tokens:
            raise ConfigError("max_prompt_tokens", self.max_prompt_tokens,
                              f"is below the longest possible first prompt ({self.first_prompt_max()} "
                              "tokens: system + document + user message + template tokens)")

    @property
    def arrivals(self) -> ArrivalSpec:
        return ArrivalSpec(self.arrival_rate, self.think_time_s, self.max_active)

    def first_prompt_max(self) -> int:
        doc = high(self.document_len) if self.document_len is not None else 0
        return 4 + self.system_len + doc + self.user_len[1] + 2  # bos sys .. eot user .. eot asst


class SyntheticOverrides(TypedDict, total=False):
    """Keyword overrides of :class:`SyntheticSpec` fields (checked by the spec itself)."""

    turns: Range
    system_prompts: int
    system_len: int
    user_len: Range
    output_len: Range
    document_len: Range | LogNormal | None
    documents: int | None
    max_prompt_tokens: int | None
    vocab_size: int
    arrival_rate: float | None
    think_time_s: float
    max_active: int | None


PRESETS: dict[str, SyntheticSpec | AgenticSpec] = {
    # Chat traffic: a few popular system prompts, 2-8 turns, a new conversation every 0.5 s.
    "chat": SyntheticSpec(),
    # Long chats: 6-12 turns, 30 s between turns. Other conversations' traffic pushes a
    # conversation's earlier turns off the device before its next turn arrives, so the
    # host and L3 tiers get to serve them (``hicache replay``'s main job).
    "multi-turn": SyntheticSpec(turns=(6, 12), think_time_s=30.0),
    # 1M-token context: each conversation opens with a 256K-1M token document and asks
    # 3-6 short questions about it; two conversations at a time.
    "long-context": SyntheticSpec(
        turns=(3, 6), system_prompts=1, system_len=512, user_len=(32, 256), output_len=(64, 512),
        document_len=(262_144, 1_000_000), max_prompt_tokens=1_048_576,
        arrival_rate=None, think_time_s=2.0, max_active=2),
    # The microbenchmark of vLLM #43447 (seed 002): 0.75M-1M token documents read one
    # after another, then each revisited with a follow-up question once all were read.
    # Revisit hits measure how much of the byte budget serves resumable prefixes.
    "long-revisit": SyntheticSpec(
        turns=(2, 2), system_prompts=1, system_len=512, user_len=(32, 256), output_len=(64, 512),
        document_len=(786_432, 1_000_000), max_prompt_tokens=1_048_576,
        arrival_rate=None, think_time_s=3600.0, max_active=None),
    # Agent / RL-rollout traffic (hicache.engine.workloads.agentic): 3-6 agent prompts of
    # 2K-8K tokens shared by every task; each task branches into 2-8 rollouts of 2-10 tool
    # steps. ``conversations`` counts tasks here (about 30 requests each).
    "agentic": AgenticSpec(),
}


def synthetic_spec(preset: str = "chat", *, base: SyntheticSpec | AgenticSpec | None = None,
                   **overrides: object) -> SyntheticSpec | AgenticSpec:
    """A preset (or ``base``) with some fields replaced; unknown presets or fields raise
    ConfigError. The ``agentic`` preset is an :class:`AgenticSpec` with its own fields."""
    if base is None:
        if preset not in PRESETS:
            raise ConfigError("preset", preset, f"must be one of {sorted(PRESETS)}")
        base = PRESETS[preset]
    known = {f.name for f in dataclasses.fields(base)}
    given: dict[str, Any] = dict(overrides)  # from flags or YAML: any key may arrive; the spec checks values
    for key, value in given.items():
        if key not in known:
            raise ConfigError(key, value, f"unknown synthetic option; expected one of {sorted(known)}")
    return dataclasses.replace(base, **given)


def _fixed_tokens(seed: int, what: str, index: int, n: int, vocab: int) -> np.ndarray:
    return counter_tokens(stable_u64("synthetic", seed, what, index), n, low=FIRST_TEXT_ID, high=vocab)


def conversation(spec: SyntheticSpec, seed: int, ci: int) -> Conversation:
    """Conversation ``ci`` (id ``syn-<ci>``) of ``spec`` under ``seed``."""
    rng = stream(seed, "synthetic", "conversation", ci)
    v = spec.vocab_size
    n_turns = _draw(rng, spec.turns)
    system = _fixed_tokens(seed, "system", int(rng.integers(spec.system_prompts)), spec.system_len, v)
    parts = [np.array([BOS, SYSTEM], np.int32), system, np.array([EOT], np.int32)]
    document = None
    if spec.document_len is not None:
        d = ci if spec.documents is None else int(rng.integers(spec.documents))
        d_len = _draw(stream(seed, "synthetic", "document", d), spec.document_len)
        document = _fixed_tokens(seed, "document", d, d_len, v)
    length = sum(len(p) for p in parts)
    turns = []
    for k in range(n_turns):
        user = rng.integers(FIRST_TEXT_ID, v, size=_draw(rng, spec.user_len), dtype=np.int32)
        answer = rng.integers(FIRST_TEXT_ID, v, size=_draw(rng, spec.output_len), dtype=np.int32)
        question = [np.array([USER], np.int32)] + ([document] if k == 0 and document is not None else [])
        question += [user, np.array([EOT, ASSISTANT], np.int32)]
        prompt_end = length + sum(len(p) for p in question)
        if k > 0 and spec.max_prompt_tokens is not None and prompt_end > spec.max_prompt_tokens:
            break
        output = [answer, np.array([EOT], np.int32)]
        parts += question + output
        length = prompt_end + len(answer) + 1
        turns.append((prompt_end, length))
    tokens = np.concatenate(parts)
    assert len(tokens) == length, f"synthetic conversation {ci}: {len(tokens)} != {length}"
    return Conversation(f"syn-{ci}", tokens, tuple(turns))


def synthetic(conversations: int = 100, seed: int = 0, *, preset: str = "chat",
              spec: SyntheticSpec | AgenticSpec | None = None, **overrides: object) -> list[Request]:
    """``conversations`` synthetic conversations, one request per turn, sorted by arrival.

    ``preset`` (a key of :data:`PRESETS`) gives the defaults; keyword overrides replace
    fields of its spec (``turns=(1, 4)``, ``arrival_rate=10.0``, ...), or pass a whole
    ``spec``. With ``agentic`` (an :class:`AgenticSpec`) ``conversations`` counts tasks, each
    of several rollouts (see :mod:`hicache.engine.workloads.agentic`). The same arguments
    give the same requests in every process.
    """
    _check_int("conversations", conversations, 1)
    _check_int("seed", seed, 0)
    spec = synthetic_spec(preset, base=spec, **overrides)
    if isinstance(spec, AgenticSpec):
        return agentic(conversations, seed, spec=spec)
    convs = [conversation(spec, seed, ci) for ci in range(conversations)]
    return schedule(convs, spec.arrivals, seed)
