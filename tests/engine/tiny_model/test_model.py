"""The model on its own: determinism, chunking invariance, causality, a naive reference."""

from __future__ import annotations

import pytest
import torch

from hicache.engine.tiny_model import (DenseSequenceCache, TinyV4Config, TinyV4Model,
                                       compare_logits, reference_logits)
from hicache.errors import MisuseError
from tests.engine.tiny_model.naive import naive_logits
from tests.engine.tiny_model.support import CONFIGS, model_for, tokens

CHUNKINGS = [None, 1, 3, 16, 17, [5, 11, 1, 40, 43]]


def test_same_seed_same_bits_other_seed_other_logits():
    cfg = TinyV4Config()
    toks = tokens(cfg, 40, seed=0)
    a = reference_logits(TinyV4Model(cfg), toks)
    b = reference_logits(TinyV4Model(TinyV4Config()), toks)
    c = reference_logits(TinyV4Model(TinyV4Config(seed=1)), toks)
    assert torch.equal(a, b)
    assert compare_logits(a, c).max_abs_diff > 0.1
    assert a.dtype == torch.float64 and tuple(a.shape) == (40, cfg.vocab)


@pytest.mark.parametrize("name", sorted(CONFIGS))
@pytest.mark.parametrize("chunks", CHUNKINGS, ids=["full", "decode", "c3", "c16", "c17", "mixed"])
def test_chunked_prefill_and_decode_equal_full_recompute(name, chunks):
    cfg = CONFIGS[name]
    model = model_for(cfg)
    toks = tokens(cfg, 100, seed=1)
    want = reference_logits(model, toks)
    got = model.run(toks, DenseSequenceCache(cfg), chunks=chunks)
    check = compare_logits(got, want)
    assert check.checked_tokens == 100
    assert check.exact, f"{name} {chunks}: max |diff| {check.max_abs_diff}"


@pytest.mark.parametrize("name", sorted(CONFIGS))
def test_matches_naive_per_position_reference(name):
    cfg = CONFIGS[name]
    model = model_for(cfg)
    toks = tokens(cfg, 72, seed=2).tolist()
    check = compare_logits(reference_logits(model, toks), naive_logits(model, toks))
    # Different summation order than the naive loops: equal to rounding, not to the bit.
    assert check.max_abs_diff < 1e-12, check


def test_every_layer_kind_changes_the_logits():
    """Switching the compressed branch of one layer off (ratio 0) changes the output, so
    CSA and HCA layers really contribute (the cache proofs would be vacuous otherwise)."""
    base = TinyV4Config()
    toks = tokens(base, 64, seed=3)
    want = reference_logits(model_for(base), toks)
    for layer in (2, 3):  # one CSA, one HCA
        ratios = list(base.compress_ratios)
        ratios[layer] = 0
        other = TinyV4Model(TinyV4Config(compress_ratios=tuple(ratios)))
        # Same weights for everything but the removed branch: copy them over.
        other.weights = model_for(base).weights
        got = reference_logits(other, toks)
        r = base.ratio(layer)
        assert compare_logits(got[:r - 1], want[:r - 1]).exact  # no entry complete yet
        assert compare_logits(got, want).max_abs_diff > 1e-3


def test_causal_future_tokens_do_not_change_past_logits():
    cfg = TinyV4Config()
    model = model_for(cfg)
    toks = tokens(cfg, 80, seed=4)
    other = toks.clone()
    other[50:] = (other[50:] + 1) % cfg.vocab
    a, b = reference_logits(model, toks), reference_logits(model, other)
    assert torch.equal(a[:50], b[:50])
    assert compare_logits(a[50:], b[50:]).max_abs_diff > 1e-3


def test_indexer_ties_decide_selections_and_go_to_the_lower_entry():
    """The indexer's ReLU makes many scores exactly 0, so the top-k cut often falls
    inside a tie. The naive reference breaks ties by lower entry index explicitly; the
    model agreeing with it on a sequence with such ties shows it does the same."""
    cfg = TinyV4Config()
    model = model_for(cfg)
    toks = tokens(cfg, 72, seed=5).tolist()
    stats: dict = {}
    want = naive_logits(model, toks, stats)
    assert stats["decisive_ties"] > 0
    assert compare_logits(reference_logits(model, toks), want).max_abs_diff < 1e-12


def test_misuse_is_reported():
    cfg = TinyV4Config()
    model = model_for(cfg)
    cache = DenseSequenceCache(cfg)
    with pytest.raises(MisuseError, match="starts at 3"):
        model.forward([1, 2], 3, cache)
    with pytest.raises(MisuseError, match="at least one token"):
        model.forward([], 0, cache)
    with pytest.raises(MisuseError, match=r"\[0, 64\)"):
        model.forward([64], 0, cache)
    with pytest.raises(MisuseError, match="1-D"):
        model.forward([[1]], 0, cache)
    with pytest.raises(MisuseError, match="integers"):
        model.forward(torch.tensor([1.0]), 0, cache)
    with pytest.raises(MisuseError, match="different TinyV4Config"):
        model.forward([1], 0, DenseSequenceCache(TinyV4Config(seed=5)))
    with pytest.raises(MisuseError, match="sum to 4"):
        model.run([1, 2, 3, 4], cache, chunks=[1, 2])
    with pytest.raises(MisuseError, match=">= 1"):
        model.run([1, 2], cache, chunks=0)
    small = TinyV4Config(max_positions=32)
    with pytest.raises(MisuseError, match="max_positions"):
        TinyV4Model(small).forward([0] * 33, 0, DenseSequenceCache(small))
    assert cache.length == 0  # nothing ran


def test_run_calls_back_at_every_page_boundary():
    cfg = TinyV4Config()
    model = model_for(cfg)
    seen: list[int] = []
    cache = DenseSequenceCache(cfg)
    toks = tokens(cfg, 70, seed=6)
    model.run(toks[:5], cache)
    out = model.run(toks[5:], cache, chunks=[20, 45], on_boundary=seen.append)
    assert seen == [16, 32, 48, 64]
    assert cache.length == 70
    assert compare_logits(out, reference_logits(model, toks)[5:]).exact
