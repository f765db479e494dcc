"""Synthetic cache contents derived from the token prefix, and their verification.

"Computing" a page writes bytes that are a pure function of the page's chained hash (which
covers every token before it), the family and the layer::

    word[k] of (family f, layer l, page with hash h) = seed(h) + f * 2**40 + l * 2**32 + k

so a page moved to the wrong row, layer, family or prefix reads back different bytes. A
snapshot for boundary b uses the hash of the last page before b mixed with a state tag.

Three modes (:data:`VerifyMode`), one per engine run:

* ``full``: every word of every layer is written and compared (GBs of torch traffic; a
  DeepSeek-V4-Flash page is ~1 MB, a snapshot ~4 MB). The proof for CI.
* ``sample``: every word is written as in ``full``, and per page, per family, per layer,
  :data:`SAMPLE_WORDS` words are compared: the first, the last, and the rest at offsets
  drawn from the page's seed (so over many pages every part of a row is covered). A page
  in the wrong row, layer, family or prefix, a stale row, a copy cut short at either end
  still fails; damage confined to unsampled words of one page can pass.
* ``off``: nothing is written or checked (pages verified: 0); rows hold whatever they held.

Only the *check* depends on the mode, never the contents written (``full`` and ``sample``
write the same bytes): engines sharing an L3 store must agree on what a page holds whatever
their settings, so a store filled by a ``sample`` replay reads back clean in a ``full`` one
(issue 26: writing only the sampled words left the rest of each row stale, and a ``full``
reader of such a store counted thousands of mismatched pages whose objects all passed their
checksum). A writer with ``off`` stores arbitrary bytes: a fleet that verifies must not
mix ``off`` writers in.
"""

from __future__ import annotations

import weakref
from dataclasses import dataclass
from typing import Literal, Sequence

import numpy as np
import torch

from hicache.errors import ConfigError
from hicache.layout import CacheLayout
from hicache.pools import TierPools

STATE_TAG = 0x5A5A_5A5A_5A5A
VerifyMode = Literal["full", "sample", "off"]
VERIFY_MODES: tuple[VerifyMode, ...] = ("full", "sample", "off")
SAMPLE_WORDS = 4   # per page, family and layer: first, last and 2 drawn from the seed
_MIX_A, _MIX_B = 0x9E3779B97F4A7C15 - 2**64, 0xBF58476D1CE4E5B9 - 2**64  # odd, as int64


def check_mode(mode: str) -> VerifyMode:
    for known in VERIFY_MODES:
        if mode == known:
            return known
    raise ConfigError("verify", mode, f"must be one of {list(VERIFY_MODES)}")


def seed_of(page_hash: bytes) -> int:
    """A 62-bit seed from a page hash (kept small so seed + offsets never overflow)."""
    return int.from_bytes(page_hash[:8], "little") >> 2


@dataclass(frozen=True)
class _Family:
    """One family's rows on a tier, as words when rows allow (``wide``), else bytes."""

    view: torch.Tensor      # [layers, rows, words] int64, or [layers, rows, unit] uint8
    base: torch.Tensor      # [layers, words] ``(f << 40) + (l << 32) + k``
    wide: bool
    unit: int               # bytes per row
    scratch: torch.Tensor   # like base, reused by full checks
    index: int              # f
    # sampling constants, [1, layers, 1] / [1, 1, SAMPLE_WORDS]
    layer: torch.Tensor     # layer index (torch, for indexing the view)
    lw: np.ndarray          # (f << 40) + (l << 32): a word's value less its offset and seed
    lmix: np.ndarray        # per-layer and per-sample mixing terms of the offset draw
    jmix: np.ndarray

    @property
    def width(self) -> int:
        """Addressable units per row: words when wide, else bytes."""
        return self.view.shape[2]


# Per tier (weakly: a closed cache's pools must be freed) and source.
_BASES: "weakref.WeakKeyDictionary[TierPools, dict]" = weakref.WeakKeyDictionary()


def _bases(tier: TierPools, source: str) -> list[_Family]:
    """Per family on ``source``: the pool view and the base pattern. A page's contents are
    ``base + seed``, written straight into the pool row without temporaries."""
    per_tier = _BASES.setdefault(tier, {})
    if source in per_tier:
        return per_tier[source]
    out = []
    for fi, fam in enumerate(tier.layout.families):
        if fam.index_source != source:
            continue
        view = tier.view(fam.name)
        unit = view.shape[2]
        if unit == 0:
            continue
        wide = unit % 8 == 0
        if wide:
            view = view.view(torch.int64)
        words = view.shape[2] if wide else (unit + 7) // 8
        layers = torch.arange(view.shape[0], dtype=torch.int64)[:, None] << 32
        base = (fi << 40) + layers + torch.arange(words, dtype=torch.int64)[None, :]
        base = base.to(view.device)
        # scratch: reused by check() -- fresh 1-3 MB tensors per page would cost page faults
        n_layers = view.shape[0]
        layer = np.arange(n_layers, dtype=np.int64)[None, :, None]
        with np.errstate(over="ignore"):
            lmix = layer * np.int64(_MIX_A)
            jmix = (np.arange(SAMPLE_WORDS, dtype=np.int64)[None, None, :] + 1) * np.int64(_MIX_B)
        out.append(_Family(view, base, wide, unit, torch.empty_like(base), fi,
                           torch.from_numpy(layer).to(view.device), (fi << 40) + (layer << 32), lmix, jmix))
    per_tier[source] = out
    return out


def _bytes_of(base: torch.Tensor, seed: int, unit: int) -> torch.Tensor:
    return (base + seed).view(torch.uint8).reshape(base.shape[0], -1)[:, :unit]


def _samples(fam: _Family, ids: Sequence[int], seeds: Sequence[int]):
    """Index tensors and expected values of the sampled units of rows ``ids``:
    ``fam.view[layer, row, pos] == value`` for pages ``[n, layers, SAMPLE_WORDS]``. Drawn
    with numpy (a few microseconds) so that a call costs one torch indexing op."""
    seed = np.asarray(seeds, dtype=np.int64)[:, None, None]
    with np.errstate(over="ignore"):
        mixed = (seed ^ fam.lmix ^ fam.jmix) * np.int64(_MIX_A)
    pos = (mixed >> 17) % fam.width
    pos[..., 0] = 0
    pos[..., 1] = fam.width - 1
    if fam.wide:
        value = fam.lw + pos + seed
    else:  # byte b of a row is byte b % 8 of word b // 8 (little endian, as _bytes_of)
        word = fam.lw + pos // 8 + seed
        value = ((word >> ((pos % 8) * 8)) & 0xFF).astype(np.uint8)
    dev = fam.view.device
    rows = torch.from_numpy(np.asarray(ids, dtype=np.int64)[:, None, None]).to(dev)
    return fam.layer, rows, torch.from_numpy(pos).to(dev), torch.from_numpy(value).to(dev)


def fill(tier: TierPools, source: str, ids: Sequence[int], seeds: Sequence[int],
         mode: VerifyMode = "full") -> None:
    """Write the synthetic contents of ``seeds`` into rows ``ids`` of every family on ``source``."""
    if mode == "off" or not len(ids):
        return
    for fam in _bases(tier, source):
        if fam.wide:
            _fill_words(fam, ids, seeds)
            continue
        for row, seed in zip(ids, seeds):
            fam.view[:, int(row)] = _bytes_of(fam.base, int(seed), fam.unit)


def _fill_words(fam: _Family, ids: Sequence[int], seeds: Sequence[int]) -> None:
    """Word rows' contents, ``view[:, row] = base + seed`` written in place row by row --
    the same call whatever the mode, so the mode cannot change what is written. On the
    CPU through numpy: torch's CPU kernels on these strided rows ran up to 80x slower
    than numpy's on a 2-core machine (its thread pool), and every published page passes
    here."""
    if fam.view.device.type == "cpu":
        view, base = fam.view.numpy(), fam.base.numpy()
        for row, seed in zip(ids, seeds):
            np.add(base, np.int64(seed), out=view[:, int(row)])
        return
    for row, seed in zip(ids, seeds):
        torch.add(fam.base, int(seed), out=fam.view[:, int(row)])


def check(tier: TierPools, source: str, ids: Sequence[int], seeds: Sequence[int],
          mode: VerifyMode = "full") -> np.ndarray:
    """Per row, True if every family and layer holds the expected bytes (in ``sample``
    mode: the sampled ones; ``off``: nothing is checked, all True)."""
    ok = np.ones(len(ids), dtype=bool)
    if mode == "off" or not len(ids):
        return ok
    for fam in _bases(tier, source):
        if mode == "sample":
            layer, rows, pos, value = _samples(fam, ids, seeds)
            ok &= (fam.view[layer, rows, pos] == value).flatten(1).all(dim=1).cpu().numpy()
            continue
        for i, (row, seed) in enumerate(zip(ids, seeds)):
            if not ok[i]:
                continue
            if fam.wide:
                torch.add(fam.base, int(seed), out=fam.scratch)
                ok[i] = torch.equal(fam.view[:, int(row)], fam.scratch)
            else:
                ok[i] = torch.equal(fam.view[:, int(row)], _bytes_of(fam.base, int(seed), fam.unit))
    return ok


def page_seeds(hashes: Sequence[bytes]) -> list[int]:
    return [seed_of(h) for h in hashes]


def snapshot_seed(boundary_hash: bytes) -> int:
    return seed_of(boundary_hash) ^ STATE_TAG


def layout_sources(layout: CacheLayout) -> tuple[str, ...]:
    return tuple(s for s in ("page", "state") if layout.object_bytes(s))


# -- what a synthetic "engine" does with a lease ------------------------------------------

def verify_prefix(cache, lease, hashes: Sequence[bytes], mode: VerifyMode = "full") -> tuple[int, int, int, int]:
    """Check the lease's borrowed pages and resume snapshot against what they must hold.

    Returns ``(pages ok, pages bad, snapshots ok, snapshots bad)``; all zero with ``off``.
    """
    if mode == "off":
        return 0, 0, 0, 0
    n = lease.resume_pages
    ok = check(cache.pools.device, "page", lease.page_table[:n], page_seeds(hashes[:n]), mode)
    snap_ok = snap_bad = 0
    if n and lease.snapshot_id is not None and cache.layout.object_bytes("state"):
        s = check(cache.pools.device, "state", [lease.snapshot_id], [snapshot_seed(hashes[n - 1])], mode)
        snap_ok, snap_bad = int(s.sum()), int((~s).sum())
    return int(ok.sum()), int((~ok).sum()), snap_ok, snap_bad


def compute(cache, lease, hashes: Sequence[bytes], done_tokens: int, upto_tokens: int,
            mode: VerifyMode = "full") -> bool:
    """"Compute" tokens ``[done, upto)``: allocate their pages and fill the whole ones.

    A partial last page is filled when it completes. False if the device has no room.
    """
    P = cache.page_tokens
    need = -(-upto_tokens // P) - len(lease.page_table)
    if need > 0 and not cache.alloc_pages(lease, need).ok:
        return False
    lo, hi = done_tokens // P, upto_tokens // P
    if mode != "off":
        fill(cache.pools.device, "page", lease.page_table[lo:hi], page_seeds(hashes[lo:hi]), mode)
    return True


def publish(cache, lease, tokens, done_tokens: int, hashes: Sequence[bytes], why,
            mode: VerifyMode = "full") -> None:
    """Publish every whole computed page with a snapshot for that boundary (if there is
    room for one). A real engine captures the state as its chunk passes the boundary."""
    pages = done_tokens // cache.page_tokens
    snap = None
    if pages and cache.layout.object_bytes("state"):
        alloc = cache.alloc_snapshot(lease)
        if alloc.ok:
            snap = alloc
            if mode != "off":   # (with off, ``hashes`` may be empty: nothing is written)
                fill(cache.pools.device, "state", [int(alloc.ids[0])], [snapshot_seed(hashes[pages - 1])], mode)
    cache.publish(lease, tokens[:done_tokens], pages, snapshot=snap, why=why)
