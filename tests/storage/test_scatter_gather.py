"""Scatter/gather objects: an L3 object whose payload lives in several buffers.

An engine's page is often not one contiguous row (SGLang's page_first host page is a K
region and a V region; layer_first is one piece per layer and K/V). ``L3Store.get`` /
``put`` take a list of buffers per object; the payload is their concatenation, so the
same object can be written from pieces and read into one row, or the other way round.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from hicache.storage import L3Config, L3Store, open_backend
from hicache.storage.objects import HEADER_BYTES
from tests.redis_server import REDIS_SERVER, SKIP_REASON

from .conftest import page_hashes, rows

FP = "5ca77e59a74e0000"
# piece sizes of one object: a few large regions and some below the RESP client's
# direct-read threshold (16 KiB), so both read paths fill pieces
SPLIT = [40_000, 4_000, 100, 60_000, 20_000]
PAYLOAD = sum(SPLIT)


@pytest.fixture(params=["memory", "file", "redis", "cluster"])
def store(request, tmp_path):
    kind = request.param
    if kind == "memory":
        url = "memory://"
    elif kind == "file":
        url = f"file://{tmp_path}/l3"
    else:
        if REDIS_SERVER is None:
            pytest.skip(SKIP_REASON)
        request.applymarker(pytest.mark.redis)
        fixture = "redis_server" if kind == "redis" else "redis_cluster"
        url = request.getfixturevalue(fixture).url
    s = L3Store(open_backend(url), FP, request.node.name, L3Config(read_batch=3))
    yield s
    s.close()


def split(row: np.ndarray, sizes=SPLIT) -> list[np.ndarray]:
    """Views of ``row`` cut at ``sizes`` (no copies: writing a piece writes the row)."""
    out, off = [], 0
    for n in sizes:
        out.append(row[off:off + n])
        off += n
    assert off == row.nbytes
    return out


def test_pieces_round_trip_in_any_split(store):
    hs = page_hashes(5, "sg")
    src = rows(5, PAYLOAD, seed=11)
    # written from pieces (torch and numpy mixed), read into whole rows
    pieces = [[torch.from_numpy(p) if j % 2 else p for j, p in enumerate(split(r))] for r in src]
    assert store.put(hs, "page", pieces) == [True] * 5
    whole = np.zeros_like(src)
    r = store.get(hs, "page", list(whole))
    assert (r.hits, r.nbytes, r.stopped) == (5, 5 * PAYLOAD, None)
    assert np.array_equal(whole, src)
    # read into pieces of another split, each piece its own allocation
    other = [7, 99_993, 24_000, 100]
    dsts = [[np.zeros(n, np.uint8) for n in other] for _ in hs]
    assert store.get(hs, "page", dsts).hits == 5
    for row, ds in zip(src, dsts):
        assert np.array_equal(np.concatenate(ds), row)
    # written whole, read into pieces that are views of one destination row
    hs2 = page_hashes(2, "sg-whole")
    assert store.put(hs2, "page", list(src[:2])) == [True, True]
    out = np.zeros((2, PAYLOAD), np.uint8)
    assert store.get(hs2, "page", [split(r) for r in out]).hits == 2
    assert np.array_equal(out, src[:2])


def test_async_backup_of_pieces(store):
    hs = page_hashes(4, "sg-async")
    src = rows(4, PAYLOAD, seed=12)
    t = store.put_async(hs, "page", [split(r) for r in src])
    assert t.wait(10) and t.ok and t.nbytes == 4 * PAYLOAD
    dst = np.zeros_like(src)
    assert store.get(hs, "page", [split(r) for r in dst]).hits == 4
    assert np.array_equal(dst, src)


def test_wrong_total_size_is_rejected_before_any_piece_is_written(store):
    hs = page_hashes(2, "sg-size")
    src = rows(2, PAYLOAD, seed=13)
    store.put(hs, "page", [split(r) for r in src])
    short = [np.full(n, 0xAB, np.uint8) for n in SPLIT[:-1]]     # 20,000 bytes too few
    r = store.get(hs[:1], "page", [short])
    assert (r.hits, r.stopped) == (0, "wrong_size")
    assert all((p == 0xAB).all() for p in short)
    assert store.stats(backend=False).rejected == {"wrong_size": 1}


def test_damage_in_a_later_piece_is_caught_by_the_checksum(store):
    hs = page_hashes(3, "sg-corrupt")
    src = rows(3, PAYLOAD, seed=14)
    store.put(hs, "page", [split(r) for r in src])
    key = store.key(hs[1], "page")
    raw = bytearray(HEADER_BYTES + PAYLOAD)
    assert store.backend.get_into([key], [raw]) == [len(raw)]
    raw[HEADER_BYTES + PAYLOAD - 5] ^= 0x01        # inside the last piece
    assert store.backend.put([key], [bytes(raw)]) == [True]
    dst = np.zeros_like(src)
    r = store.get(hs, "page", [split(row) for row in dst])
    assert (r.hits, r.stopped) == (1, "corrupt")
    assert np.array_equal(dst[0], src[0])
