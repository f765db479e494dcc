"""The native batched memcpy: threads, streaming stores, odd sizes and alignments."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from hicache.transfer import native

pytestmark = pytest.mark.skipif(native.load() is None, reason=f"native copy {native.status()}")


@pytest.mark.parametrize("threads", [1, 2, 5])
@pytest.mark.parametrize("stream", [False, True])
def test_copy_pieces_matches_numpy(threads, stream):
    rng = np.random.default_rng(threads)
    src = torch.from_numpy(rng.integers(0, 256, 12 << 20, dtype=np.uint8))
    dst = torch.zeros(12 << 20, dtype=torch.uint8)
    # 300 pieces of 1 byte to 80 KB at unaligned, shuffled, non-overlapping offsets.
    sizes = rng.integers(1, 80_000, 300)
    sizes[:20] = rng.integers(1, 64, 20)            # below the streaming threshold
    def layout(gap):   # shuffled order, pieces back to back with ``gap`` bytes between
        order = rng.permutation(len(sizes))
        starts = np.empty(len(sizes), dtype=np.int64)
        starts[order] = 3 + np.concatenate(([0], np.cumsum(sizes[order] + gap)[:-1]))
        return starts

    s_off, d_off = layout(13), layout(7)
    assert s_off.max() + sizes.max() < src.numel() and d_off.max() + sizes.max() < dst.numel()
    native.copy_pieces(src.data_ptr() + s_off, dst.data_ptr() + d_off, sizes, threads, stream=stream)
    want = torch.zeros_like(dst)
    for s, d, n in zip(s_off, d_off, sizes):
        want[d: d + n] = src[s: s + n]
    assert torch.equal(dst, want)


def test_status_and_disable(monkeypatch, tmp_path):
    assert native.status().startswith("ok (")
    monkeypatch.setattr(native, "_lib", None)
    monkeypatch.setattr(native, "_status", None)
    monkeypatch.setenv("HICACHE_NATIVE", "0")
    assert native.load() is None and native.status() == "disabled by HICACHE_NATIVE=0"
    monkeypatch.setattr(native, "_status", None)
    monkeypatch.setenv("HICACHE_NATIVE", "1")
    monkeypatch.setenv("HICACHE_CACHE_DIR", str(tmp_path))
    monkeypatch.setenv("CC", str(tmp_path / "no-such-compiler"))
    assert native.load() is None and "unavailable" in native.status()
    monkeypatch.setattr(native, "_status", None)
    monkeypatch.delenv("CC")
    assert native.load() is not None                    # builds into the fresh cache dir
    assert list(tmp_path.glob("hc_copy_*.so"))
