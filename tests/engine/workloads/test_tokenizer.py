"""The chat tokeniser: pieces, deterministic ids, the template's special tokens."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from hicache.engine.workloads.tokenizer import (ASSISTANT, EOT, FIRST_TEXT_ID, SYSTEM, USER,
                                                ChatTokenizer)
from hicache.errors import ConfigError


def test_pieces_split_like_a_bpe_pretokeniser():
    assert ChatTokenizer.pieces("Hello, world!  It's 2024; internationalization_x\n\n  def f():") == [
        "Hello", ",", " world", "!", " ", " It", "'", "s", " 202", "4", ";",
        " internat", "ionaliza", "tion", "_", "x", "\n\n ", " def", " f", "(", ")", ":"]


@given(st.text(max_size=200))
@settings(max_examples=200, deadline=None)
def test_pieces_cover_the_text_exactly(text):
    assert "".join(ChatTokenizer.pieces(text)) == text


def test_same_piece_same_id_and_ids_in_range():
    tok = ChatTokenizer(vocab_size=1000)
    ids = tok.encode("the cat and the dog and the cat")
    assert ids.dtype == np.int32 and len(ids) == 8
    assert ids[0] != ids[3]  # "the" vs " the": a leading space is part of the piece
    assert ids[3] == ids[6] and ids[1] == ids[7] and ids[2] == ids[5]  # " the" " cat" " and"
    assert len(set(ids[[0, 1, 2, 3, 4]].tolist())) == 5
    assert ids.min() >= FIRST_TEXT_ID and ids.max() < 1000
    # a fresh tokeniser (empty cache) gives the same ids; another key gives other ids
    assert np.array_equal(ChatTokenizer(vocab_size=1000).encode("the cat and the dog and the cat"), ids)
    assert not np.array_equal(ChatTokenizer(vocab_size=1000, key=b"other").encode("the cat and the dog"),
                              ids[:5])


def test_encode_message_wraps_role_and_eot():
    tok = ChatTokenizer()
    body = tok.encode("hi there")
    for role, head in (("system", SYSTEM), ("user", USER), ("assistant", ASSISTANT)):
        out = tok.encode_message(role, "hi there")
        assert out[0] == head and out[-1] == EOT and np.array_equal(out[1:-1], body)
    assert list(tok.encode_message("user", "")) == [USER, EOT]


def test_bad_role_and_vocab_raise():
    with pytest.raises(ConfigError, match="role"):
        ChatTokenizer().encode_message("bot", "x")
    with pytest.raises(ConfigError, match="vocab_size"):
        ChatTokenizer(vocab_size=10)
