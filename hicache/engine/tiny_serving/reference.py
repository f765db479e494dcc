"""The truth a served request is held to: a full recompute of its tokens with no cache.

Two independent checks, both against :class:`DenseSequenceCache` runs that reuse nothing:

* **logits** (the exactness claim): every position the engine computed after a resume is
  compared with ``reference_logits(model, prompt + output)`` -- one forward over the whole
  sequence -- and the worst absolute difference is kept (``compare_logits``);
* **bytes** (where a wrong logit would come from): the borrowed history pages and the
  state snapshot a request resumes from are compared, bit for bit, with the rows a dense
  run of ``tokens[:b]`` produces for the same boundary ``b``. A page whose rows differ in
  any history family or layer counts as one mismatched page; the snapshot counts as one
  object (like the synthetic engine's ``verified_pages`` / ``mismatched_pages``).

Bit-for-bit is the right bar: the model is batch-invariant (docs/tiny_model.md), so page
contents are a pure function of the token prefix, whoever computed them.
"""

from __future__ import annotations

from typing import NamedTuple

import torch

from hicache.engine.tiny_model import (DenseSequenceCache, LogitCheck, PagedSequenceCache,
                                       TinyV4Model, compare_logits, reference_logits, state_rows)
from hicache.pools import TierPools


class PageCheck(NamedTuple):
    """Objects (pages + the snapshot) read back at a resume: equal / different bits."""

    verified: int
    mismatched: int


def _bits(t: torch.Tensor) -> torch.Tensor:
    return t.contiguous().view(torch.int64)


def snapshot_rows(pools: TierPools, family: str, snapshot_id: int) -> torch.Tensor:
    """``[layers, rows_kept, values]`` float64 rows of one state family in one snapshot row."""
    fam = pools.layout.family(family)
    view = pools.view(family)[:, snapshot_id].view(torch.float64)
    return view.reshape(view.shape[0], fam.rows_kept, -1).to("cpu")


class Reference:
    """No-cache reference of one request's token sequence (prompt + output).

    The full-sequence logits are computed once, on first use, and reused for every chunk
    the engine checks (also across a preemption and retry of the same request).
    """

    def __init__(self, model: TinyV4Model, tokens: torch.Tensor):
        self.model = model
        self.tokens = tokens
        self._logits: torch.Tensor | None = None

    @property
    def logits(self) -> torch.Tensor:
        if self._logits is None:
            self._logits = reference_logits(self.model, self.tokens)
        return self._logits

    def check(self, got: torch.Tensor, start: int) -> LogitCheck:
        """Compare logits the engine computed for positions ``[start, start + len(got))``."""
        return compare_logits(got, self.logits[start: start + got.shape[0]])

    def verify_resume(self, seq: PagedSequenceCache, pools: TierPools, boundary: int,
                      snapshot_id: int | None) -> PageCheck:
        """Bit-compare the borrowed pages of ``[0, boundary)`` (through ``seq``'s page
        table) and the snapshot row with a dense run of ``tokens[:boundary]``."""
        if boundary == 0:
            return PageCheck(0, 0)
        layout = seq.layout
        dense = DenseSequenceCache(self.model.cfg)
        self.model.forward(self.tokens[:boundary], 0, dense)
        pages = boundary // layout.page_tokens
        bad = torch.zeros(pages, dtype=torch.bool)
        for fam in layout.history_families:
            rows = boundary // fam.tokens_per_row
            for layer in fam.layer_ids:
                got = _bits(seq.read_history(fam.name, layer, rows))
                want = _bits(dense.read_history(fam.name, layer, rows))
                bad |= (got != want).reshape(pages, -1).any(dim=1)
        mismatched = int(bad.sum())
        verified = pages - mismatched
        if snapshot_id is not None:
            same = all(
                torch.equal(_bits(snapshot_rows(pools, fam.name, snapshot_id)),
                            _bits(state_rows(dense.state, fam, boundary)))
                for fam in layout.state_families if fam.rows_kept)
            verified += same
            mismatched += not same
        return PageCheck(verified, mismatched)


__all__ = ["Reference", "PageCheck", "snapshot_rows"]
