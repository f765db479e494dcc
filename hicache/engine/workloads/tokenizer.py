"""A deterministic chat tokeniser that needs no download.

The cache only sees token ids, so the workloads need ids that behave like a real tokeniser's
(equal text -> equal ids, a plausible number of tokens per word, role separators), not a
real vocabulary. Text is split into pieces roughly the way byte-level BPE pre-tokenisers do
(a word with its leading space, at most 8 letters per piece, digits in groups of up to 3,
punctuation, whitespace runs), and each piece maps to an id by keyed BLAKE2b modulo the
vocabulary size. BLAKE2b rather than Python's ``hash()``: the latter is salted per process,
and the same text must give the same ids in every process and on every machine.

Chat template (one conversation, messages tokenised one at a time so a prompt is always a
prefix of the next turn's prompt)::

    <bos> <system> system text <eot> <user> u1 <eot> <assistant> a1 <eot> <user> u2 <eot> ...
    |------------------------ prompt of turn 1 -------------------------|
                                                                  |- output 1 -|

The ``<assistant>`` header closes the prompt; the assistant's text and its ``<eot>`` are the
turn's output, which the engine decodes.
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass, field

import numpy as np

from hicache.errors import ConfigError
from hicache.units import check_int

# Special ids live below FIRST_TEXT_ID; text pieces never map there. 6-8 mark a reasoning
# model's thinking (``<think> ... </think>``, decoded, dropped from later prompts) and a
# retrieved document (``<doc>``, the RAG workload); 9-15 are free.
BOS, EOT, SYSTEM, USER, ASSISTANT, TOOL = 0, 1, 2, 3, 4, 5
THINK, END_THINK, DOC = 6, 7, 8
FIRST_TEXT_ID = 16
DEFAULT_VOCAB = 129_280  # DeepSeek-V3/V4's vocabulary size
ROLE_TOKENS = {"system": SYSTEM, "user": USER, "assistant": ASSISTANT, "tool": TOOL}

# Pieces, in order of preference: letters (any script, <= 8 per piece, optional leading
# space), digits (<= 3), one punctuation mark (optional leading space), whitespace that is
# not the space before a word, and any remaining single character (e.g. "_").
_PIECE_RE = re.compile(r" ?[^\W\d_]{1,8}| ?\d{1,3}| ?[^\w\s]|\s+(?!\S)|\s+|.", re.S)


@dataclass
class ChatTokenizer:
    """Text -> int32 ids, deterministic across processes; ``key`` selects a hash family."""

    vocab_size: int = DEFAULT_VOCAB
    key: bytes = b"hicache-tok-v1"
    _cache: dict[str, int] = field(default_factory=dict, init=False, repr=False)

    def __post_init__(self) -> None:
        check_int("vocab_size", self.vocab_size, minimum=FIRST_TEXT_ID + 2,
                  reason=f"must be an integer > {FIRST_TEXT_ID + 1}")

    def piece_id(self, piece: str) -> int:
        cached = self._cache.get(piece)
        if cached is None:
            digest = hashlib.blake2b(piece.encode("utf-8"), digest_size=8, key=self.key).digest()
            cached = FIRST_TEXT_ID + int.from_bytes(digest, "little") % (self.vocab_size - FIRST_TEXT_ID)
            if len(self._cache) < 1_000_000:
                self._cache[piece] = cached
        return cached

    @staticmethod
    def pieces(text: str) -> list[str]:
        return _PIECE_RE.findall(text)

    def encode(self, text: str) -> np.ndarray:
        """The ids of ``text`` (no special tokens)."""
        return np.fromiter((self.piece_id(p) for p in _PIECE_RE.findall(text)), dtype=np.int32)

    def encode_message(self, role: str, text: str) -> np.ndarray:
        """``<role> text <eot>``: one message of the chat template."""
        if role not in ROLE_TOKENS:
            raise ConfigError("role", role, f"must be one of {sorted(ROLE_TOKENS)}")
        body = self.encode(text)
        out = np.empty(len(body) + 2, dtype=np.int32)
        out[0] = ROLE_TOKENS[role]
        out[1:-1] = body
        out[-1] = EOT
        return out
