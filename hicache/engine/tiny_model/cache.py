"""The seam between the model and the cache: what one request reads and writes.

The model sees a :class:`SequenceCache`: a :class:`WorkingState` (live sliding window and
compressor tails) plus history families read and written by row. Two implementations:

* :class:`DenseSequenceCache`: growing in-memory tensors, for the no-cache reference run.
* :class:`PagedSequenceCache`: history rows live in hicache's device pools, addressed by
  a page table; state moves between the working area and the state pool through
  snapshots. Row ``i`` of a history family with ``tokens_per_row`` r sits at::

      token t = i * r  ->  page_table[t // page_tokens],  row (t // r) % (page_tokens // r)
      pool view (float64): TierPools.view(family) -> [layers, pages, rows_per_page, dim]

History rows are causal (row ``i`` depends only on tokens ``[0, (i + 1) * r)``), so a page
holding tokens ``[k*P, (k+1)*P)`` is a function of the prefix and can be borrowed by any
request with the same prefix. Borrowed pages are read-only here.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import Sequence

import torch

from hicache.engine.tiny_model.config import TinyV4Config, layout_for
from hicache.engine.tiny_model.state import DTYPE, WorkingState, restore_rows, state_rows
from hicache.errors import MisuseError
from hicache.layout import CacheLayout, FamilySpec
from hicache.pools import AllocResult, TierPools, as_id_array


class SequenceCache(ABC):
    """What the model needs from a cache for one request."""

    def __init__(self, cfg: TinyV4Config):
        self.cfg = cfg
        self.layout: CacheLayout = layout_for(cfg)
        self.state = WorkingState(cfg)

    @property
    def length(self) -> int:
        """Tokens already processed; the next chunk must start here."""
        return self.state.length

    @property
    @abstractmethod
    def capacity_tokens(self) -> int:
        """How many tokens the history storage can hold right now."""

    @abstractmethod
    def read_history(self, family: str, layer: int, num_rows: int) -> torch.Tensor:
        """Rows ``[0, num_rows)`` of ``family`` for model layer ``layer``: ``[num_rows, dim]``."""

    @abstractmethod
    def write_history(self, family: str, layer: int, first_row: int, rows: torch.Tensor) -> None:
        """Store rows ``[first_row, first_row + len(rows))``."""

    def _layer_index(self, family: FamilySpec, layer: int) -> int:
        try:
            return family.layer_ids.index(layer)
        except ValueError:
            raise MisuseError(f"layer {layer} has no {family.name!r} rows") from None


class DenseSequenceCache(SequenceCache):
    """History in plain growing tensors: the reference run, no pools, no pages."""

    def __init__(self, cfg: TinyV4Config):
        super().__init__(cfg)
        self._rows: dict[tuple[str, int], torch.Tensor] = {}

    @property
    def capacity_tokens(self) -> int:
        return self.cfg.max_positions

    def read_history(self, family: str, layer: int, num_rows: int) -> torch.Tensor:
        fam = self.layout.family(family)
        rows = self._rows.get((family, layer))
        have = 0 if rows is None else rows.shape[0]
        assert num_rows <= have, f"{family} layer {layer}: reading {num_rows} rows, {have} written"
        if rows is None:
            return torch.zeros((0, fam.row_bytes // 8), dtype=DTYPE)
        return rows[:num_rows]

    def write_history(self, family: str, layer: int, first_row: int, rows: torch.Tensor) -> None:
        self._layer_index(self.layout.family(family), layer)
        old = self._rows.get((family, layer))
        have = 0 if old is None else old.shape[0]
        assert first_row == have, f"{family} layer {layer}: append at {first_row}, have {have} rows"
        self._rows[(family, layer)] = rows.clone() if old is None else torch.cat([old, rows])


class PagedSequenceCache(SequenceCache):
    """History in a tier's pools by page table; state snapshots in its state pool.

    ``page_table`` lists *borrowed* pages (someone else's, e.g. a prefix hit): they are
    read, never written, never freed here. :meth:`reserve` allocates *owned* pages from
    the pool (freed by :meth:`release` unless handed over by :meth:`publish_pages`);
    :meth:`extend_pages` appends writable pages the caller allocated and will free.
    """

    def __init__(self, cfg: TinyV4Config, pools: TierPools, page_table: Sequence[int] = ()):
        super().__init__(cfg)
        if pools.layout.fingerprint != self.layout.fingerprint:
            raise MisuseError(f"pools were built for layout {pools.layout.fingerprint}, "
                              f"this model needs {self.layout.fingerprint} (layout_for(cfg))")
        self.pools = pools
        self.page_table: list[int] = [int(p) for p in page_table]
        self._check_pages(self.page_table)
        self.num_borrowed = len(self.page_table)
        self.owned: list[int] = []
        rows_per_page = {f.name: self.layout.page_tokens // f.tokens_per_row
                         for f in self.layout.history_families}
        self._views = {name: self._f64(pools.view(name), rows) for name, rows in rows_per_page.items()}

    @staticmethod
    def _f64(view: torch.Tensor, rows: int) -> torch.Tensor:
        """uint8 ``[layers, ids, rows * row_bytes]`` -> float64 ``[layers, ids, rows, dim]``."""
        f = view.view(torch.float64)
        return f.view(f.shape[0], f.shape[1], rows, f.shape[2] // rows)

    def _check_pages(self, table: Sequence[int]) -> None:
        """Every page of a table is allocated in the pool and appears once."""
        self.pools.anchors["page"].check_ids(as_id_array(list(table)), must_be_used=True)

    # -- pages ------------------------------------------------------------------------------
    @property
    def capacity_tokens(self) -> int:
        return min(len(self.page_table) * self.layout.page_tokens, self.cfg.max_positions)

    def reserve(self, num_tokens: int) -> AllocResult:
        """Own enough pages to hold ``num_tokens`` tokens; the new ids, or NoRoom."""
        need = -(-num_tokens // self.layout.page_tokens) - len(self.page_table)
        result = self.pools.alloc("page", max(need, 0))
        if result.ok:
            ids = [int(i) for i in result.ids]
            self.page_table.extend(ids)
            self.owned.extend(ids)
        return result

    def extend_pages(self, ids: Sequence[int]) -> None:
        """Append writable pages the caller allocated (and frees)."""
        ids = [int(i) for i in ids]
        self._check_pages(self.page_table + ids)
        self.page_table.extend(ids)

    def publish_pages(self, boundary: int) -> list[int]:
        """Hand the pages of ``[0, boundary)`` to the caller (e.g. the radix tree).

        They become read-only here and are no longer freed by :meth:`release`.
        """
        p = self.layout.page_tokens
        if boundary % p or not 0 <= boundary <= self.length:
            raise MisuseError(f"publish boundary {boundary} must be a multiple of {p} within "
                              f"the {self.length} tokens computed")
        pages = self.page_table[: boundary // p]
        handed = set(pages)
        self.owned = [i for i in self.owned if i not in handed]
        self.num_borrowed = max(self.num_borrowed, len(pages))
        return list(pages)

    def release(self) -> None:
        """Free the pages this cache still owns."""
        if self.owned:
            self.pools.free("page", self.owned)
        self.owned = []

    # -- history rows -----------------------------------------------------------------------
    def _locate(self, family: str, rows: torch.Tensor) -> tuple[FamilySpec, torch.Tensor, torch.Tensor]:
        fam = self.layout.family(family)
        rpp = self.layout.page_tokens // fam.tokens_per_row
        page_idx = rows // rpp
        if rows.numel() and int(page_idx.max()) >= len(self.page_table):
            raise MisuseError(f"{family}: row {int(rows.max())} needs page {int(page_idx.max())}, "
                              f"the page table has {len(self.page_table)} (reserve first)")
        table = torch.tensor(self.page_table, dtype=torch.int64)
        return fam, table[page_idx], rows % rpp

    def read_history(self, family: str, layer: int, num_rows: int) -> torch.Tensor:
        fam, pages, slots = self._locate(family, torch.arange(num_rows))
        view = self._views[family][self._layer_index(fam, layer)]
        return view[pages.to(view.device), slots.to(view.device)].to("cpu", DTYPE)

    def write_history(self, family: str, layer: int, first_row: int, rows: torch.Tensor) -> None:
        idx = torch.arange(first_row, first_row + rows.shape[0])
        fam, pages, slots = self._locate(family, idx)
        rpp = self.layout.page_tokens // fam.tokens_per_row
        if idx.numel() and first_row // rpp < self.num_borrowed:
            raise MisuseError(f"{family}: row {first_row} lies in borrowed page "
                              f"{self.page_table[first_row // rpp]}, which is read-only")
        view = self._views[family][self._layer_index(fam, layer)]
        view[pages.to(view.device), slots.to(view.device)] = rows.to(view.device)

    # -- state snapshots --------------------------------------------------------------------
    def _snapshot_views(self, family: FamilySpec) -> torch.Tensor:
        return self._f64(self.pools.view(family.name), family.rows_kept)

    def _check_snapshot(self, boundary: int, snapshot_id: int) -> None:
        p = self.layout.page_tokens
        if isinstance(boundary, bool) or not isinstance(boundary, int) or boundary <= 0 or boundary % p:
            raise MisuseError(f"snapshot boundary {boundary!r} must be a positive multiple of "
                              f"page_tokens={p}")
        self.pools.anchors["state"].check_ids(as_id_array([snapshot_id], what="snapshot id"),
                                              must_be_used=True)

    def save_snapshot(self, boundary: int, snapshot_id: int) -> None:
        """Copy the ``rows_kept`` rows of every state family for ``boundary`` into the pool.

        Only possible when the request stands exactly at ``boundary`` (the working area
        keeps the live tail, not the past): engines split chunks at retained boundaries.
        """
        self._check_snapshot(boundary, snapshot_id)
        if boundary != self.length:
            raise MisuseError(f"cannot snapshot boundary {boundary}: the request stands at "
                              f"{self.length}; split the chunk there")
        for fam in self.layout.state_families:
            if fam.rows_kept:
                rows = state_rows(self.state, fam, boundary)
                self._snapshot_views(fam)[:, snapshot_id] = rows.to(self.pools.device)

    def load_snapshot(self, snapshot_id: int, boundary: int) -> None:
        """Reset the working area and restore it from a snapshot taken at ``boundary``."""
        self._check_snapshot(boundary, snapshot_id)
        if len(self.page_table) * self.layout.page_tokens < boundary:
            raise MisuseError(f"boundary {boundary} needs {boundary // self.layout.page_tokens} "
                              f"history pages, the page table has {len(self.page_table)}")
        self.state.reset()
        for fam in self.layout.state_families:
            if fam.rows_kept:
                rows = self._snapshot_views(fam)[:, snapshot_id].to("cpu", DTYPE)
                restore_rows(self.state, fam, rows, first_pos=boundary - fam.rows_kept)
        self.state.length = boundary

    @classmethod
    def resume(cls, cfg: TinyV4Config, pools: TierPools, page_table: Sequence[int],
               snapshot_id: int, boundary: int) -> "PagedSequenceCache":
        """A cache standing at ``boundary``: borrowed pages for ``[0, boundary)`` plus the
        state snapshot taken there. Continue with ``reserve`` and the model's forward."""
        p = layout_for(cfg).page_tokens
        if len(page_table) != boundary // p:
            raise MisuseError(f"resume at {boundary} takes {boundary // p} pages, got {len(page_table)}")
        cache = cls(cfg, pools, page_table)
        cache.load_snapshot(snapshot_id, boundary)
        return cache


__all__ = ["SequenceCache", "DenseSequenceCache", "PagedSequenceCache"]
