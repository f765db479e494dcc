"""The worker's copies between vLLM's paged KV blocks and hicache's staging pool (torch
only, no vLLM import).

vLLM's CPU attention keeps one tensor per layer, ``[num_blocks, kv_heads, block_size,
2 * head_size]`` (or a strided view of a shared buffer, blocks first): a block is one
contiguous run of bytes, the same run hicache stores as one page of that layer (``pools.device.view(family)[layer, page]``). Each step moves
every request's pages of a layer in one gather and one scatter (``index_select`` +
``index_copy_``), so the cost is one batched copy per layer per direction, whatever the
number of requests. The byte layout inside a block is vLLM's; hicache never interprets it,
and the layout fingerprint (bytes per page) keeps engines with another geometry apart.
"""

from __future__ import annotations

from typing import Iterable, Mapping, Sequence

import torch

from hicache.errors import ConfigError


def block_rows(kv: torch.Tensor, num_blocks: int | None = None) -> torch.Tensor:
    """``kv`` as ``[num_blocks, block_bytes]`` uint8, sharing its storage. Needs the block
    dimension first and each block's bytes contiguous; blocks need not be adjacent
    (DeepSeek-V4 packs several layers' blocks into one stride, each layer a view at its
    offset). Anything else is a config error rather than a silent wrong copy."""
    if num_blocks is not None and kv.shape[0] != num_blocks:
        raise ConfigError("kv_cache.shape", tuple(kv.shape), f"expected {num_blocks} blocks in dimension 0")
    try:
        rows = kv.view(kv.shape[0], -1)      # raises where a block's bytes are not one run
        if rows.shape[1] > 1 and rows.stride(1) != 1:
            raise RuntimeError("strided block")
        rows = rows.view(torch.uint8)
        if rows.shape[0] > 1 and rows.stride(0) < rows.shape[1]:
            raise RuntimeError("overlapping blocks")
        return rows
    except RuntimeError:
        raise ConfigError("kv_cache.layout", tuple(kv.stride()),
                          "HiCacheConnector needs each block of a layer's KV cache contiguous, blocks first") from None


def _index(ids: Iterable[int]) -> torch.Tensor:
    return torch.tensor(list(ids), dtype=torch.long)


class BlockCopier:
    """Copies hicache units <-> vLLM blocks for the layers of one KV cache group. A unit is a
    page of a history family, or one block-sized slot of a state family's snapshot row
    (``slots`` per row: unit ``u`` is slot ``u % slots`` of row ``u // slots``)."""

    def __init__(self, kv_caches: Mapping[str, torch.Tensor], layer_names: Sequence[str], pool: torch.Tensor,
                 slots: int = 1, num_blocks: int | None = None):
        """``pool``: hicache's ``pools.device.view(family)``, ``[layers, ids, unit_bytes]``;
        ``num_blocks``: vLLM's block count, which every cache's first dimension must be."""
        self.layer_of = {name: i for i, name in enumerate(layer_names)}
        self.rows = [block_rows(kv_caches[name], num_blocks) for name in layer_names]
        self.slots = slots
        width = self.rows[0].shape[1]
        if (any(r.shape[1] != width for r in self.rows) or pool.shape[-1] != width * slots
                or pool.shape[0] != len(self.rows)):
            raise ConfigError("kv_cache.block_bytes", [r.shape[1] for r in self.rows],
                              f"hicache holds {pool.shape[-1]} bytes per id and layer ({slots} blocks) "
                              f"and {pool.shape[0]} layers")
        # [layers, ids * slots, block bytes] where the pool's rows allow it (a view, no copy)
        self.pool = pool if slots == 1 else pool.unflatten(-1, (slots, width))

    def _units(self, layer: int, units: Sequence[int]) -> torch.Tensor:
        if self.slots == 1:
            return self.pool[layer].index_select(0, _index(units))
        idx = _index(units)
        return self.pool[layer][idx // self.slots, idx % self.slots]

    def load(self, layer: int, pages: Sequence[int], blocks: Sequence[int]) -> None:
        """hicache units -> vLLM blocks, one layer."""
        if pages:
            self.rows[layer].index_copy_(0, _index(blocks), self._units(layer, pages))

    def save(self, layer: int, pages: Sequence[int], blocks: Sequence[int], kv: torch.Tensor | None = None) -> None:
        """vLLM blocks -> hicache units, one layer (``kv``: the layer's tensor as vLLM passes
        it to ``save_kv_layer``; the registered one when None)."""
        if not pages:
            return
        src = (self.rows[layer] if kv is None else block_rows(kv)).index_select(0, _index(blocks))
        if self.slots == 1:
            self.pool[layer].index_copy_(0, _index(pages), src)
        else:
            idx = _index(pages)
            self.pool[layer].index_put_((idx // self.slots, idx % self.slots), src)
