import binascii
import hashlib
import struct
import zlib

import pytest

from hicache.errors import MisuseError
from hicache.storage.objects import (HEADER_BYTES, MAGIC, ObjectCodec, ObjectKind, Reject, hash_bytes,
                                     make_namespace)

FP = "0123456789abcdef"


def test_namespace_is_deterministic_and_covers_salt():
    assert make_namespace(FP, "") == "hc1.0123456789abcdef." + hashlib.sha256(b"").hexdigest()[:8]
    assert make_namespace(FP, "") == "hc1.0123456789abcdef.e3b0c442"
    assert make_namespace(FP, "a") != make_namespace(FP, "b")
    assert make_namespace("fedcba9876543210", "a") != make_namespace(FP, "a")
    with pytest.raises(MisuseError):
        make_namespace("has space", "")


def test_keys_name_kind_and_hash():
    c = ObjectCodec(FP, "m")
    h = bytes(range(32))
    assert c.key(h, "page") == f"{c.namespace}:p:{h.hex()}"
    assert c.key(h.hex(), ObjectKind.STATE) == f"{c.namespace}:s:{h.hex()}"
    assert "{" not in c.key(h, "page")  # no hash tag: cluster spreads pages
    with pytest.raises(MisuseError):
        c.key("zz", "page")
    with pytest.raises(MisuseError):
        c.key(h, "snapshot")
    assert hash_bytes(h.hex()) == h


def _value(codec, h, kind, payload: bytes) -> bytes:
    return codec.header(h, kind, [memoryview(payload)]) + payload


def test_header_layout_exact():
    c = ObjectCodec(FP, "")
    payload = b"abc" * 100
    hdr = c.header(b"\x11" * 32, "page", [memoryview(payload)])
    assert len(hdr) == HEADER_BYTES == 64
    assert hdr[:4] == MAGIC
    magic, ver, kind, algo, hb, _r, fp, ns, kd, plen, csum, hcrc = struct.unpack("<4sHBBII16s8s8sQII", hdr)
    assert (ver, kind, hb, plen) == (1, 1, 64, 300)
    assert fp == FP.encode() and kd == b"\x11" * 8
    assert hcrc == zlib.crc32(hdr[:60])


def check(codec, value: bytes, h, kind, expected_payload_len):
    head = memoryview(value[:64].ljust(64, b"\0"))
    reason, token = codec.check_header(head, h, kind, len(value), expected_payload_len)
    if reason is None:
        return codec.check_payload([memoryview(value[64:])], token)
    return reason


def test_every_rejection_reason():
    c = ObjectCodec(FP, "salt")
    h = hashlib.sha256(b"x").digest()
    good = _value(c, h, "page", bytes(range(256)) * 4)
    assert check(c, good, h, "page", 1024) is None
    # payload bit flip -> corrupt
    bad = bytearray(good)
    bad[100] ^= 1
    assert check(c, bytes(bad), h, "page", 1024) is Reject.CORRUPT
    # header bit flip -> corrupt (header crc)
    bad = bytearray(good)
    bad[50] ^= 1
    assert check(c, bytes(bad), h, "page", 1024) is Reject.CORRUPT
    # truncated value
    assert check(c, good[:-1], h, "page", 1024) is Reject.TRUNCATED
    assert check(c, good[:30], h, "page", 1024) is Reject.TRUNCATED
    # trailing junk
    assert check(c, good + b"x", h, "page", 1024) is Reject.CORRUPT
    # not ours at all
    assert check(c, b"some other program's value" * 10, h, "page", 1024) is Reject.FOREIGN
    assert check(c, b"", h, "page", 1024) is Reject.FOREIGN
    # another layout, another salt, another kind, another key
    assert check(ObjectCodec("fedcba9876543210", "salt"), good, h, "page", 1024) is Reject.FOREIGN
    assert check(ObjectCodec(FP, "other"), good, h, "page", 1024) is Reject.FOREIGN
    assert check(c, good, h, "state", 1024) is Reject.FOREIGN
    assert check(c, good, hashlib.sha256(b"y").digest(), "page", 1024) is Reject.FOREIGN
    # a payload of another size than the destination row
    assert check(c, good, h, "page", 2048) is Reject.WRONG_SIZE
    # another format version (valid header crc)
    v2 = bytearray(good[:60])
    v2[4:6] = struct.pack("<H", 2)
    v2 = bytes(v2) + struct.pack("<I", zlib.crc32(bytes(v2))) + good[64:]
    assert check(c, v2, h, "page", 1024) is Reject.VERSION


def test_crc32_objects_verify_too():
    from hicache.storage.objects import ALGO_CRC32

    w = ObjectCodec(FP, "", algo=ALGO_CRC32)
    h = b"\x01" * 32
    v = _value(w, h, "state", b"q" * 77)
    assert check(ObjectCodec(FP, ""), v, h, "state", 77) is None


def test_crc16_and_slots_match_redis():
    """Slots are redis-py's (``redis.crc.key_slot``: ``binascii.crc_hqx``, CRC16-XMODEM)."""
    pytest.importorskip("redis")
    from hicache.storage.cluster import key_slot

    def crc16(data: bytes) -> int:
        return binascii.crc_hqx(data, 0)

    assert crc16(b"123456789") == 0x31C3
    assert key_slot("123456789") == 12739
    assert key_slot("foo") == 12182
    assert key_slot("{user1000}.following") == key_slot("{user1000}.followers") == key_slot("user1000")
    assert key_slot("foo{}{bar}") == crc16(b"foo{}{bar}") % 16384  # empty tag: whole key
