"""Synthetic cache contents derived from the token prefix, and their verification.

"Computing" a page writes bytes that are a pure function of the page's chained hash (which
covers every token before it), the family and the layer::

    word[k] of (family f, layer l, page with hash h) = seed(h) + f * 2**40 + l * 2**32 + k

so a page moved to the wrong row, layer, family or prefix reads back different bytes. A
snapshot for boundary b uses the hash of the last page before b mixed with a state tag.
Filling and checking are vectorised torch ops, fast enough for GBs of traffic.
"""

from __future__ import annotations

from typing import Sequence

import numpy as np
import torch

from hicache.layout import CacheLayout
from hicache.pools import TierPools

STATE_TAG = 0x5A5A_5A5A_5A5A


def seed_of(page_hash: bytes) -> int:
    """A 62-bit seed from a page hash (kept small so seed + offsets never overflow)."""
    return int.from_bytes(page_hash[:8], "little") >> 2


def _pattern(seeds: torch.Tensor, family_index: int, layer_index: int, unit_bytes: int) -> torch.Tensor:
    """``[len(seeds), unit_bytes]`` uint8 pattern for one family and layer."""
    words = (unit_bytes + 7) // 8
    base = seeds + (family_index << 40) + (layer_index << 32)
    vals = base[:, None] + torch.arange(words, dtype=torch.int64)[None, :]
    return vals.view(torch.uint8).reshape(len(seeds), words * 8)[:, :unit_bytes]


def fill(tier: TierPools, source: str, ids: Sequence[int], seeds: Sequence[int]) -> None:
    """Write the synthetic contents of ``seeds`` into rows ``ids`` of every family on ``source``."""
    if len(ids) == 0:
        return
    idx = torch.as_tensor(np.asarray(ids, np.int64))
    s = torch.as_tensor(np.asarray(seeds, np.int64))
    for fi, fam in enumerate(tier.layout.families):
        if fam.index_source != source:
            continue
        view = tier.view(fam.name)
        unit = view.shape[2]
        if unit == 0:
            continue
        for li in range(view.shape[0]):
            view[li, idx] = _pattern(s, fi, li, unit).to(view.device)


def check(tier: TierPools, source: str, ids: Sequence[int], seeds: Sequence[int]) -> np.ndarray:
    """Per row, True if every family and layer holds the expected bytes."""
    ok = np.ones(len(ids), dtype=bool)
    if len(ids) == 0:
        return ok
    idx = torch.as_tensor(np.asarray(ids, np.int64))
    s = torch.as_tensor(np.asarray(seeds, np.int64))
    for fi, fam in enumerate(tier.layout.families):
        if fam.index_source != source:
            continue
        view = tier.view(fam.name)
        unit = view.shape[2]
        if unit == 0:
            continue
        for li in range(view.shape[0]):
            got = view[li, idx].cpu()
            ok &= (got == _pattern(s, fi, li, unit)).all(dim=1).numpy()
    return ok


def page_seeds(hashes: Sequence[bytes]) -> list[int]:
    return [seed_of(h) for h in hashes]


def snapshot_seed(boundary_hash: bytes) -> int:
    return seed_of(boundary_hash) ^ STATE_TAG


def layout_sources(layout: CacheLayout) -> tuple[str, ...]:
    return tuple(s for s in ("page", "state") if layout.object_bytes(s))
