"""Multi-turn chat with a reasoning model: each turn decodes thinking + answer, and later
prompts keep only the answers.

DeepSeek-R1/V3.1/V4-style chat templates drop earlier turns' reasoning from the history:
the model decodes ``<think> thinking </think> answer <eot>``, but the next turn's prompt
holds only ``answer <eot>``::

    buffer   <bos><system> s <eot> <user> u1 <eot> <assistant> | a1 <eot> <user> u2 <eot> <assistant> | a2 <eot>
    turn 0   |-------------- prompt 0 -------------------------|
             output 0 = <think> t1 </think> a1 <eot>            (decoded; t1 is never seen again)
    turn 1   |------------------------------- prompt 1 -------------------------------------|
             output 1 = <think> t2 </think> a2 <eot>

So turn k+1's prompt is turn k's prompt + ``answer_k <eot>`` + the next user message: it
starts with turn k's prompt exactly and leaves it at the very next token (turn k's output
opens with ``<think>``, id 6, where turn k+1 has the answer's first text token). Why the
shape matters: the thinking is several times longer than the answer, so most decoded pages
are dead on arrival -- a cache that keeps what it decoded, as it should for ordinary chat,
fills with pages no later prompt contains, and the page holding turn k's prompt end is
never reusable (its tail differs). The next request resumes at the previous *prompt's*
end, not through the previous output.

(DeepSeek-V3.1's template ends the generation prompt with ``<think>`` and renders history
as ``</think> answer``, so there the shared part ends one token earlier; in whole pages
that differs only when the prompt ends exactly on a page boundary.)

Token ids come from streams keyed by (seed, what, index), as in :mod:`.synthetic`; the
same flags give the same requests in every process.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from hicache.engine.workloads._checks import LogNormal, Range, check_int, check_length, check_range, draw, high
from hicache.engine.workloads._random import counter_tokens, stable_u64, stream
from hicache.engine.workloads.request import ArrivalSpec, Conversation, Request, schedule
from hicache.engine.workloads.tokenizer import (ASSISTANT, BOS, DEFAULT_VOCAB, END_THINK, EOT, FIRST_TEXT_ID,
                                                SYSTEM, THINK, USER)
from hicache.errors import ConfigError


@dataclass(frozen=True)
class ReasoningSpec:
    """Shape of the reasoning workload. Lengths are inclusive ``(low, high)`` ranges of text
    tokens or a :class:`LogNormal`; template tokens come on top.

    ``thinking_len`` and ``answer_len``: what each turn decodes (``<think>``, the thinking,
    ``</think>``, the answer, ``<eot>``); later prompts keep the answer only.
    ``context_len``: a pasted context (file, article) opening the first user message, or
    None. ``max_prompt_tokens``: later turns whose prompt would exceed it are dropped.
    """

    turns: Range = (6, 16)
    system_prompts: int = 4
    system_len: int = 1024
    user_len: Range | LogNormal = (32, 1024)
    thinking_len: Range | LogNormal = (512, 6144)
    answer_len: Range | LogNormal = (64, 768)
    context_len: Range | LogNormal | None = None
    max_prompt_tokens: int | None = None
    vocab_size: int = DEFAULT_VOCAB
    arrival_rate: float | None = 1.0
    think_time_s: float = 30.0
    max_active: int | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "turns", check_range("turns", self.turns, 1))
        for name, minimum in (("user_len", 0), ("thinking_len", 0), ("answer_len", 1)):
            object.__setattr__(self, name, check_length(name, getattr(self, name), minimum))
        if self.context_len is not None:
            object.__setattr__(self, "context_len", check_length("context_len", self.context_len, 1))
        check_int("system_prompts", self.system_prompts, 1)
        check_int("system_len", self.system_len, 0)
        check_int("max_prompt_tokens", self.max_prompt_tokens, 1, optional=True)
        check_int("vocab_size", self.vocab_size, FIRST_TEXT_ID + 2)
        ArrivalSpec(self.arrival_rate, self.think_time_s, self.max_active)  # validates them
        if self.max_prompt_tokens is not None and self.first_prompt_max() > self.max_prompt_tokens:
            raise ConfigError("max_prompt_tokens", self.max_prompt_tokens,
                              f"is below the longest possible first prompt ({self.first_prompt_max()} "
                              "tokens: system + context + user message + template tokens)")

    @property
    def arrivals(self) -> ArrivalSpec:
        return ArrivalSpec(self.arrival_rate, self.think_time_s, self.max_active)

    def first_prompt_max(self) -> int:
        context = high(self.context_len) if self.context_len is not None else 0
        return 4 + self.system_len + context + high(self.user_len) + 2  # bos sys .. eot user .. eot asst


def _fixed_tokens(seed: int, what: str, index: int, n: int, vocab: int) -> np.ndarray:
    return counter_tokens(stable_u64("reasoning", seed, what, index), n, low=FIRST_TEXT_ID, high=vocab)


def conversation(spec: ReasoningSpec, seed: int, ci: int) -> Conversation:
    """Conversation ``ci`` (id ``reason-<ci>``): one buffer of prompts and kept answers, and
    per turn the decoded ``<think> thinking </think> answer <eot>``."""
    rng = stream(seed, "reasoning", "conversation", ci)
    v = spec.vocab_size
    n_turns = draw(rng, spec.turns)
    system = _fixed_tokens(seed, "system", int(rng.integers(spec.system_prompts)), spec.system_len, v)
    parts = [np.array([BOS, SYSTEM], np.int32), system, np.array([EOT], np.int32)]
    context = None
    if spec.context_len is not None:
        context = rng.integers(FIRST_TEXT_ID, v, size=draw(rng, spec.context_len), dtype=np.int32)
    length = sum(len(p) for p in parts)
    turns, decoded = [], []
    for k in range(n_turns):
        user = rng.integers(FIRST_TEXT_ID, v, size=draw(rng, spec.user_len), dtype=np.int32)
        thinking = rng.integers(FIRST_TEXT_ID, v, size=draw(rng, spec.thinking_len), dtype=np.int32)
        answer = rng.integers(FIRST_TEXT_ID, v, size=draw(rng, spec.answer_len), dtype=np.int32)
        question = [np.array([USER], np.int32)] + ([context] if k == 0 and context is not None else [])
        question += [user, np.array([EOT, ASSISTANT], np.int32)]
        prompt_end = length + sum(len(p) for p in question)
        if k > 0 and spec.max_prompt_tokens is not None and prompt_end > spec.max_prompt_tokens:
            break
        kept = [answer, np.array([EOT], np.int32)]
        parts += question + kept
        length = prompt_end + len(answer) + 1
        turns.append((prompt_end, length))
        decoded.append(np.concatenate([np.array([THINK], np.int32), thinking, np.array([END_THINK], np.int32),
                                       answer, np.array([EOT], np.int32)]))
    tokens = np.concatenate(parts)
    assert len(tokens) == length, f"reasoning conversation {ci}: {len(tokens)} != {length}"
    return Conversation(f"reason-{ci}", tokens, tuple(turns), tuple(decoded))


def reasoning(conversations: int = 100, seed: int = 0, *, spec: ReasoningSpec | None = None) -> list[Request]:
    """``conversations`` reasoning conversations, one request per turn, sorted by arrival.

    The same arguments give the same requests in every process; conversation ``ci`` does
    not depend on how many are drawn.
    """
    spec = ReasoningSpec() if spec is None else spec
    check_int("conversations", conversations, 1)
    check_int("seed", seed, 0)
    return schedule([conversation(spec, seed, ci) for ci in range(conversations)], spec.arrivals, seed)
