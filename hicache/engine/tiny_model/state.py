"""The per-request working area (live state) and what a snapshot keeps of it.

Every buffer is a ring indexed by absolute token position, ``slot = pos % capacity``::

    window[layer]        capacity W    row: the token's KV (head_dim)
    comp[kv, layer]      capacity 2r (CSA, overlapping) or m (HCA)
    comp[index, layer]   capacity 2r (CSA indexer compressor)

A compressor ring row is the token's projected ``[kv | score]`` (score already carries the
in-block position bias ``ape``). The overlapping CSA compressor projects two halves::

    row = [ kv_a | kv_b | score_a | score_b ]      each `dim` wide
            ^ used by the NEXT entry (overlap)
                   ^ used by the token's OWN entry

so the entry covering ``[4j, 4j + 4)`` mixes ``(kv_a, score_a)`` of tokens ``[4j - 4, 4j)``
with ``(kv_b, score_b)`` of tokens ``[4j, 4j + 4)``, one softmax over those 8 slots.

A new working area is filled with NaN. The model masks positions < 0 with ``where`` (never
by multiplying), so a NaN can reach the logits only if the model reads a row that was
neither computed by this request nor restored from a snapshot -- which is how the tests
prove that a snapshot's ``rows_kept`` rows are sufficient.
"""

from __future__ import annotations

import torch

from hicache.engine.tiny_model.config import (CSA_RATIO, INDEXER_STATE_FAMILY, SWA_FAMILY,
                                              TinyV4Config, state_family)
from hicache.errors import MisuseError
from hicache.layout import FamilySpec

DTYPE = torch.float64
POISON = float("nan")
KV, INDEX = "kv", "index"


def row_width(dim: int, overlap: bool) -> int:
    """Values in one compressor ring row ``[kv | score]``."""
    return 2 * (2 if overlap else 1) * dim


class WorkingState:
    """Live sliding window and compressor tails of one request, all layers.

    ``length`` is the number of tokens whose effects are in the state (the next position).
    """

    def __init__(self, cfg: TinyV4Config):
        self.cfg = cfg
        self.length = 0
        self.window = torch.full((cfg.num_layers, cfg.window, cfg.head_dim), POISON, dtype=DTYPE)
        self.comp: dict[tuple[str, int], torch.Tensor] = {}
        for layer, r in enumerate(cfg.compress_ratios):
            if not r:
                continue
            overlap = r == CSA_RATIO
            cap = 2 * r if overlap else r
            self.comp[(KV, layer)] = torch.full((cap, row_width(cfg.head_dim, overlap)), POISON,
                                                dtype=DTYPE)
            if overlap:
                self.comp[(INDEX, layer)] = torch.full((cap, row_width(cfg.index_dim, True)),
                                                       POISON, dtype=DTYPE)

    def reset(self) -> None:
        """Forget everything: length 0, every slot NaN."""
        self.length = 0
        self.window.fill_(POISON)
        for buf in self.comp.values():
            buf.fill_(POISON)

    # -- ring access ----------------------------------------------------------------------
    def _check_live(self, buf: torch.Tensor, first: int, last: int) -> None:
        assert first <= last <= self.length, f"ring read [{first}, {last}) beyond length {self.length}"
        assert last - first <= buf.shape[0] and first >= self.length - buf.shape[0], (
            f"ring read [{first}, {last}) outside the live span of {buf.shape[0]} slots "
            f"before {self.length}")

    @staticmethod
    def _slots(buf: torch.Tensor, first: int, last: int) -> torch.Tensor:
        return torch.arange(first, last) % buf.shape[0]

    def read(self, buf: torch.Tensor, first: int, last: int) -> torch.Tensor:
        """Rows of positions ``[first, last)`` (positions < 0 hold NaN; callers mask them)."""
        self._check_live(buf, first, last)
        return buf[self._slots(buf, first, last)]

    @staticmethod
    def write(buf: torch.Tensor, first_pos: int, rows: torch.Tensor, keep_from: int) -> None:
        """Store rows of positions ``[first_pos, first_pos + n)`` that are ``>= keep_from``."""
        lo = max(first_pos, keep_from)
        hi = first_pos + rows.shape[0]
        if lo >= hi:
            return
        assert hi - lo <= buf.shape[0], f"writing {hi - lo} rows into a ring of {buf.shape[0]}"
        buf[torch.arange(lo, hi) % buf.shape[0]] = rows[lo - first_pos:]

    def comp_buffer(self, kind: str, layer: int) -> torch.Tensor:
        return self.comp[(kind, layer)]


# -- snapshots: which rows of which buffer a state family keeps ------------------------------
def _binding(state: WorkingState, family: FamilySpec) -> tuple[list[torch.Tensor], torch.Tensor]:
    """The per-layer ring buffers behind a state family and the columns the family keeps."""
    cfg = state.cfg
    name = family.name
    if name == SWA_FAMILY:
        return [state.window[l] for l in family.layer_ids], torch.arange(cfg.head_dim)
    if name == INDEXER_STATE_FAMILY:
        d = cfg.index_dim
        bufs = [state.comp_buffer(INDEX, l) for l in family.layer_ids]
        return bufs, torch.cat([torch.arange(0, d), torch.arange(2 * d, 3 * d)])  # kv_a, score_a
    for r in cfg.ratios:
        if name == state_family(r):
            bufs = [state.comp_buffer(KV, l) for l in family.layer_ids]
            d = cfg.head_dim
            if r == CSA_RATIO:
                return bufs, torch.cat([torch.arange(0, d), torch.arange(2 * d, 3 * d)])
            return bufs, torch.arange(2 * d)  # a mid-block HCA boundary keeps (kv, score)
    raise MisuseError(f"state family {name!r} is not part of the tiny model's layout")


def state_rows(state: WorkingState, family: FamilySpec, boundary: int) -> torch.Tensor:
    """``[num_layers, rows_kept, row_values]``: the rows a snapshot at ``boundary`` keeps,
    for tokens ``[boundary - rows_kept, boundary)`` in position order (rows of positions
    < 0 are zeros, so a snapshot's bytes depend only on the prefix)."""
    bufs, cols = _binding(state, family)
    first = boundary - family.rows_kept
    pos = torch.arange(first, boundary)
    out = []
    for buf in bufs:
        rows = state.read(buf, first, boundary)[:, cols]
        out.append(torch.where((pos >= 0)[:, None], rows, torch.zeros((), dtype=DTYPE)))
    if not out:
        return torch.empty((0, family.rows_kept, len(cols)), dtype=DTYPE)
    return torch.stack(out)


def restore_rows(state: WorkingState, family: FamilySpec, rows: torch.Tensor, *,
                 first_pos: int) -> None:
    """Put snapshot rows back: row ``i`` belongs to token ``first_pos + i``.

    Only the family's columns are written; the rest of each ring slot stays as it was
    (NaN after :meth:`WorkingState.reset`). ``first_pos`` is the sliding base offset,
    normally ``boundary - rows_kept``.
    """
    bufs, cols = _binding(state, family)
    expect = (len(bufs), family.rows_kept, len(cols))
    if tuple(rows.shape) != expect:
        raise MisuseError(f"{family.name}: snapshot rows have shape {tuple(rows.shape)}, "
                          f"expected {expect}")
    if family.rows_kept == 0:
        return
    for buf, layer_rows in zip(bufs, rows):
        assert family.rows_kept <= buf.shape[0], f"{family.name}: ring smaller than rows_kept"
        slots = torch.arange(first_pos, first_pos + family.rows_kept) % buf.shape[0]
        sub = buf[slots]
        sub[:, cols] = layer_rows.to(DTYPE)
        buf[slots] = sub
