"""Reading a cut-off ShareGPT file item by item, and rejoining `<id>_<start>` chunks."""

from __future__ import annotations

import io
import json
import random

import pytest

from hicache.engine.workloads.sharegpt_file import (JsonArrayReader, RejoinReport, rejoin_chunks,
                                                    split_chunk_id)
from hicache.errors import ConfigError
from tests.engine.workloads.helpers import conv_messages, msg, sharegpt_bytes, small_sharegpt_items


def read(data: bytes, chunk_bytes: int = 4 << 20) -> tuple[list, JsonArrayReader]:
    reader = JsonArrayReader(io.BytesIO(data), chunk_bytes=chunk_bytes)
    return list(reader), reader


def item_ends(text: str) -> list[int]:
    """Reference: where each element of a *complete* array ends (stdlib decoder)."""
    dec, pos, ends = json.JSONDecoder(), text.index("[") + 1, []
    while True:
        while text[pos] in " \n,":
            pos += 1
        if text[pos] == "]":
            return ends
        _, pos = dec.raw_decode(text, pos)
        ends.append(pos)


def test_complete_file_small_and_tiny_buffers():
    items = small_sharegpt_items()
    data = sharegpt_bytes(items)
    for chunk in (4 << 20, 64, 7, 1):
        got, reader = read(data, chunk)
        assert got == items and reader.complete and reader.dropped_chars == 0 and reader.items == 10


def test_elements_split_across_buffer_refills():
    data = b'[1, 23456, "abcdef", {"a": [1, 2, 3]}, 7.25, true]'
    for chunk in (1, 2, 3, 5, 8):
        got, reader = read(data, chunk)
        assert got == [1, 23456, "abcdef", {"a": [1, 2, 3]}, 7.25, True] and reader.complete


def test_every_cut_point_stops_at_the_last_complete_item():
    items = small_sharegpt_items()[:5]
    data = sharegpt_bytes(items)
    text = data.decode()
    assert len(text) == len(data)  # ASCII: byte offsets are character offsets
    ends = item_ends(text)
    assert len(ends) == 5
    for cut in range(text.index("[") + 1, len(data)):
        got, reader = read(data[:cut], chunk_bytes=97)
        expected = sum(1 for e in ends if e <= cut)
        assert got == items[:expected], cut
        assert not reader.complete
        # what was skipped: from the start of the cut-off element to the cut
        tail = text[ends[expected - 1] if expected else text.index("[") + 1:cut]
        assert reader.dropped_chars == len(tail.lstrip(" \n,")), cut
    got, reader = read(data)
    assert got == items and reader.complete


def test_cut_inside_a_multibyte_character():
    items = [{"id": "a_0", "conversations": [msg("human", "caf\u00e9 \u2713")]},
             {"id": "b_0", "conversations": [msg("human", "\u2713\u2713\u2713 ok")]}]
    data = sharegpt_bytes(items)
    cut = data.index("\u2713\u2713".encode()) + 1  # in the middle of a 3-byte character
    got, reader = read(data[:cut], chunk_bytes=5)
    assert got == items[:1] and not reader.complete


def test_malformed_item_in_the_middle_raises():
    data = b'[{"id": "a_0", "conversations": []}, {"id": "b_0", oops}, {"id": "c_0", "conversations": []}]'
    with pytest.raises(ConfigError, match="element 1 is not valid JSON"):
        read(data)
    with pytest.raises(ConfigError, match="not a JSON array"):
        read(b'{"id": "a"}')
    with pytest.raises(ConfigError, match="not a JSON array"):
        read(b"   ")


def test_split_chunk_id():
    assert split_chunk_id("QWJhYvA_0") == ("QWJhYvA", 0)
    assert split_chunk_id("a_b_17") == ("a_b", 17)
    assert split_chunk_id("plain") == ("plain", 0)


def test_rejoin_overlapping_and_adjacent_chunks():
    items = small_sharegpt_items()
    report = RejoinReport()
    convs = rejoin_chunks(items, report)
    assert [c.conversation_id for c in convs] == ["long"] + [f"c{i}" for i in range(7)]
    expected = [("user" if m["from"] == "human" else "assistant", m["value"])
                for m in conv_messages("long", 5)]
    assert list(convs[0].messages) == expected
    assert (report.chunks, report.conversations, report.multi_chunk) == (10, 8, 1)
    assert (report.overlapping_joins, report.adjacent_joins) == (1, 1)
    assert (report.cut_at_gap, report.cut_at_conflict) == (0, 0)
    shuffled = list(items)
    random.Random(3).shuffle(shuffled)
    by_id = {c.conversation_id: c for c in rejoin_chunks(shuffled)}
    assert by_id["long"] == convs[0]


def test_rejoin_cuts_at_gaps_and_conflicts_and_skips_empty_chunks():
    m = conv_messages("x", 4)  # 8 messages
    bad = dict(m[3], value="something else")
    items = [
        {"id": "gap_0", "conversations": m[0:4]}, {"id": "gap_6", "conversations": m[6:8]},
        {"id": "clash_0", "conversations": m[0:4]}, {"id": "clash_3", "conversations": [bad] + m[4:6]},
        {"id": "dup_0", "conversations": []}, {"id": "dup_0", "conversations": m[0:2]},
    ]
    report = RejoinReport()
    convs = {c.conversation_id: c for c in rejoin_chunks(items, report)}
    assert len(convs["gap"].messages) == 4 and len(convs["clash"].messages) == 4
    assert len(convs["dup"].messages) == 2
    assert (report.cut_at_gap, report.cut_at_conflict, report.empty_chunks) == (1, 1, 1)


def test_roles_are_mapped():
    items = [{"id": "r_0", "conversations": [msg("system", "s"), msg("human", "h"), msg("gpt", "g"),
                                             msg("user", "u"), msg("chatgpt", "c"), msg("bing", "b"),
                                             msg("bard", "d")]}]
    (conv,) = rejoin_chunks(items)
    assert [r for r, _ in conv.messages] == ["system", "user", "assistant", "user", "assistant",
                                             "assistant", "assistant"]


def test_bad_items_raise():
    with pytest.raises(ConfigError):
        rejoin_chunks([{"conversations": []}])
    with pytest.raises(ConfigError):
        rejoin_chunks([{"id": "a_0", "conversations": "hi"}])
    with pytest.raises(ConfigError):
        rejoin_chunks([{"id": "a_0", "conversations": [{"from": "human"}]}])
