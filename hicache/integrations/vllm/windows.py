"""Where a sliding-window group's KV lives at a resume point, in vLLM's block tables (no
vLLM import).

vLLM's hybrid KV cache manager gives a sliding-window group (window ``W``, block size
``B``, which may be smaller than the full-attention groups': DeepSeek-V4's are 4 to 64
tokens against 256) a block table of ``ceil(tokens / B)`` entries but frees the blocks no
token will attend to again:
once ``r`` tokens are computed, the next token attends to ``[r - W + 1, r]``, so the
``(r - W + 1) // B`` leading blocks are skipped (null blocks in the table; vLLM's
``SlidingWindowManager.get_num_skipped_tokens``). A request resumed at ``r`` (a multiple
of ``B``) is given null blocks below that and real blocks for the rest::

    W = 160, B = 128, r = 512:  skipped (512 - 159) // 128 = 2 blocks
    block index   0     1     2     3   | 4 ...
                  null  null  real  real| to compute
                              ^^^^^^^^^^ the window: what a hicache snapshot holds

The window is at most :func:`window_slots` blocks (``ceil((W - 1) / B)``: for ``r >= W - 1``
exactly that many, below it all ``r / B`` blocks, fewer), which is also how many
contiguous blocks vLLM's own prefix cache needs for a sliding-window hit. A snapshot holds
that many block-sized slots per layer, right-aligned: slot ``K - 1`` is the block just
before ``r``, and a short window (``r < W - 1``) leaves the leading slots unused. Which
slots hold data is a function of ``r``, ``W`` and ``B`` alone, so nothing else is
recorded.
"""

from __future__ import annotations

from typing import Iterable, Sequence

from hicache.errors import ConfigError


def window_slots(window: int, block_tokens: int) -> int:
    """Blocks a snapshot keeps per layer: ``ceil((W - 1) / B)`` (at least 1)."""
    if window < 1 or block_tokens < 1:
        raise ConfigError("sliding_window", window, f"must be >= 1 with block size {block_tokens}")
    return max(1, -(-(window - 1) // block_tokens))


def window_span(resume: int, window: int, block_tokens: int) -> tuple[int, int]:
    """Block indices ``[first, last)`` of the window at ``resume`` tokens (a multiple of the
    block size): the blocks vLLM keeps real for a request whose next token is ``resume``."""
    if resume % block_tokens:
        raise ConfigError("resume_tokens", resume, f"not a multiple of the block size {block_tokens}")
    last = resume // block_tokens
    first = max(0, resume - window + 1) // block_tokens
    return first, last


def window_plan(row: int, resume: int, window: int, block_tokens: int, block_ids: Sequence[int],
                from_block: int = 0) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """The copies between snapshot ``row`` and the window blocks at ``resume``: (units,
    blocks), paired, in block order. A unit is ``row * K + slot`` (``K`` =
    :func:`window_slots`), the index of one block-sized slot in the state family's pool
    flattened to ``[layers, rows * K, block bytes]``. ``from_block``: blocks below it are
    left out (on a load, the ones vLLM's own prefix cache already filled)."""
    k = window_slots(window, block_tokens)
    first, last = window_span(resume, window, block_tokens)
    first = max(first, from_block)
    if last > len(block_ids):
        raise ConfigError("block_ids", len(block_ids), f"shorter than the window's last block {last}")
    units = tuple(row * k + k - (last - i) for i in range(first, last))
    blocks = tuple(int(block_ids[i]) for i in range(first, last))
    return units, blocks


def windows_held(groups: Sequence[tuple[int, int]], pages: int, page_tokens: int,
                 block_ids: Sequence[Sequence[int]]) -> bool:
    """Every window block at ``pages`` pages is a real block: per KV cache group ``(window,
    block size)``, a sliding-window one (window > 0) in its own block size. vLLM's null
    block (id 0) marks one it freed."""
    for (window, block), ids in zip(groups, block_ids):
        if window:
            first, last = window_span(pages * page_tokens, window, block)
            if last > len(ids) or not all(int(b) for b in ids[first:last]):
                return False
    return True


def group_copies(groups: Sequence[tuple[int, int]], page_tokens: int, page_ids: Sequence[int], first: int,
                 upto: int, snapshots: Iterable[tuple[int, int]], block_ids: Sequence[Sequence[int]],
                 from_page: int = 0) -> tuple[tuple[tuple[int, ...], ...], tuple[tuple[int, ...], ...]]:
    """Per KV cache group ``(window, block size)``, the (pool units, vLLM blocks) of one
    request's copy: a full-attention group (window 0, one block per page) its pages
    ``[first, upto)`` (``page_ids``, the lease's page table) and blocks, a sliding-window
    group every ``(snapshot row, boundary pages)`` in ``snapshots`` as :func:`window_plan`
    slots and window blocks in the group's own block size (blocks below ``from_page``
    pages left out, as on a load the ones vLLM's own prefix cache filled)::

        page 256 tokens, a window group of 64-token blocks, W = 128, boundary 2 pages:
        tokens 0 ........ 256 ........ 512
        pages  [   p0    ][    p1     ]          history: p0, p1 <-> blocks 0, 1
        blocks [b0|b1|b2|b3|b4|b5|b6|b7]         window at 512: b6, b7 -> slots 0, 1
    """
    pages: list[tuple[int, ...]] = []
    blocks: list[tuple[int, ...]] = []
    snaps = tuple(snapshots)
    for (window, block), ids in zip(groups, block_ids):
        if not window:
            assert block == page_tokens, (block, page_tokens)
            pages.append(tuple(int(p) for p in page_ids[first:upto]))
            blocks.append(tuple(int(b) for b in ids[first:upto]))
            continue
        units: list[int] = []
        wblocks: list[int] = []
        for row, at in snaps:
            u, b = window_plan(row, at * page_tokens, window, block, ids, from_block=from_page * page_tokens // block)
            units.extend(u)
            wblocks.extend(b)
        pages.append(tuple(units))
        blocks.append(tuple(wblocks))
    return tuple(pages), tuple(blocks)
