"""Authenticated objects at the store: keys from env or file (never shown), the MAC over
header and payload, rotation, and a payload swapped under a copied header."""

from __future__ import annotations

import struct
import zlib

import numpy as np
import pytest

from hicache.config import StorageConfig
from hicache.errors import ConfigError
from hicache.storage import L3Config, L3Store, ObjectKeys, open_backend
from hicache.storage.objects import HEADER, HEADER_BYTES, checksum
from tests.storage.conftest import page_hashes

OLD, NEW, OTHER = ("o" * 40, "n" * 40, "x" * 40)


def store(backend, keys=None, **kw):
    return L3Store(backend, "authfp", "salt", keys=None if keys is None else ObjectKeys([k.encode() for k in keys]),
                   **kw)


def rows(n, size=4096, seed=0):
    return np.random.default_rng(seed).integers(0, 256, (n, size), dtype=np.uint8)


def test_keys_come_from_env_or_file_and_are_never_shown(tmp_path, monkeypatch):
    monkeypatch.setenv("L3KEYS", f"{NEW}\n{OLD}\n")
    keys = ObjectKeys.load("env:L3KEYS")
    assert len(keys) == 2 and NEW not in repr(keys) and OLD not in str(keys)
    f = tmp_path / "keys"
    f.write_text(NEW + " " + OLD)
    assert len(ObjectKeys.load(f"file:{f}")) == 2
    for source, words in [("env:NOPE_NOT_SET", "not set"), (f"file:{tmp_path}/none", "cannot read"),
                          (NEW, "env:VARIABLE or file:"), ("redis://x", "env:VARIABLE")]:
        with pytest.raises(ConfigError, match=words) as exc:
            ObjectKeys.load(source)
        assert NEW not in str(exc.value)                   # a key pasted as the source is not echoed
    monkeypatch.setenv("SHORT", "abc")
    with pytest.raises(ConfigError, match="shorter than 32") as exc:
        ObjectKeys.load("env:SHORT")
    assert "abc" not in str(exc.value).replace("SHORT", "")
    cfg = StorageConfig(auth_key="env:L3KEYS")
    assert "env:L3KEYS" in repr(cfg) and NEW not in repr(cfg)
    for pasted in (NEW, "k:" + NEW, NEW[:10] + ":" + NEW):
        with pytest.raises(ConfigError, match="storage_auth_key") as exc:
            StorageConfig(auth_key=pasted)
        assert NEW[:10] not in str(exc.value)
    with pytest.raises(TypeError):
        import pickle
        pickle.dumps(keys)


def test_l3config_names_the_source_and_the_store_reads_it(monkeypatch):
    monkeypatch.setenv("L3KEYS", NEW)
    s = L3Store(open_backend("memory://"), "authfp", "salt", L3Config(auth_key="env:L3KEYS"))
    assert s.codec.keys is not None and s.codec.header_bytes == HEADER_BYTES + 32
    with pytest.raises(ConfigError, match="auth_key"):
        L3Config(auth_key="plain-text-key-" * 3)
    s.close()


def test_rotation_accepts_old_key_objects_and_writes_with_the_new_key():
    backend = open_backend("memory://")
    old, rotating, new_only = store(backend, [OLD]), store(backend, [NEW, OLD]), store(backend, [NEW])
    hs, src = page_hashes(4, "rot"), rows(4)
    assert old.put(hs[:2], "page", list(src[:2])) == [True, True]
    dst = np.zeros_like(src)
    assert rotating.get(hs[:2], "page", list(dst[:2])).hits == 2 and np.array_equal(dst[:2], src[:2])
    assert rotating.put(hs[2:], "page", list(src[2:])) == [True, True]
    assert new_only.get(hs[2:], "page", list(dst[2:])).hits == 2      # written with the new key
    assert old.get(hs[2:], "page", list(dst[2:])).stopped == "unauthenticated"
    assert new_only.get(hs[:2], "page", list(dst[:2])).stopped == "unauthenticated"   # old key dropped
    assert new_only.rejected.snapshot() == {"unauthenticated": 1}
    assert new_only.stats().counters["repaired_deleted"] == 1         # deleted, to be rewritten
    assert new_only.must_overwrite(hs[:1], "page") == [True]


def test_a_payload_swapped_under_a_copied_header_fails_the_mac():
    """The strongest plant: a reader of the store copies a real object's header and MAC and
    puts other bytes under it, fixing the checksum and the header's crc."""
    backend = open_backend("memory://")
    s = store(backend, [NEW])
    hs, src = page_hashes(2, "swap"), rows(2)
    s.put(hs, "page", list(src))
    key = s.key(hs[1], "page")
    value = bytearray(HEADER_BYTES + 32 + src.shape[1])
    assert backend.get_into([key], [value])[0] == len(value)
    evil = rows(1, seed=9)[0]
    fields = list(HEADER.unpack_from(value))
    fields[10] = checksum([memoryview(evil)], fields[3])
    body = HEADER.pack(*fields)
    value[:HEADER_BYTES] = body[:60] + struct.pack("<I", zlib.crc32(body[:60]))
    value[HEADER_BYTES + 32:] = evil.tobytes()
    assert backend.put([key], [bytes(value)]) == [True]
    dst = np.zeros_like(src)
    res = s.get(hs, "page", list(dst))
    assert (res.hits, res.stopped) == (1, "unauthenticated")
    assert np.array_equal(dst[0], src[0])
    assert store(backend).get(hs[:1], "page", list(dst[:1])).stopped == "version"   # no key: left alone


def test_the_yaml_setting_names_a_source_never_a_key():
    from hicache.config import cache_config_from_mapping

    assert cache_config_from_mapping({"storage_auth_key": "env:X"}).storage.auth_key == "env:X"
    with pytest.raises(ConfigError, match="storage_auth_key='...'") as exc:
        cache_config_from_mapping({"storage_auth_key": NEW})
    assert NEW not in str(exc.value)
