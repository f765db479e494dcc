"""Negative controls: the exactness check can fail, and the layout's rows_kept is the truth.

Request A computes 64 tokens and publishes pages and a snapshot at 48. Request B (same
first 48 tokens, its own continuation) resumes there. Untouched, B is bit-exact; every
control below changes one thing about what B resumes from and must change B's logits.
"""

from __future__ import annotations

import math

import pytest
import torch

from hicache.engine.tiny_model import (DenseSequenceCache, PagedSequenceCache, TinyV4Config,
                                       compare_logits, layout_for, restore_rows)
from tests.engine.tiny_model.support import (device_pools, f64_rows, model_for, run_publishing,
                                             tokens)

CFG = TinyV4Config()
B = 48
STATE_FAMILIES = [f for f in layout_for(CFG).state_families if f.rows_kept]


class Scene:
    def __init__(self) -> None:
        self.model = model_for(CFG)
        self.pools = device_pools(CFG)
        a_toks = tokens(CFG, 64, seed=30)
        _, self.owner, self.pub = run_publishing(self.model, self.pools, a_toks, chunks=9)
        self.mine = torch.cat([a_toks[:B], tokens(CFG, 40, seed=31)])
        self.ref_cache = DenseSequenceCache(CFG)
        self.want = self.model.run(self.mine, self.ref_cache)[B:]
        # A request with another prefix: its pages are "wrong pages" for this prefix.
        _, self.stranger, self.stranger_pub = run_publishing(
            self.model, self.pools, tokens(CFG, 48, seed=32), chunks=16)

    def resume(self, *, pages=None, snapshot=None, mutate=None):
        """Resume B (optionally from other pages / snapshot / after ``mutate(cache)``);
        returns (logit check against the recompute, the cache)."""
        pages = pages if pages is not None else self.pub.pages[: B // 16]
        sid = snapshot if snapshot is not None else self.pub.snapshots[B]
        cache = PagedSequenceCache.resume(CFG, self.pools, pages, sid, B)
        if mutate is not None:
            mutate(cache)
        assert cache.reserve(len(self.mine)).ok
        got = self.model.run(self.mine[B:], cache, chunks=[3, 37])
        check = compare_logits(got, self.want)
        cache.release()
        return check, cache


@pytest.fixture(scope="module")
def scene() -> Scene:
    return Scene()


def _with_snapshot_row(scene: Scene, family: str, layer_idx: int, row: int, value):
    """Temporarily overwrite one snapshot row (all its values) in the state pool."""
    view = f64_rows(scene.pools, family)[layer_idx, scene.pub.snapshots[B], row]
    saved = view.clone()

    class _Ctx:
        def __enter__(self):
            view.copy_(value(saved) if callable(value) else value)

        def __exit__(self, *exc):
            view.copy_(saved)
    return _Ctx()


def test_clean_resume_is_exact(scene):
    check, _ = scene.resume()
    assert check.exact and check.checked_tokens == 40


@pytest.mark.parametrize("family", [f.name for f in STATE_FAMILIES])
def test_corrupting_one_state_row_changes_logits(family):
    scene = Scene()
    fam = layout_for(CFG).family(family)
    # The newest row of the first layer of the family, pushed well off its value.
    with _with_snapshot_row(scene, family, 0, fam.rows_kept - 1, lambda r: r + 3.0):
        check, _ = scene.resume()
    assert check.max_abs_diff > 1e-6, check
    assert scene.resume()[0].exact  # restored: exact again


@pytest.mark.parametrize("shift", [-1, 1])
def test_shifting_the_sliding_base_offset_changes_logits(scene, shift):
    fam = layout_for(CFG).family("swa_kv")

    def reload_shifted(cache):
        rows = f64_rows(scene.pools, "swa_kv")[:, scene.pub.snapshots[B]]
        restore_rows(cache.state, fam, rows, first_pos=B - fam.rows_kept + shift)

    check, _ = scene.resume(mutate=reload_shifted)
    assert check.max_abs_diff > 1e-3 and not math.isnan(check.max_abs_diff), check


@pytest.mark.parametrize("k", [0, 1, 2])
def test_a_wrong_page_id_changes_logits(scene, k):
    pages = list(scene.pub.pages[: B // 16])
    pages[k] = scene.stranger_pub.pages[k]  # same position, another prefix's page
    check, _ = scene.resume(pages=pages)
    assert check.max_abs_diff > 1e-3, check


@pytest.mark.parametrize("family", [f.name for f in layout_for(CFG).history_families])
def test_every_history_family_is_read(scene, family):
    """Swap one family's rows of page 1 for another prefix's: every history family matters."""
    view = scene.pools.view(family)
    mine, other = scene.pub.pages[1], scene.stranger_pub.pages[1]
    saved = view[:, mine].clone()
    view[:, mine] = view[:, other]
    try:
        check, _ = scene.resume()
    finally:
        view[:, mine] = saved
    assert check.max_abs_diff > 1e-3, (family, check)


def test_the_snapshot_of_another_boundary_is_wrong(scene):
    check, _ = scene.resume(snapshot=scene.pub.snapshots[32])
    assert check.max_abs_diff > 1e-3, check


@pytest.mark.parametrize("family", [f.name for f in STATE_FAMILIES])
def test_a_snapshot_one_row_short_is_wrong(family):
    """A layout keeping rows_kept - 1 rows would lose the oldest row; resuming with that
    row zeroed (what a zero-initialised working area would hold) changes the logits."""
    scene = Scene()
    view = f64_rows(scene.pools, family)[:, scene.pub.snapshots[B], 0]
    saved = view.clone()
    view.zero_()
    check, _ = scene.resume()
    view.copy_(saved)
    assert check.max_abs_diff > 1e-3, (family, check)


@pytest.mark.parametrize("family", [f.name for f in STATE_FAMILIES])
def test_every_kept_row_is_necessary(scene, family):
    """Zeroing any single kept row of any layer changes what the resume computes: the
    logits (sliding window) or the next compressed entry (compressor states; its effect
    on logits then depends on the indexer's choice, so the entry is the direct proof)."""
    fam = layout_for(CFG).family(family)
    entry_family = {"c4_state": "c4_kv", "c4_indexer_state": "c4_indexer"}.get(family)
    for li, layer in enumerate(fam.layer_ids):
        for row in range(fam.rows_kept):
            captured = {}

            def keep(cache):
                captured["cache"] = cache

            with _with_snapshot_row(scene, family, li, row, 0.0):
                check, cache = scene.resume(mutate=keep)
            if entry_family is None:
                assert check.max_abs_diff > 1e-6, (family, layer, row, check)
            else:
                j = B // 4  # the entry covering [48, 52) mixes the 4 kept rows
                got = cache.read_history(entry_family, layer, j + 1)[j]
                want = scene.ref_cache.read_history(entry_family, layer, j + 1)[j]
                assert (got - want).abs().max() > 1e-6, (family, layer, row)


def test_kept_rows_are_sufficient(scene):
    """After load_snapshot everything but the kept rows (and, for the overlapping
    compressor, everything but the kept overlap half of each row) is NaN; a read of any
    of it would turn the logits into NaN. The resume is bit-exact, so nothing else is
    needed."""
    seen = {}

    def inspect(cache):
        st = cache.state
        seen["window"] = torch.isnan(st.window).all(-1)          # [layers, W] slot is NaN
        seen["window_finite"] = torch.isfinite(st.window).all(-1)
        seen["comp"] = {k: torch.isnan(v) for k, v in st.comp.items()}

    check, _ = scene.resume(mutate=inspect)
    assert check.exact
    # Window ring (W = 8 slots): tokens 41..47 restored, the slot of token 40 stays NaN.
    restored = [(B - 7 + i) % CFG.window for i in range(7)]
    for layer in range(CFG.num_layers):
        for slot in range(CFG.window):
            if slot in restored:
                assert bool(seen["window_finite"][layer, slot])
            else:
                assert bool(seen["window"][layer, slot])
    # CSA rings (8 slots of [kv_a | kv_b | score_a | score_b]): the slots of tokens 44..47
    # hold kv_a and score_a only; all else is NaN. HCA rings: all NaN.
    for (kind, layer), nan in seen["comp"].items():
        if not CFG.is_csa(layer):
            assert bool(nan.all()), (kind, layer)
            continue
        w = CFG.head_dim if kind == "kv" else CFG.index_dim
        kept_cols = torch.zeros(4 * w, dtype=torch.bool)
        kept_cols[:w] = True
        kept_cols[2 * w:3 * w] = True
        kept_slots = [(B - 4 + i) % 8 for i in range(4)]
        for slot in range(8):
            want_nan = torch.ones(4 * w, dtype=torch.bool) if slot not in kept_slots else ~kept_cols
            assert torch.equal(nan[slot], want_nan), (kind, layer, slot)
