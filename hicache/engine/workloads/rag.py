"""Document QA / retrieval-augmented generation: popular documents, retrieved in a new order
each time.

A corpus of ``documents`` documents, each a fixed token sequence; a few instructions (the
service's system prompts); users in sessions, each asking several questions. A question
retrieves ``k`` distinct documents drawn by a Zipf-like popularity (document of rank r is
drawn with weight ``1 / (r + 1) ** popularity``), placed in a random order, the order a
retriever's relevance scores give, which has nothing to do with earlier requests::

    <bos><system> instruction i <eot> <user> <doc> d3 <doc> d17 <doc> d1 <eot> <user> question <eot> <assistant> | answer <eot>
    follow-up:  ... <assistant> answer <eot> <user> question 2 <eot> <assistant> | answer 2 <eot>

Some questions have follow-ups (``followup_share`` of them, ``followups`` turns each) on
the same retrieved set: those are ordinary multi-turn turns (prompt + output + the next
question).

Why the shape matters. The same bytes recur constantly -- a popular document is in a large
share of all prompts -- but a prefix cache can reuse a document only where everything
before it is identical: the instruction, then the same documents in the same order. So a
new question resumes at its instruction (or one of its first documents, when an earlier
question happened to retrieve the same leading documents) and computes the rest; only
follow-ups resume through the previous output. A policy that counts how often bytes recur
overrates document pages that sit behind different prefixes; what pays is the instruction,
the leading documents of popular orders, and the live follow-up threads.

Divergence is exact by construction: instructions and documents start with distinct token
ids, each document is preceded by ``<doc>`` (id 8) and the retrieved context closed by
``<eot>``, so two first turns share exactly ``<bos><system>`` (other instructions), or the
instruction, ``<user>`` and their longest common run of leading documents. Session ``s``
(``rag-<s>-<q>``, one conversation per question) does not depend on how many sessions are
drawn; the corpus depends only on the seed and its own fields.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from hicache.engine.workloads._checks import (LogNormal, Range, check_int, check_length, check_range, check_share,
                                              draw, draw_many, high)
from hicache.engine.workloads._random import counter_tokens, stable_u64, stream
from hicache.engine.workloads.request import ArrivalSpec, Conversation, Request, poisson_starts, schedule
from hicache.engine.workloads.tokenizer import (ASSISTANT, BOS, DEFAULT_VOCAB, DOC, EOT, FIRST_TEXT_ID, SYSTEM,
                                                USER)
from hicache.errors import ConfigError
from hicache.units import check_number


@dataclass(frozen=True)
class RagSpec:
    """Shape of the RAG workload. Lengths are inclusive ``(low, high)`` ranges of text
    tokens or a :class:`LogNormal`.

    ``documents``: corpus size; ``popularity``: the Zipf exponent (0: uniform); ``retrieved``:
    k per question; ``queries``: questions per session (each a new retrieval);
    ``followup_share``: share of questions that get follow-ups, ``followups`` turns each;
    ``max_prompt_tokens``: a question keeps only the leading documents that fit (a
    retriever's context budget), and follow-ups that do not fit are dropped.
    Arrivals: sessions start as a Poisson process of ``arrival_rate`` per second, a session's
    questions are an exponential ``query_gap_s`` apart, follow-ups ``think_time_s``.
    """

    documents: int = 5000
    document_len: Range | LogNormal = (256, 2048)
    popularity: float = 1.0
    retrieved: Range = (3, 8)
    instructions: int = 3
    instruction_len: Range = (512, 2048)
    question_len: Range | LogNormal = (16, 128)
    answer_len: Range | LogNormal = (64, 512)
    queries: Range = (4, 24)
    followup_share: float = 0.3
    followups: Range = (1, 3)
    max_prompt_tokens: int | None = None
    vocab_size: int = DEFAULT_VOCAB
    arrival_rate: float | None = 0.2
    query_gap_s: float = 30.0
    think_time_s: float = 15.0

    def __post_init__(self) -> None:
        for name, minimum in (("retrieved", 1), ("instruction_len", 1), ("queries", 1), ("followups", 1)):
            object.__setattr__(self, name, check_range(name, getattr(self, name), minimum))
        for name, minimum in (("document_len", 1), ("question_len", 1), ("answer_len", 1)):
            object.__setattr__(self, name, check_length(name, getattr(self, name), minimum))
        check_int("documents", self.documents, 1)
        check_int("instructions", self.instructions, 1)
        check_int("max_prompt_tokens", self.max_prompt_tokens, 1, optional=True)
        check_int("vocab_size", self.vocab_size, FIRST_TEXT_ID + 2)
        check_number("popularity", self.popularity, positive=False, minimum=0, reason="must be a number >= 0")
        check_share("followup_share", self.followup_share)
        check_number("query_gap_s", self.query_gap_s, positive=False, minimum=0,
                     reason="must be a number of seconds >= 0")
        ArrivalSpec(self.arrival_rate, self.think_time_s, None)  # validates them
        for name in ("documents", "instructions"):
            if getattr(self, name) > self.text_ids:
                raise ConfigError(name, getattr(self, name),
                                  f"cannot exceed the {self.text_ids} text ids (their first tokens are distinct)")
        if self.retrieved[1] > self.documents:
            raise ConfigError("retrieved", list(self.retrieved), f"cannot exceed documents ({self.documents})")
        if self.max_prompt_tokens is not None and self.first_prompt_max() > self.max_prompt_tokens:
            raise ConfigError("max_prompt_tokens", self.max_prompt_tokens,
                              f"is below the longest possible prompt with one document ({self.first_prompt_max()} "
                              "tokens: instruction + document + question + template tokens)")

    @property
    def text_ids(self) -> int:
        return self.vocab_size - FIRST_TEXT_ID

    def first_prompt_max(self) -> int:
        """The longest first prompt that keeps only its first document."""
        return prompt_len(self.instruction_len[1], [high(self.document_len)], high(self.question_len))


def prompt_len(instruction: int, documents: list[int], question: int) -> int:
    """Tokens of ``<bos><system> i <eot> <user> (<doc> d)* <eot> <user> q <eot> <assistant>``."""
    return 3 + instruction + 1 + sum(1 + d for d in documents) + 1 + 1 + question + 2


class Corpus:
    """The seed's documents and instructions: lengths, popularity, and tokens on demand."""

    def __init__(self, spec: RagSpec, seed: int):
        self.spec, self.seed = spec, seed
        n = spec.documents
        self.lengths = draw_many(stream(seed, "rag", "document-lengths"), spec.document_len, n)
        heads = FIRST_TEXT_ID + stream(seed, "rag", "heads").permutation(spec.text_ids)
        self.heads = heads[:n]
        rank = stream(seed, "rag", "popularity").permutation(n)  # document d has rank rank[d]
        weights = 1.0 / (rank + 1.0) ** spec.popularity
        self.p = weights / weights.sum()
        irng = stream(seed, "rag", "instructions")
        ihead = FIRST_TEXT_ID + irng.choice(spec.text_ids, size=spec.instructions, replace=False)
        self.instructions = []
        for i in range(spec.instructions):
            text = self._tokens("instruction", i, draw(irng, spec.instruction_len), int(ihead[i]))
            self.instructions.append(np.concatenate([np.array([BOS, SYSTEM], np.int32), text,
                                                     np.array([EOT], np.int32)]))
        self._docs: dict[int, np.ndarray] = {}

    def _tokens(self, what: str, index: int, n: int, head: int) -> np.ndarray:
        out = counter_tokens(stable_u64("rag", self.seed, what, index), n, low=FIRST_TEXT_ID,
                             high=self.spec.vocab_size)
        out[0] = head
        return out

    def document(self, d: int) -> np.ndarray:
        """``<doc>`` and document ``d``'s tokens (the same array every time)."""
        have = self._docs.get(d)
        if have is None:
            have = np.concatenate([np.array([DOC], np.int32),
                                   self._tokens("document", d, int(self.lengths[d]), int(self.heads[d]))])
            have.flags.writeable = False
            self._docs[d] = have
        return have

    def retrieve(self, rng: np.random.Generator, k: int) -> list[int]:
        """``k`` distinct documents drawn by popularity, in a random (relevance) order."""
        chosen = rng.choice(len(self.p), size=k, replace=False, p=self.p)
        return [int(d) for d in rng.permutation(chosen)]


def _text(rng: np.random.Generator, length: Range | LogNormal, vocab: int) -> np.ndarray:
    return rng.integers(FIRST_TEXT_ID, vocab, size=draw(rng, length), dtype=np.int32)


def question(spec: RagSpec, corpus: Corpus, rng: np.random.Generator, conversation_id: str,
             instruction: int) -> tuple[Conversation, list[int]]:
    """One question and its follow-ups on one retrieved set; the documents it kept."""
    v = spec.vocab_size
    docs = corpus.retrieve(rng, draw(rng, spec.retrieved))
    system = corpus.instructions[instruction]
    q = _text(rng, spec.question_len, v)
    if spec.max_prompt_tokens is not None:  # keep the leading documents that fit (at least one)
        while len(docs) > 1 and prompt_len(len(system) - 3, [int(corpus.lengths[d]) for d in docs],
                                           len(q)) > spec.max_prompt_tokens:
            docs.pop()
    parts = [system, np.array([USER], np.int32)] + [corpus.document(d) for d in docs]
    parts += [np.array([EOT, USER], np.int32), q, np.array([EOT, ASSISTANT], np.int32)]
    length = sum(len(p) for p in parts)
    turns = []
    n_turns = 1 + (draw(rng, spec.followups) if rng.random() < spec.followup_share else 0)
    for k in range(n_turns):
        if k > 0:
            q = _text(rng, spec.question_len, v)
            if spec.max_prompt_tokens is not None and length + len(q) + 3 > spec.max_prompt_tokens:
                break
            parts += [np.array([USER], np.int32), q, np.array([EOT, ASSISTANT], np.int32)]
            length += len(q) + 3
        answer = _text(rng, spec.answer_len, v)
        parts += [answer, np.array([EOT], np.int32)]
        turns.append((length, length + len(answer) + 1))
        length += len(answer) + 1
    tokens = np.concatenate(parts)
    assert len(tokens) == length, f"rag {conversation_id}: {len(tokens)} != {length}"
    return Conversation(conversation_id, tokens, tuple(turns)), docs


def session(spec: RagSpec, seed: int, s: int, corpus: Corpus) -> list[tuple[Conversation, float]]:
    """Session ``s``'s questions as conversations ``rag-<s>-<q>``, with their start offsets."""
    rng = stream(seed, "rag", "session", s)
    instruction = int(rng.integers(spec.instructions))
    out, offset = [], 0.0
    for q in range(draw(rng, spec.queries)):
        if q > 0:
            offset += float(rng.exponential(spec.query_gap_s)) if spec.query_gap_s > 0 else 0.0
        conv, _ = question(spec, corpus, stream(seed, "rag", "question", s, q), f"rag-{s}-{q}", instruction)
        out.append((conv, offset))
    return out


def rag(sessions: int = 100, seed: int = 0, *, spec: RagSpec | None = None) -> list[Request]:
    """``sessions`` user sessions of several questions each, one request per turn, sorted by
    arrival. The same arguments give the same requests in every process."""
    spec = RagSpec() if spec is None else spec
    check_int("conversations", sessions, 1)
    check_int("seed", seed, 0)
    corpus = Corpus(spec, seed)
    starts = poisson_starts(sessions, spec.arrival_rate, seed)
    convs, conv_starts = [], []
    for s in range(sessions):
        for conv, offset in session(spec, seed, s, corpus):
            convs.append(conv)
            conv_starts.append(float(starts[s]) + offset)
    return schedule(convs, ArrivalSpec(spec.arrival_rate, spec.think_time_s, None), seed, starts=conv_starts)
