"""The SGLang integration's parts that need no SGLang: extra-config parsing, page pieces,
keys and namespaces, and the import guard (these run in the main test environment)."""

from __future__ import annotations

import hashlib
import importlib.util
import subprocess
import sys

import pytest
import torch

from hicache.errors import ConfigError
from hicache.integrations.sglang.config import SGLangL3Config
from hicache.integrations.sglang.pages import byte_pieces, key_hash, kind_of, pool_descriptor, pool_fingerprint
from hicache.storage import L3Config
from hicache.storage.objects import ObjectKind

SGLANG_SELECT = {"backend_name": "hicache", "module_path": "hicache.integrations.sglang",
                 "class_name": "HiCacheStorageBackend"}


def test_extra_config_splits_our_keys_backend_options_and_sglangs():
    cfg = SGLangL3Config.from_extra_config({
        **SGLANG_SELECT, "interface_v1": 1, "prefetch_threshold": 256, "url": "redis://127.0.0.1:6379/0",
        "salt": "prod-a", "timeout": 0.25, "connect_timeout": 0.1, "breaker_threshold": 5,
        "breaker_cooldown_s": 2.0, "skip_existing": False})
    assert (cfg.url, cfg.salt, cfg.interface_v1, cfg.skip_existing) == \
        ("redis://127.0.0.1:6379/0", "prod-a", True, False)
    assert dict(cfg.backend_options) == {"timeout": 0.25, "connect_timeout": 0.1}
    assert cfg.store == L3Config(breaker_threshold=5, breaker_cooldown_s=2.0)


@pytest.mark.parametrize("extra, field", [
    ({}, "extra_config.url"),
    ({"url": "not a url"}, "extra_config.url"),
    ({"url": "memory://", "tiemout": 1}, "extra_config.tiemout"),
    ({"url": "memory://", "salt": 3}, "extra_config.salt"),
    ({"url": "memory://", "interface_v1": 2}, "extra_config.interface_v1"),
    ({"url": "memory://", "breaker_threshold": 0}, "extra_config.breaker_threshold"),
    ({"url": "memory://", "skip_existing": "yes"}, "extra_config.skip_existing"),
])
def test_bad_extra_config_names_the_field(extra, field):
    with pytest.raises(ConfigError) as err:
        SGLangL3Config.from_extra_config(extra)
    assert err.value.field == field


def test_secrets_in_bad_keys_or_urls_are_not_echoed():
    for extra in ({"url": "redis//user:hunter2@host"}, {"url": "memory://", "pasword": "hunter2"}):
        with pytest.raises(ConfigError) as err:
            SGLangL3Config.from_extra_config(extra)
        assert "hunter2" not in str(err.value)


@pytest.mark.parametrize("layout, shape, pieces", [
    ("page_first", (2, 32, 3, 2, 8), 2),     # K region, V region
    ("layer_first", (2, 3, 32, 2, 8), 6),    # K and V per layer
])
def test_byte_pieces_are_the_page_regions_in_flat_order(layout, shape, pieces):
    buf = torch.randn(shape).to(torch.bfloat16)
    page = buf[:, 4:8] if layout == "page_first" else buf[:, :, 4:8]
    got = byte_pieces(page)
    assert len(got) == pieces and all(p.dtype == torch.uint8 and p.is_contiguous() for p in got)
    assert torch.equal(torch.cat(got), page.flatten().contiguous().view(torch.uint8))
    for p in got:                       # views: writing a piece writes the pool
        p.fill_(0)
    assert not page.any() and buf.view(torch.uint8).any()


def test_keys_and_namespaces():
    sha = hashlib.sha256(b"x").hexdigest()
    assert key_hash(sha) == bytes.fromhex(sha)
    assert key_hash("h0") == hashlib.sha256(b"h0").digest()        # not hex: hashed, fixed size
    assert kind_of("trailing_pages") is ObjectKind.STATE and kind_of("all_pages") is ObjectKind.PAGE

    class Pool:
        layout, page_size, dtype, layer_num, head_num, head_dim = "page_first", 64, torch.bfloat16, 4, 8, 128

    ranks = {"tp": [1, 2], "pp": [0, 1]}
    a = pool_descriptor("kv", Pool(), 1 << 20, model="m", ranks=ranks, replicated=False)
    b = pool_descriptor("kv", Pool(), 1 << 20, model="m", ranks=ranks, replicated=True)
    assert a["tp"] == [1, 2] and "tp" not in b and a["head_dim"] == 128
    fps = {pool_fingerprint(d) for d in (a, b, {**a, "layout": "layer_first"}, {**a, "pool": "swa"},
                                         {**a, "model": "n"}, {**a, "page_size": 32})}
    assert len(fps) == 6 and all(len(f) == 16 for f in fps)
    assert pool_fingerprint(a) == pool_fingerprint(dict(reversed(list(a.items()))))


@pytest.mark.skipif(importlib.util.find_spec("sglang") is not None, reason="SGLang is installed here")
def test_without_sglang_hicache_imports_and_the_backend_says_why():
    code = ("import hicache, hicache.integrations.sglang as m\n"
            "try:\n    m.HiCacheStorageBackend\nexcept Exception as e:\n"
            "    print(type(e).__name__, e)\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.startswith("ConfigError") and "SGLang is not installed" in out.stdout
