"""The bounded readers of ``hicache.inputs``: each limit refuses in one ConfigError naming
the field, quickly, and real configs pass untouched."""

from __future__ import annotations

import json
import time

import pytest
import yaml

from hicache import inputs
from hicache.errors import ConfigError, short_repr
from tests.conftest import CONFIGS, FIXTURES


def refused(fn, *args, **kw) -> ConfigError:
    start = time.perf_counter()
    with pytest.raises(ConfigError) as info:
        fn(*args, **kw)
    assert time.perf_counter() - start < 2.0
    return info.value


def test_every_shipped_config_and_fixture_loads_as_before():
    for path in sorted(CONFIGS.glob("*.yaml")):
        text = path.read_text()
        assert inputs.load_yaml(text, "config") == yaml.safe_load(text), path.name
    for path in sorted(FIXTURES.glob("*.json")):
        text = path.read_text()
        assert inputs.load_json(text, "hf_config", str(path)) == json.loads(text), path.name


def test_aliases_count_as_full_copies():
    assert inputs.load_yaml("a: &x [1, 2]\nb: *x\n", "config") == {"a": [1, 2], "b": [1, 2]}
    levels = ["k0: &a0 [x, x, x, x, x, x, x, x, x, x]"]
    levels += [f"k{i}: &a{i} [" + ", ".join([f"*a{i - 1}"] * 10) + "]" for i in range(1, 9)]
    err = refused(inputs.load_yaml, "\n".join(levels) + "\n", "config")
    assert err.field.startswith("k4") and "100,000" in err.reason


@pytest.mark.parametrize("text, field", [
    ("a: " + "[" * 40 + "]" * 40, "a[0]"),
    ("a:\n" + "".join("  " * (i + 1) + f"b{i}:\n" for i in range(40)), "a.b0.b1"),
])
def test_depth_is_bounded_before_anything_is_built(text, field):
    err = refused(inputs.load_yaml, text, "config")
    assert err.field.startswith(field) and "32 levels" in err.reason


def test_long_integers_are_named_where_they_sit():
    assert refused(inputs.load_yaml, "cache:\n  device_bytes: " + "9" * 101, "config").field == "cache.device_bytes"
    assert inputs.load_yaml("a: '" + "9" * 500 + "'", "config") == {"a": "9" * 500}   # text is not an int
    err = refused(inputs.load_json, '{"x": {"n": ' + "9" * 5000 + "}}", "hf_config", "c.json")
    assert err.field == "hf_config.x.n" and err.source == "c.json"
    assert refused(inputs.load_json, '{"n": ' + "9" * 200 + "}", "hf_config", "c.json").field == "hf_config.n"


def test_mapping_keys_must_be_text():
    err = refused(inputs.load_yaml, "cache:\n  1: a\n  b: c\n", "config")
    assert err.field == "cache.1" and err.value == 1


def test_json_depth_and_trace_lines():
    assert refused(inputs.load_json, "[" * 100_000 + "]" * 100_000, "hf_config", "c.json").field == "hf_config"
    assert refused(inputs.load_json, "[" * 40 + "]" * 40, "hf_config", "c.json").field.startswith("hf_config[0]")
    assert inputs.json_line('{"a": [1, 2]}', "t:1") == {"a": [1, 2]}
    with pytest.raises(json.JSONDecodeError):   # counted by the trace reader, not refused
        inputs.json_line("{nope", "t:1")
    assert refused(inputs.json_line, '{"a": ' + "[" * 100_000 + "]" * 100_000 + "}", "t:1").field == "t:1"
    err = refused(inputs.json_line, '{"a": [1, ' + "9" * 5000 + "]}", "t:1")
    assert err.field == "a[1]" and err.source == "t:1"


def test_files_are_read_within_a_size(tmp_path, monkeypatch):
    monkeypatch.setattr(inputs, "MAX_FILE_BYTES", 100)
    (tmp_path / "c.yaml").write_text("#" * 101)
    err = refused(inputs.read_text, tmp_path / "c.yaml", "config")
    assert err.field == "config" and "101 bytes" in err.reason


def test_error_values_are_short_whatever_they_hold():
    bomb: list = ["x"] * 10
    for _ in range(8):
        bomb = [bomb] * 10
    start = time.perf_counter()
    assert len(short_repr(bomb)) <= 600 and "digits" in short_repr(10**5000)
    assert time.perf_counter() - start < 1.0
    assert short_repr("/some/path") == "'/some/path'" and short_repr([1, 2]) == "[1, 2]"
    assert str(ConfigError("f", 10**5000, "bad")) == "f=<an integer of about 5001 digits>: bad"
