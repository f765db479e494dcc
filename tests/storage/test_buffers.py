"""Deferred put pieces: made once, on first use, with the announced length."""

import numpy as np
import pytest

from hicache.errors import MisuseError
from hicache.storage.buffers import Deferred, resolve_pieces, send_pieces, value_views


def test_deferred_is_made_once_and_only_when_resolved():
    calls = []

    def make() -> bytes:
        calls.append(1)
        return b"abcd"

    d = Deferred(4, make)
    pieces = send_pieces([d, np.arange(3, dtype=np.uint8)])
    assert calls == [] and pieces[0] is d
    flat = resolve_pieces(pieces)
    assert [bytes(v) for v in flat] == [b"abcd", b"\x00\x01\x02"]
    assert bytes(value_views([d], writable=False)[0]) == b"abcd"
    assert calls == [1]


def test_deferred_with_wrong_length_is_an_invariant_failure():
    with pytest.raises(AssertionError, match="announced 5"):
        Deferred(5, lambda: b"abcd").resolve()


def test_deferred_cannot_be_a_read_destination():
    with pytest.raises(MisuseError, match="deferred"):
        value_views([Deferred(1, lambda: b"x")], writable=True)
