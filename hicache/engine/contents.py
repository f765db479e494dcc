"""Synthetic cache contents derived from the token prefix, and their verification.

"Computing" a page writes bytes that are a pure function of the page's chained hash (which
covers every token before it), the family and the layer::

    word[k] of (family f, layer l, page with hash h) = seed(h) + f * 2**40 + l * 2**32 + k

so a page moved to the wrong row, layer, family or prefix reads back different bytes. A
snapshot for boundary b uses the hash of the last page before b mixed with a state tag.
Filling and checking are vectorised torch ops, fast enough for GBs of traffic.
"""

from __future__ import annotations

import weakref
from typing import Sequence

import numpy as np
import torch

from hicache.layout import CacheLayout
from hicache.pools import TierPools

STATE_TAG = 0x5A5A_5A5A_5A5A


def seed_of(page_hash: bytes) -> int:
    """A 62-bit seed from a page hash (kept small so seed + offsets never overflow)."""
    return int.from_bytes(page_hash[:8], "little") >> 2


# Per tier (weakly: a closed cache's pools must be freed) and source.
_BASES: "weakref.WeakKeyDictionary[TierPools, dict]" = weakref.WeakKeyDictionary()


def _bases(tier: TierPools, source: str) -> list[tuple[torch.Tensor, torch.Tensor | None]]:
    """Per family on ``source``: (the pool view, as int64 words when rows allow, and the
    ``[layers, words]`` base pattern ``(f << 40) + (l << 32) + k``). A page's contents are
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
        out.append((view, base, wide, unit, torch.empty_like(base)))
    per_tier[source] = out
    return out


def _bytes_of(base: torch.Tensor, seed: int, unit: int) -> torch.Tensor:
    return (base + seed).view(torch.uint8).reshape(base.shape[0], -1)[:, :unit]


def fill(tier: TierPools, source: str, ids: Sequence[int], seeds: Sequence[int]) -> None:
    """Write the synthetic contents of ``seeds`` into rows ``ids`` of every family on ``source``."""
    for view, base, wide, unit, _ in _bases(tier, source):
        for row, seed in zip(ids, seeds):
            if wide:
                torch.add(base, int(seed), out=view[:, int(row)])
            else:
                view[:, int(row)] = _bytes_of(base, int(seed), unit)


def check(tier: TierPools, source: str, ids: Sequence[int], seeds: Sequence[int]) -> np.ndarray:
    """Per row, True if every family and layer holds the expected bytes."""
    ok = np.ones(len(ids), dtype=bool)
    for view, base, wide, unit, scratch in _bases(tier, source):
        for i, (row, seed) in enumerate(zip(ids, seeds)):
            if not ok[i]:
                continue
            if wide:
                torch.add(base, int(seed), out=scratch)
                ok[i] = torch.equal(view[:, int(row)], scratch)
            else:
                ok[i] = torch.equal(view[:, int(row)], _bytes_of(base, int(seed), unit))
    return ok


def page_seeds(hashes: Sequence[bytes]) -> list[int]:
    return [seed_of(h) for h in hashes]


def snapshot_seed(boundary_hash: bytes) -> int:
    return seed_of(boundary_hash) ^ STATE_TAG


def layout_sources(layout: CacheLayout) -> tuple[str, ...]:
    return tuple(s for s in ("page", "state") if layout.object_bytes(s))


# -- what a synthetic "engine" does with a lease ------------------------------------------

def verify_prefix(cache, lease, hashes: Sequence[bytes]) -> tuple[int, int, int, int]:
    """Check the lease's borrowed pages and resume snapshot against what they must hold.

    Returns ``(pages ok, pages bad, snapshots ok, snapshots bad)``.
    """
    n = lease.resume_pages
    ok = check(cache.pools.device, "page", lease.page_table[:n], page_seeds(hashes[:n]))
    snap_ok = snap_bad = 0
    if n and lease.snapshot_id is not None and cache.layout.object_bytes("state"):
        s = check(cache.pools.device, "state", [lease.snapshot_id], [snapshot_seed(hashes[n - 1])])
        snap_ok, snap_bad = int(s.sum()), int((~s).sum())
    return int(ok.sum()), int((~ok).sum()), snap_ok, snap_bad


def compute(cache, lease, hashes: Sequence[bytes], done_tokens: int, upto_tokens: int) -> bool:
    """"Compute" tokens ``[done, upto)``: allocate their pages and fill the whole ones.

    A partial last page is filled when it completes. False if the device has no room.
    """
    P = cache.page_tokens
    need = -(-upto_tokens // P) - len(lease.page_table)
    if need > 0 and not cache.alloc_pages(lease, need).ok:
        return False
    lo, hi = done_tokens // P, upto_tokens // P
    fill(cache.pools.device, "page", lease.page_table[lo:hi], page_seeds(hashes[lo:hi]))
    return True


def publish(cache, lease, tokens, done_tokens: int, hashes: Sequence[bytes], why) -> None:
    """Publish every whole computed page with a snapshot for that boundary (if there is
    room for one). A real engine captures the state as its chunk passes the boundary."""
    pages = done_tokens // cache.page_tokens
    snap = None
    if pages and cache.layout.object_bytes("state"):
        alloc = cache.alloc_snapshot(lease)
        if alloc.ok:
            snap = alloc
            fill(cache.pools.device, "state", [int(alloc.ids[0])], [snapshot_seed(hashes[pages - 1])])
    cache.publish(lease, tokens[:done_tokens], pages, snapshot=snap, why=why)
