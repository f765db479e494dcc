"""YAML and Hugging Face loaders: every shipped config, every model family, bad input."""

from __future__ import annotations

import json

import pytest
import yaml

from hicache.errors import ConfigError
from hicache.layout import CacheLayout

FLASH_KINDS = {"swa_kv": "state", "c4_kv": "history", "c4_indexer": "history",
               "c128_kv": "history", "c4_state": "state", "c4_indexer_state": "state",
               "c128_state": "state"}


def test_flash_yaml(configs_dir):
    lay = CacheLayout.from_yaml(configs_dir / "deepseek-v4-flash.yaml")
    assert lay.page_tokens == 256
    assert {f.name: f.kind for f in lay.families} == FLASH_KINDS
    assert lay.history_bytes_per_token == 3850.25
    assert lay.family("c4_kv").num_layers == 21
    assert lay.family("c128_kv").num_layers == 20
    assert lay.family("swa_kv").num_layers == 43
    assert lay.family("swa_kv").rows_kept == 127
    assert lay.history_bytes_per_page == int(3850.25 * 256)
    assert lay.model == "deepseek-v4-flash"


def test_pro_yaml(configs_dir):
    lay = CacheLayout.from_yaml(configs_dir / "deepseek-v4-pro.yaml")
    assert {f.name: f.kind for f in lay.families} == FLASH_KINDS
    assert (lay.family("c4_kv").num_layers, lay.family("c128_kv").num_layers) == (30, 31)
    # 30 * 584/4 + 30 * 132/4 + 31 * 584/128 = 4380 + 990 + 141.4375
    assert lay.history_bytes_per_token == 5511.4375


@pytest.mark.parametrize("model", ["deepseek-v4-flash", "deepseek-v4-pro", "llama-3.1-8b", "deepseek-v3"])
def test_hf_config_matches_yaml(model, configs_dir, fixtures_dir):
    from_yaml = CacheLayout.from_yaml(configs_dir / f"{model}.yaml")
    from_hf = CacheLayout.from_hf_config(fixtures_dir / f"{model}.config.json")
    assert from_hf.summary()["families"] == from_yaml.summary()["families"]
    assert from_hf.fingerprint == from_yaml.fingerprint


def test_every_shipped_config_loads(configs_dir):
    from hicache.config import load_config

    names = sorted(p.stem for p in configs_dir.glob("*.yaml"))
    assert {"deepseek-v4-flash", "deepseek-v4-pro", "llama-3.1-8b", "deepseek-v3"} <= set(names)
    for name in names:
        layout, cfg = load_config(configs_dir / f"{name}.yaml")
        assert layout.history_bytes_per_page > 0
        assert cfg.storage.url


def v4(**over):
    cfg = json.loads(open(__import__("tests.conftest", fromlist=["x"]).FIXTURES / "deepseek-v4-flash.config.json").read())
    cfg.update(over)
    return cfg


def test_v4_truncates_ratios_and_mtp():
    base = CacheLayout.from_hf_config(v4())
    assert base.family("swa_kv").num_layers == 43
    mtp = CacheLayout.from_hf_config(v4(), include_mtp=True)
    assert mtp.family("swa_kv").layer_ids == tuple(range(44))
    assert mtp.family("c4_kv").num_layers == 21  # the MTP layer is sliding-window only
    assert mtp.fingerprint != base.fingerprint


def test_v4_row_formats():
    assert CacheLayout.from_hf_config(v4()).family("c4_kv").row_bytes == 584
    bf16 = CacheLayout.from_hf_config(v4(), kv_format="bf16")
    assert bf16.family("c4_kv").row_bytes == 1024 and bf16.family("swa_kv").row_bytes == 1024
    assert CacheLayout.from_hf_config(v4()).family("c4_indexer").row_bytes == 132
    assert CacheLayout.from_hf_config(v4(), indexer_format="fp4").family("c4_indexer").row_bytes == 68
    lay = CacheLayout.from_hf_config(v4())
    assert (lay.family("c4_state").row_bytes, lay.family("c4_indexer_state").row_bytes,
            lay.family("c128_state").row_bytes) == (8192, 2048, 4096)


def test_mha_head_dim_from_hidden_and_dtype(fixtures_dir):
    lay = CacheLayout.from_hf_config(fixtures_dir / "llama-3.1-8b.config.json")
    assert lay.family("kv").row_bytes == 2 * 8 * 128 * 2
    fp32 = CacheLayout.from_hf_config({"num_hidden_layers": 2, "num_attention_heads": 4,
                                       "hidden_size": 64, "torch_dtype": "float32"})
    assert fp32.family("kv").row_bytes == 2 * 4 * 16 * 4  # no num_key_value_heads -> MHA
    explicit = CacheLayout.from_hf_config({"num_hidden_layers": 2, "num_attention_heads": 4,
                                           "num_key_value_heads": 2, "head_dim": 32})
    assert explicit.family("kv").row_bytes == 2 * 2 * 32 * 2


def test_mla(fixtures_dir):
    lay = CacheLayout.from_hf_config(fixtures_dir / "deepseek-v3.config.json")
    assert lay.family("mla_kv").row_bytes == (512 + 64) * 2
    assert lay.history_bytes_per_token == 61 * 1152
    assert not lay.has_state


@pytest.mark.parametrize("cfg, opts, field", [
    (v4(num_hidden_layers=50), {}, "hf_config.compress_ratios"),
    (v4(compress_ratios=[0, 4, 48] + [4] * 41), {}, "hf_config.compress_ratios[2]"),
    (v4(compress_ratios=[0, 4, 512] + [4] * 41), {}, "hf_config.compress_ratios[2]"),
    (v4(compress_ratios=[0, -4] + [4] * 42), {}, "hf_config.compress_ratios[1]"),
    (v4(sliding_window=0), {}, "hf_config.sliding_window"),
    (v4(head_dim="512"), {}, "hf_config.head_dim"),
    ({k: v for k, v in v4().items() if k != "index_head_dim"}, {}, "hf_config.index_head_dim"),
    (v4(), {"kv_format": "fp16"}, "kv_format"),
    (v4(), {"indexer_format": "int8"}, "indexer_format"),
    ({"num_hidden_layers": 2, "num_attention_heads": 4, "hidden_size": 64, "torch_dtype": "int3"}, {},
     "hf_config.torch_dtype"),
    ({"num_hidden_layers": 2, "num_attention_heads": 4, "hidden_size": 66}, {}, "hf_config.hidden_size"),
    ({"num_hidden_layers": 0, "kv_lora_rank": 512, "qk_rope_head_dim": 64}, {}, "hf_config.num_hidden_layers"),
    ({"vocab_size": 5}, {}, "hf_config"),
    # a traceback, a silent default or a memory blow-up before (issue 11)
    (v4(), {"page_tokens": "abc"}, "page_tokens"),
    (v4(), {"page_tokens": 0}, "page_tokens"),                    # 0 silently became 256
    ({"num_hidden_layers": 2, "num_attention_heads": 4, "hidden_size": 64}, {"page_tokens": 0}, "page_tokens"),
    (v4(), {"include_mtp": "yes"}, "include_mtp"),
    (v4(), {"kv_format": ["fp8"]}, "kv_format"),
    ({"num_hidden_layers": 10**9, "num_attention_heads": 4, "hidden_size": 64}, {}, "hf_config.num_hidden_layers"),
    (v4(num_hidden_layers=5000), {}, "hf_config.num_hidden_layers"),
])
def test_hf_bad_input(cfg, opts, field):
    with pytest.raises(ConfigError) as exc:
        CacheLayout.from_hf_config(cfg, **opts)
    assert exc.value.field == field


def write(tmp_path, data) -> str:
    p = tmp_path / "c.yaml"
    p.write_text(data if isinstance(data, str) else yaml.safe_dump(data))
    return str(p)


FAM = {"name": "kv", "kind": "history", "layers": "0-1", "tokens_per_row": 1, "row_bytes": 8}


@pytest.mark.parametrize("data, field", [
    ({"layout": {"families": [dict(FAM, bogus=1)]}}, "layout.families[0].bogus"),
    ({"layout": {"families": [{k: v for k, v in FAM.items() if k != "row_bytes"}]}},
     "layout.families[0].row_bytes"),
    ({"layout": {"families": [dict(FAM, row_bytes=0)]}}, "family 'kv'.row_bytes"),
    ({"layout": {"families": [dict(FAM, tokens_per_row=3)], "page_tokens": 16}},
     "family 'kv'.tokens_per_row"),
    ({"layout": {"families": []}}, "layout.families"),
    ({"layout": {"families": [FAM], "pagetokens": 16}}, "layout.pagetokens"),
    ({"layout": {"families": [FAM]}, "extra": 1}, "extra"),
    ({"model": "x"}, "layout"),
    ({"layout": {"families": [FAM], "kv_format": "fp8"}}, "layout.kv_format"),
    ("layout: [unclosed", "config"),
    ("- just a list", "config"),
    ({"layout": {"families": [dict(FAM, layers="0-99999999")]}}, "layout.families[0].layers"),
    ({"layout": {"families": [dict(FAM, layers=",".join(["0-4095"] * 3))]}}, "layout.families[0].layers"),
    ({"layout": {"families": [dict(FAM, layers=[4096])]}}, "layout.families[0].layers"),
    ({"layout": {"families": [FAM, dict(FAM, name="kv2", index_source="state")]}}, "family 'kv2'.index_source"),
    ({"model": ["m"], "layout": {"families": [FAM]}}, "model"),
    ({"model": "m", "layout": {"families": [FAM]}, "storage_url": "redis://:secret@h"}, "storage_url"),
])
def test_yaml_bad_input(tmp_path, data, field):
    with pytest.raises(ConfigError) as exc:
        CacheLayout.from_yaml(write(tmp_path, data))
    assert exc.value.field == field
    assert "c.yaml" in str(exc.value)


def test_unknown_top_level_key_does_not_echo_its_value(tmp_path):
    with pytest.raises(ConfigError) as exc:
        CacheLayout.from_yaml(write(tmp_path, {"layout": {"families": [FAM]}, "storage_url": "redis://:secret@h"}))
    assert "secret" not in str(exc.value)


def test_non_utf8_files_are_config_errors(tmp_path):
    p = tmp_path / "c.yaml"
    p.write_bytes(b"model: caf\xe9\nlayout: {}\n")
    with pytest.raises(ConfigError, match="not UTF-8 text .byte 0xe9 at offset 10"):
        CacheLayout.from_yaml(p)
    j = tmp_path / "config.json"
    j.write_bytes(b'{"model_type": "\xff"}')
    with pytest.raises(ConfigError) as exc:
        CacheLayout.from_hf_config(j)
    assert exc.value.field == "hf_config" and "not UTF-8" in str(exc.value)


def test_yaml_missing_file(tmp_path):
    with pytest.raises(ConfigError, match="no such file"):
        CacheLayout.from_yaml(tmp_path / "nope.yaml")


def test_yaml_inline_hf_config(tmp_path):
    path = write(tmp_path, {"layout": {"hf_config": v4(), "indexer_format": "fp4"}})
    lay = CacheLayout.from_yaml(path)
    assert lay.family("c4_indexer").row_bytes == 68
