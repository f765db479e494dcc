"""Layout arithmetic, fingerprints and validation of FamilySpec / CacheLayout."""

from __future__ import annotations

import subprocess
import sys
from fractions import Fraction

import pytest

from hicache.errors import ConfigError
from hicache.layout import CacheLayout, FamilySpec, format_layers, parse_layers


def hybrid(page_tokens: int = 16, c8_ratio: int = 8) -> CacheLayout:
    return CacheLayout((
        FamilySpec("swa_kv", "state", (0, 1, 2), 1, 24, rows_kept=7),
        FamilySpec("c4_kv", "history", (1,), 4, 24),
        FamilySpec("c8_kv", "history", (2,), c8_ratio, 24),
        FamilySpec("c4_state", "state", (1,), 1, 64, rows_kept=4),
    ), page_tokens)


def test_derived_sizes_exact():
    lay = hybrid()
    # c4: 24 B per 4 tokens; c8: 24 B per 8 tokens -> 6 + 3 = 9 B per token
    assert lay.history_bytes_per_token_exact == Fraction(9)
    assert lay.history_bytes_per_page == 16 * 9 == 144
    assert lay.state_bytes_per_snapshot == 3 * 7 * 24 + 4 * 64
    assert lay.object_bytes("page") == 144
    assert lay.object_bytes("state") == lay.state_bytes_per_snapshot
    assert lay.min_page_tokens == 8
    assert lay.has_state
    assert [f.name for f in lay.history_families] == ["c4_kv", "c8_kv"]
    assert lay.family("c8_kv").rows_per_id(16) == 2


def test_fractional_bytes_per_token():
    lay = CacheLayout((FamilySpec("c128_kv", "history", tuple(range(20)), 128, 584),), 256)
    assert lay.history_bytes_per_token == 91.25
    assert lay.history_bytes_per_page == 20 * 2 * 584


def test_fingerprint_stable_and_sensitive():
    a, b = hybrid(), hybrid()
    assert a.fingerprint == b.fingerprint and len(a.fingerprint) == 16
    assert hybrid(page_tokens=32).fingerprint != a.fingerprint
    changed = CacheLayout(a.families[:-1] + (FamilySpec("c4_state", "state", (1,), 1, 64, rows_kept=8),), 16)
    assert changed.fingerprint != a.fingerprint
    # Model names do not change the geometry, so they do not change the fingerprint.
    assert CacheLayout(a.families, 16, model="x").fingerprint == a.fingerprint


def test_fingerprint_same_in_another_process():
    code = ("from tests.layout.test_spec import hybrid; print(hybrid().fingerprint)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                         env={"PYTHONHASHSEED": "123", "PATH": ""}, cwd=str(__import__("pathlib").Path(__file__).parents[2]))
    assert out.stdout.strip() == hybrid().fingerprint


def test_default_index_sources():
    lay = hybrid()
    assert lay.family("c4_kv").index_source == "page"
    assert lay.family("swa_kv").index_source == "state"
    assert [f.name for f in lay.families_on("state")] == ["swa_kv", "c4_state"]


def test_state_family_may_name_page_anchor():
    lay = CacheLayout((
        FamilySpec("kv", "history", (0,), 1, 8),
        FamilySpec("swa_kv", "state", (0,), 1, 8, rows_kept=3, index_source="page"),
    ), 4)
    assert lay.object_bytes("page") == 4 * 8 + 3 * 8
    assert lay.object_bytes("state") == 0


@pytest.mark.parametrize("kwargs, field", [
    (dict(tokens_per_row=0), "tokens_per_row"),
    (dict(tokens_per_row=-4), "tokens_per_row"),
    (dict(row_bytes=0), "row_bytes"),
    (dict(row_bytes=-1), "row_bytes"),
    (dict(layer_ids=()), "layers"),
    (dict(layer_ids=(1, 1)), "layers"),
    (dict(layer_ids=(-1,)), "layers"),
    (dict(kind="cache"), "kind"),
    (dict(name="C4 KV"), "name"),
    (dict(rows_kept=3), "rows_kept"),
    (dict(index_source="anchor"), "index_source"),
    (dict(tokens_per_row=True), "tokens_per_row"),
])
def test_family_bad_input_names_field(kwargs, field):
    args = dict(name="c4_kv", kind="history", layer_ids=(0,), tokens_per_row=4, row_bytes=8)
    args.update(kwargs)
    with pytest.raises(ConfigError) as exc:
        FamilySpec(**args)
    assert exc.value.field.endswith(field)
    assert repr(args.get(field, args.get("layer_ids"))) in str(exc.value) or field in str(exc.value)


def test_ratio_not_dividing_page_tokens():
    with pytest.raises(ConfigError, match="does not divide page_tokens=16") as exc:
        hybrid(c8_ratio=12)
    assert exc.value.field == "family 'c8_kv'.tokens_per_row" and exc.value.value == 12


def test_rows_smaller_than_compress_ratio():
    # seed 001: block_size < compress_ratio divided by zero; here it is a clear error.
    with pytest.raises(ConfigError, match="zero rows"):
        hybrid(page_tokens=4)


@pytest.mark.parametrize("fams, match", [
    ((), "at least one family"),
    ((FamilySpec("s", "state", (0,), 1, 8, rows_kept=1),), "at least one history family"),
    ((FamilySpec("a", "history", (0,), 1, 8), FamilySpec("a", "history", (1,), 1, 8)), "unique"),
])
def test_layout_bad_input(fams, match):
    with pytest.raises(ConfigError, match=match):
        CacheLayout(fams, 16)


def test_page_tokens_must_be_positive():
    with pytest.raises(ConfigError, match="page_tokens"):
        CacheLayout((FamilySpec("a", "history", (0,), 1, 8),), 0)


def test_parse_and_format_layers():
    assert parse_layers("2-42/2", "x") == tuple(range(2, 43, 2))
    assert parse_layers("0-1, 3-7/2", "x") == (0, 1, 3, 5, 7)
    assert parse_layers([3, 1], "x") == (3, 1)
    assert parse_layers(5, "x") == (5,)
    assert format_layers(range(2, 43, 2)) == "2-42/2"
    assert format_layers([0, 1, 2, 3]) == "0-3"
    assert format_layers([0, 1, 5]) == "0,1,5"
    for bad in ("", "a-b", "5-2", "1-3/0", None, 1.5):
        with pytest.raises(ConfigError):
            parse_layers(bad, "families[0].layers")
