"""The gated token compressor (one compressed entry per ``r`` tokens), chunk by chunk.

Entry ``j`` covers tokens ``[j*r, (j+1)*r)`` and exists once its last token has been
seen. For a chunk ``[s, s + n)`` the new entries are ``j in [s // r, (s + n) // r)``::

    positions   ... | 4j-4 .. 4j-1 | 4j .. 4j+3 | ...
    CSA (r=4):        (kv_a,sc_a)    (kv_b,sc_b)     -> softmax over 8 slots -> entry j
    HCA (r=m):                       (kv, sc) x m    -> softmax over m slots -> entry j

(the softmax runs over the slot axis separately for every value, as in DeepSeek-V4; for
entry 0 the overlap slots do not exist: kv 0, score -inf). The entry is RMS-normalised and
rotated at position ``j*r``. The tokens the next chunk still needs stay in the working
area's ring: ``[r*floor(t/r) - r, t)`` for CSA and ``[m*floor(t/m), t)`` for HCA.
"""

from __future__ import annotations

import torch

from hicache.engine.tiny_model.ops import RopeTable, linear, rms_norm
from hicache.engine.tiny_model.state import WorkingState
from hicache.engine.tiny_model.weights import CompressorWeights

NEG_INF = float("-inf")


def compress_chunk(state: WorkingState, ring: torch.Tensor, w: CompressorWeights,
                   x: torch.Tensor, start: int, ratio: int, overlap: bool,
                   rope: RopeTable, eps: float) -> torch.Tensor:
    """Project the chunk, emit the entries it completes (``[c, dim]``), update the ring.

    ``x`` is the chunk's normalised hidden state ``[n, hidden]`` at positions
    ``[start, start + n)``; ``state.length`` must still be ``start``.
    """
    n, r = x.shape[0], ratio
    dim = w.norm.shape[0]
    pos = torch.arange(start, start + n)
    kv = linear(x, w.wkv)
    score = linear(x, w.wgate) + w.ape[pos % r]
    rows = torch.cat([kv, score], dim=-1)                      # [n, width]

    back = r if overlap else 0
    base = (start // r) * r - back                             # first position still needed
    old = state.read(ring, base, start)
    allrows = torch.cat([old, rows])                           # positions [base, start + n)

    first_j, end_j = start // r, (start + n) // r
    if end_j > first_j:
        j = torch.arange(first_j, end_j)
        own_pos = j[:, None] * r + torch.arange(r)[None, :]    # [c, r]
        own = allrows[own_pos - base]
        if overlap:
            own_kv, own_sc = own[..., dim:2 * dim], own[..., 3 * dim:]
            prev_pos = own_pos - r
            valid = (prev_pos >= 0)[..., None]
            prev = allrows[(prev_pos - base).clamp(min=0)]
            prev_kv = torch.where(valid, prev[..., :dim], torch.zeros((), dtype=x.dtype))
            prev_sc = torch.where(valid, prev[..., 2 * dim:3 * dim],
                                  torch.full((), NEG_INF, dtype=x.dtype))
            kvs = torch.cat([prev_kv, own_kv], dim=1)          # [c, 2r, dim]
            scs = torch.cat([prev_sc, own_sc], dim=1)
        else:
            kvs, scs = own[..., :dim], own[..., dim:]          # [c, r, dim]
        mixed = (kvs * torch.softmax(scs, dim=1)).sum(dim=1)
        entries = rope.apply(rms_norm(mixed, w.norm, eps), j * r)
    else:
        entries = x.new_zeros((0, dim))

    keep_from = end_j * r - back
    state.write(ring, start, rows, keep_from)
    return entries
